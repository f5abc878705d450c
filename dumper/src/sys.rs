//! Raw syscalls of the dumper that neither nix nor the parasite crate wrap.

/// `kcmp` type: compare two file descriptors' open file descriptions.
const KCMP_FILE: libc::c_int = 0;

/// True when fd `a` of `pid_a` and fd `b` of `pid_b` share one open file
/// description, per `kcmp(2)`.
pub fn same_file_description_of(pid_a: i32, a: i32, pid_b: i32, b: i32) -> std::io::Result<bool> {
    // SAFETY: kcmp takes only integers and touches no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid_a, pid_b, KCMP_FILE, a, b) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r == 0)
    }
}

/// `kcmp` type: compare an fd with a file registered in an epoll.
const KCMP_EPOLL_TFD: libc::c_int = 7;

/// `struct kcmp_epoll_slot`: which registration of epoll `efd` to compare.
#[repr(C)]
struct KcmpEpollSlot {
    efd: u32,
    tfd: u32,
    toff: u32,
}

/// Whether fd `fd` of `pid` is the file registered in epoll `efd` of
/// `epoll_pid` as its `toff`-th registration under fd number `tfd`
/// (`kcmp(KCMP_EPOLL_TFD)`). `Err` with `EOPNOTSUPP` or `EINVAL` where the
/// kernel cannot tell.
pub fn same_epoll_target(
    pid: i32,
    fd: i32,
    epoll_pid: i32,
    efd: i32,
    tfd: i32,
    toff: u32,
) -> std::io::Result<bool> {
    let slot = KcmpEpollSlot {
        efd: efd as u32,
        tfd: tfd as u32,
        toff,
    };
    // SAFETY: the only pointer is to a live local struct of the layout
    // kcmp(2) documents, which the kernel only reads.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pid,
            epoll_pid,
            KCMP_EPOLL_TFD,
            fd,
            &slot as *const KcmpEpollSlot,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r == 0)
    }
}

/// `lseek(fd, off, whence)`; `None` where SEEK_DATA finds no more data
/// (ENXIO).
pub fn seek(fd: i32, off: u64, whence: i32) -> std::io::Result<Option<u64>> {
    // SAFETY: lseek takes only integers.
    let r = unsafe { libc::lseek(fd, off as libc::off_t, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENXIO) {
        Ok(None)
    } else {
        Err(e)
    }
}

/// The seals of memfd `fd` (F_GET_SEALS).
pub fn memfd_seals(fd: i32) -> std::io::Result<u32> {
    // SAFETY: F_GET_SEALS takes no argument and only reads the file.
    let r = unsafe { libc::fcntl(fd, libc::F_GET_SEALS) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r as u32)
    }
}

fn ret(r: libc::c_long) -> Result<libc::c_long, i32> {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}

fn close(fd: libc::c_long) {
    let _ = nix::unistd::close(fd as i32);
}

/// `prctl(PR_SET_MM, PR_SET_MM_MAP_SIZE)`: the size of `struct prctl_mm_map`,
/// or an errno if the kernel lacks PR_SET_MM_MAP.
pub fn prctl_mm_map_size() -> Result<u32, i32> {
    let mut size: u32 = 0;
    // SAFETY: the only pointer is to a live local u32 the kernel writes.
    ret(unsafe { libc::syscall(libc::SYS_prctl, 35, 15, &mut size as *mut u32, 0, 0) })?;
    Ok(size)
}

/// `kcmp(self, self, KCMP_VM)`: works wherever kcmp exists.
pub fn kcmp_probe() -> Result<(), i32> {
    let me = std::process::id() as libc::c_long;
    // SAFETY: integer arguments only.
    ret(unsafe { libc::syscall(libc::SYS_kcmp, me, me, 1, 0, 0) }).map(|_| ())
}

/// `pidfd_open(self)` + `pidfd_getfd(2)`: the fd-stealing path.
pub fn pidfd_getfd_probe() -> Result<(), i32> {
    // SAFETY: integer arguments only.
    let pidfd = ret(unsafe { libc::syscall(libc::SYS_pidfd_open, std::process::id(), 0) })?;
    // SAFETY: integer arguments only; stderr is open in any ckpt run.
    let r = ret(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, 2, 0) });
    close(pidfd);
    r.map(close)
}

/// `userfaultfd(UFFD_USER_MODE_ONLY)`.
pub fn userfaultfd_probe() -> Result<(), i32> {
    // SAFETY: integer arguments only.
    ret(unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | 1) }).map(close)
}

/// `PAGEMAP_SCAN` = `_IOWR('f', 16, struct pm_scan_arg)` with a 96-byte argument.
const PAGEMAP_SCAN: libc::c_ulong = 0xc060_6610;

/// Page categories of `PAGEMAP_SCAN` (uapi linux/fs.h).
pub mod page_is {
    /// The page is file backed (or shared anonymous / shmem).
    pub const FILE: u64 = 1 << 2;
    /// The page is present in memory.
    pub const PRESENT: u64 = 1 << 3;
    /// The page is swapped out.
    pub const SWAPPED: u64 = 1 << 4;
    /// The page is the shared zero page (read-faulted, never written).
    pub const PFNZERO: u64 = 1 << 5;
}

/// The kernel's `struct pm_scan_arg`.
#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

const _: () = assert!(std::mem::size_of::<PmScanArg>() == 96);

/// One run of pages with the same categories (`struct page_region`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageRegion {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// `page_is` bits (restricted to the return mask).
    pub categories: u64,
}

/// Scans `[start, end)` of the process behind `pagemap` with the
/// `PAGEMAP_SCAN` ioctl (6.7+), appending every run of pages that has any
/// of `anyof` to `out`, reported with the categories in `report`.
pub fn pagemap_scan(
    pagemap: &std::fs::File,
    start: u64,
    end: u64,
    anyof: u64,
    report: u64,
    out: &mut Vec<PageRegion>,
) -> std::io::Result<()> {
    let mut regions = vec![PageRegion::default(); 512];
    let mut cur = start;
    while cur < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            flags: 0,
            start: cur,
            end,
            walk_end: 0,
            vec: regions.as_mut_ptr() as u64,
            vec_len: regions.len() as u64,
            max_pages: 0,
            category_inverted: 0,
            category_mask: 0,
            category_anyof_mask: anyof,
            return_mask: report,
        };
        // SAFETY: `arg` is a valid pm_scan_arg whose `vec` points to
        // `regions`, which has room for `vec_len` page_regions and outlives
        // the call; the kernel writes at most that many and updates walk_end.
        let n = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(pagemap),
                PAGEMAP_SCAN,
                &mut arg as *mut PmScanArg,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        out.extend_from_slice(&regions[..n as usize]);
        if arg.walk_end <= cur {
            break;
        }
        cur = arg.walk_end;
    }
    Ok(())
}

/// True when this kernel has the `PAGEMAP_SCAN` ioctl.
pub fn pagemap_scan_probe(pagemap: &std::fs::File) -> Result<(), i32> {
    let probe = [0u8; 1];
    let addr = probe.as_ptr() as u64 & !4095;
    pagemap_scan(
        pagemap,
        addr,
        addr + 4096,
        page_is::PRESENT,
        page_is::PRESENT,
        &mut Vec::new(),
    )
    .map_err(|e| e.raw_os_error().unwrap_or(0))
}

/// Forks a child that only sleeps in `pause()` until killed.
pub fn fork_sleeper() -> nix::Result<nix::unistd::Pid> {
    use nix::unistd::{ForkResult, fork};
    // SAFETY: the child only calls async-signal-safe pause() in a loop.
    match unsafe { fork() }? {
        ForkResult::Child => loop {
            // SAFETY: pause is async-signal-safe and touches no memory.
            unsafe {
                libc::pause();
            }
        },
        ForkResult::Parent { child } => Ok(child),
    }
}

/// A copy of fd `fd` of process `pid` (`pidfd_open` + `pidfd_getfd`): the
/// same open file description, so ckpt can query it without reopening it
/// by path (which for `/dev/ptmx` would make a new terminal).
pub fn steal_fd(pid: i32, fd: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes only integers.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd_open returned a new fd that nothing else owns.
    let pidfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(pidfd as i32) };
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_getfd takes only integers.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if got < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd_getfd returned a new fd (close-on-exec) that nothing
    // else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(got as i32) })
}

/// A terminal's line settings and window size, read through `fd` (on a pty
/// master they are the slave's: the kernel applies termios ioctls of a
/// master to its peer).
pub struct TermState {
    /// `TCGETS`.
    pub termios: libc::termios,
    /// `TIOCGWINSZ`.
    pub winsize: libc::winsize,
}

/// An int-valued ioctl that writes its answer to `*arg`.
fn ioctl_get_int(fd: std::os::fd::BorrowedFd<'_>, req: libc::Ioctl) -> std::io::Result<i32> {
    use std::os::fd::AsRawFd;
    let mut v: libc::c_int = 0;
    // SAFETY: the request writes one int to the pointer, a live local.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req, &mut v as *mut libc::c_int) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(v)
    }
}

/// `TCGETS` and `TIOCGWINSZ` of a terminal fd.
pub fn term_state(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<TermState> {
    use std::os::fd::AsRawFd;
    // SAFETY: all-zero is a valid value of these plain C structs.
    let mut st: TermState = unsafe { std::mem::zeroed() };
    // SAFETY: TCGETS writes one struct termios to the pointer, a live
    // local of that type.
    if unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TCGETS,
            &mut st.termios as *mut libc::termios,
        )
    } < 0
    {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: TIOCGWINSZ writes one struct winsize to the pointer, a live
    // local of that type.
    if unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TIOCGWINSZ,
            &mut st.winsize as *mut libc::winsize,
        )
    } < 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

/// Bytes waiting to be read from a terminal or pipe fd (`FIONREAD`).
pub fn readable_bytes(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<i32> {
    ioctl_get_int(fd, libc::FIONREAD)
}

/// Packet mode of a pty master (`TIOCGPKT`).
pub fn pty_packet_mode(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<bool> {
    ioctl_get_int(fd, libc::TIOCGPKT).map(|v| v != 0)
}

/// Whether a pty master's slave is locked (`TIOCGPTLCK`).
pub fn pty_locked(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<bool> {
    ioctl_get_int(fd, libc::TIOCGPTLCK).map(|v| v != 0)
}
