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

/// `pidfd_open` + `pidfd_getfd`: a copy of fd `fd` of process `pid` in
/// ckpt, the same open file description (reading through it acts on the
/// target's object, so only non-consuming reads may be done).
pub fn take_fd(pid: i32, fd: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes only integers.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd is a new fd owned here from now on.
    let pidfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: pidfd_getfd takes only integers and returns a new fd.
    let got = unsafe {
        libc::syscall(
            libc::SYS_pidfd_getfd,
            std::os::fd::AsRawFd::as_raw_fd(&pidfd),
            fd,
            0,
        )
    };
    if got < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd_getfd returned a new fd (O_CLOEXEC) nobody else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(got as i32) })
}

/// `getsockopt(fd, level, opt)` for an option of type `T` (an int or a
/// struct timeval).
pub fn getsockopt<T: Copy + Default>(
    fd: std::os::fd::BorrowedFd<'_>,
    level: i32,
    opt: i32,
) -> std::io::Result<T> {
    let mut v = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `v`, a live local
    // of exactly that size.
    let r = unsafe {
        libc::getsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            level,
            opt,
            (&mut v as *mut T).cast(),
            &mut len,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(v)
    }
}

/// `setsockopt(fd, SOL_SOCKET, opt)` with an int.
pub fn setsockopt_int(fd: std::os::fd::BorrowedFd<'_>, opt: i32, v: i32) -> std::io::Result<()> {
    // SAFETY: the kernel reads one int from a live local.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SOL_SOCKET,
            opt,
            (&v as *const i32).cast(),
            std::mem::size_of::<i32>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The `sun_path` bytes of a UNIX socket's own address (`getsockname`):
/// empty when unbound, a leading NUL for an abstract name.
pub fn unix_sockname(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Vec<u8>> {
    // SAFETY: sockaddr_un is plain old data; all zeroes is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `addr`.
    let r = unsafe {
        libc::getsockname(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            (&mut addr as *mut libc::sockaddr_un).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(sun_path(&addr, len))
}

/// The protocol name sockfs gives a socket (`system.sockprotoname`:
/// `UNIX`, `UNIX-STREAM`, `NETLINK`, `TCP`, ...), through its `/proc` link.
pub fn socket_protocol(link: &std::path::Path) -> std::io::Result<String> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(link.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut buf = [0u8; 64];
    // SAFETY: both names are NUL-terminated and the kernel writes at most
    // buf.len() bytes into buf.
    let n = unsafe {
        libc::getxattr(
            path.as_ptr(),
            c"system.sockprotoname".as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let name = &buf[..n as usize];
    let name = name.split(|&c| c == 0).next().unwrap_or_default();
    Ok(String::from_utf8_lossy(name).into_owned())
}

/// The `sun_path` bytes of the address a UNIX socket is connected to
/// (`getpeername`), or `None` if it is not connected.
pub fn unix_peername(fd: std::os::fd::BorrowedFd<'_>) -> Option<Vec<u8>> {
    // SAFETY: sockaddr_un is plain old data; all zeroes is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `addr`.
    let r = unsafe {
        libc::getpeername(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            (&mut addr as *mut libc::sockaddr_un).cast(),
            &mut len,
        )
    };
    (r == 0).then(|| sun_path(&addr, len))
}

/// The significant bytes of `addr`'s `sun_path` given the length the
/// kernel reported: a path without its NUL, an abstract name whole.
fn sun_path(addr: &libc::sockaddr_un, len: libc::socklen_t) -> Vec<u8> {
    let family = std::mem::size_of::<libc::sa_family_t>();
    let n = (len as usize)
        .saturating_sub(family)
        .min(addr.sun_path.len());
    let mut path: Vec<u8> = addr.sun_path[..n].iter().map(|&c| c as u8).collect();
    // A path name may be reported with its terminating NUL; an abstract
    // name's bytes are all significant.
    if path.first() != Some(&0)
        && let Some(end) = path.iter().position(|&c| c == 0)
    {
        path.truncate(end);
    }
    path
}

/// `SIOCUNIXFILE`: an `O_PATH` fd of the file a UNIX socket is bound to
/// (even if unlinked since).
const SIOCUNIXFILE: libc::c_ulong = 0x89E0;

/// The file a path-bound UNIX socket made, opened `O_PATH`.
pub fn unix_bound_file(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    // SAFETY: SIOCUNIXFILE takes no argument and returns a new fd.
    let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&fd), SIOCUNIXFILE, 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the ioctl returned a new fd nobody else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(r) })
}

/// `SIOCINQ` of a socket: for a UNIX stream or seqpacket socket, the bytes
/// of every message queued for it (out-of-band byte included).
pub fn socket_inq(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<u64> {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCINQ writes one int into a live local.
    let r = unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&fd), libc::FIONREAD, &mut n) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(n.max(0) as u64)
    }
}
