//! Raw syscalls of the dumper that neither nix nor the parasite crate wrap.

mod handle;
mod ipc;
pub use handle::*;
pub use ipc::*;
mod packet;
pub use packet::*;
mod socket;
pub use socket::*;
mod tcp;
pub use tcp::*;

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

/// `kcmp` type: compare two processes' address spaces (`CLONE_VM`).
pub const KCMP_VM: libc::c_int = 1;
/// `kcmp` type: compare two processes' fd tables (`CLONE_FILES`).
pub const KCMP_FILES: libc::c_int = 2;
/// `kcmp` type: compare two processes' fs info: cwd, root, umask (`CLONE_FS`).
pub const KCMP_FS: libc::c_int = 3;

/// True when `pid_a` and `pid_b` hold one kernel object of `kind`
/// ([`KCMP_VM`], [`KCMP_FILES`] or [`KCMP_FS`]), per `kcmp(2)`.
pub fn same_object_of(pid_a: i32, pid_b: i32, kind: libc::c_int) -> std::io::Result<bool> {
    // SAFETY: kcmp takes only integers and touches no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid_a, pid_b, kind, 0, 0) };
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
    /// The page was written since it was write-protected through an
    /// asynchronous userfaultfd (or never was).
    pub const WRITTEN: u64 = 1 << 1;
    /// The page is file backed (or shared anonymous / shmem).
    pub const FILE: u64 = 1 << 2;
    /// The page is present in memory.
    pub const PRESENT: u64 = 1 << 3;
    /// The page is swapped out.
    pub const SWAPPED: u64 = 1 << 4;
    /// The page is the shared zero page (read-faulted, never written).
    pub const PFNZERO: u64 = 1 << 5;
    /// The page is a guard page (`MADV_GUARD_INSTALL`, Linux 6.14+ in
    /// the scan): any touch faults, there is nothing to read.
    pub const GUARD: u64 = 1 << 8;
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
    pagemap_scan_with(pagemap, start, end, anyof, report, 0, out)
}

/// `PAGEMAP_SCAN` flag: fail with `EPERM` on a VMA not write-protected
/// through an asynchronous userfaultfd.
pub const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;

/// [`pagemap_scan`] with `PM_SCAN_*` flags.
pub fn pagemap_scan_with(
    pagemap: &std::fs::File,
    start: u64,
    end: u64,
    anyof: u64,
    report: u64,
    flags: u64,
    out: &mut Vec<PageRegion>,
) -> std::io::Result<()> {
    // No more regions than pages: a one-page VMA needs room for one.
    let room = (end.saturating_sub(start) / 4096).clamp(1, 512) as usize;
    let mut regions = vec![PageRegion::default(); room];
    let mut cur = start;
    while cur < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            flags,
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

/// `pidfd_open(pid)` + `pidfd_getfd(fd)`: ckpt's own copy of fd `fd` of
/// `pid` (the same open file description, so a socket's options and
/// repair mode are the process's).
pub fn take_fd(pid: i32, fd: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let pidfd = pidfd_open(pid)?;
    // SAFETY: integer arguments only.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if got < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd_getfd returned a new fd that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(got as i32) })
}

/// `F_GETSIG` (the same on every Linux architecture; libc lacks it).
const F_GETSIG: libc::c_int = 11;

/// Where an open file description's I/O and lease-break signals go.
pub struct FileOwner {
    /// `F_GETOWN`: a pid, minus a process group, or 0 for no one.
    pub owner: i32,
    /// `F_GETSIG`: the signal sent, 0 for SIGIO.
    pub signal: i32,
}

/// The owner and signal of fd `fd` of `pid`, asked of a `pidfd_getfd`
/// copy (both belong to the open file description).
pub fn file_owner(pid: i32, fd: i32) -> std::io::Result<FileOwner> {
    use std::os::fd::AsRawFd;
    let copy = take_fd(pid, fd)?;
    // SAFETY: fcntl commands that take no argument, on an fd we own.
    let owner = unsafe { libc::fcntl(copy.as_raw_fd(), libc::F_GETOWN) };
    // SAFETY: as above.
    let signal = unsafe { libc::fcntl(copy.as_raw_fd(), F_GETSIG) };
    if signal < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(FileOwner { owner, signal })
}

/// `getsockopt` of a plain-old-data value `T` (an int, `struct tcp_info`).
/// Returns the value and how many bytes the kernel filled (older kernels
/// fill less of a growing struct).
pub fn getsockopt_raw<T: Copy + Default>(
    fd: std::os::fd::BorrowedFd<'_>,
    level: i32,
    opt: i32,
) -> std::io::Result<(T, usize)> {
    use std::os::fd::AsRawFd;
    let mut v = T::default();
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into the live local `v`,
    // whose type is plain old data (every bit pattern valid).
    let r = unsafe { libc::getsockopt(fd.as_raw_fd(), level, opt, (&raw mut v).cast(), &mut len) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((v, len as usize))
}

/// `getsockopt` of an int option.
pub fn getsockopt_int(
    fd: std::os::fd::BorrowedFd<'_>,
    level: i32,
    opt: i32,
) -> std::io::Result<i32> {
    getsockopt_raw::<libc::c_int>(fd, level, opt).map(|(v, _)| v)
}

/// `setsockopt` of an int option.
pub fn setsockopt_int(
    fd: std::os::fd::BorrowedFd<'_>,
    level: i32,
    opt: i32,
    val: i32,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the kernel reads one int from the live local `val`.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&raw const val).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
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
/// An `ioctl` returning an int through its argument (SIOCINQ, SIOCOUTQ).
pub fn ioctl_int(fd: std::os::fd::BorrowedFd<'_>, req: libc::c_ulong) -> std::io::Result<i32> {
    use std::os::fd::AsRawFd;
    let mut v: libc::c_int = 0;
    // SAFETY: these requests write one int into the live local `v`.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req, &mut v) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(v)
    }
}

/// `recv(MSG_PEEK | MSG_DONTWAIT)` of up to `len` bytes: copies a queue
/// without consuming it.
pub fn recv_peek(fd: std::os::fd::BorrowedFd<'_>, len: usize) -> std::io::Result<Vec<u8>> {
    use std::os::fd::AsRawFd;
    let mut buf = vec![0u8; len];
    // SAFETY: the kernel writes at most `len` bytes into `buf`, which holds
    // `len` bytes.
    let r = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            len,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

/// Which end of a socket [`sock_addr`] asks for.
#[derive(Clone, Copy)]
pub enum SockEnd {
    /// `getsockname`.
    Local,
    /// `getpeername`.
    Peer,
}

/// `getsockname` / `getpeername` of an inet socket; `None` when not
/// connected (ENOTCONN) or for a non-inet address.
pub fn sock_addr(
    fd: std::os::fd::BorrowedFd<'_>,
    end: SockEnd,
) -> std::io::Result<Option<std::net::SocketAddr>> {
    use std::os::fd::AsRawFd;
    // SAFETY: sockaddr_storage is plain old data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let p = (&raw mut ss).cast::<libc::sockaddr>();
    // SAFETY: the kernel writes at most `len` bytes into the live local `ss`.
    let r = unsafe {
        match end {
            SockEnd::Local => libc::getsockname(fd.as_raw_fd(), p, &mut len),
            SockEnd::Peer => libc::getpeername(fd.as_raw_fd(), p, &mut len),
        }
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENOTCONN) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    Ok(match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a = unsafe { *(&raw const ss).cast::<libc::sockaddr_in>() };
            Some(std::net::SocketAddr::V4(std::net::SocketAddrV4::new(
                std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a = unsafe { *(&raw const ss).cast::<libc::sockaddr_in6>() };
            Some(std::net::SocketAddr::V6(std::net::SocketAddrV6::new(
                std::net::Ipv6Addr::from(a.sin6_addr.s6_addr),
                u16::from_be(a.sin6_port),
                0,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    })
}

/// Forks the guard of sockets in TCP repair mode: a process that holds
/// its own copies of `socks` (fd, SO_REUSEADDR to put back) and waits on
/// the read end of a pipe whose write end is returned. A byte means the
/// dumper has dealt with them itself (the guard exits, closing its copies
/// as they are); end of file means the dumper died: the guard switches
/// repair off and puts SO_REUSEADDR back, so the tree's connections go on,
/// and then execs `unlock` (program and argv: the command deleting the
/// network lock), which would otherwise keep dropping their segments.
/// Returns the guard's pid and the write end.
pub fn fork_repair_guard(
    socks: &[(std::os::fd::RawFd, bool)],
    running: &[i32],
    unlock: Option<GuardUnlock>,
) -> std::io::Result<(i32, std::os::fd::OwnedFd)> {
    use std::ffi::CString;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let cstr = |b: &[u8]| CString::new(b).map_err(std::io::Error::other);
    // Built before the fork: the child may not allocate.
    let unlock = match unlock {
        Some(u) => {
            let prog = cstr(u.program.as_os_str().as_bytes())?;
            let argv = u
                .argv
                .iter()
                .map(|a| cstr(a.as_bytes()))
                .collect::<std::io::Result<Vec<_>>>()?;
            Some((prog, argv, u.netns))
        }
        None => None,
    };
    let unlock_ptrs: Option<Vec<*const libc::c_char>> = unlock.as_ref().map(|(_, argv, _)| {
        argv.iter()
            .map(|a| a.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect()
    });
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two fds into the live local array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 returned two new fds that nothing else owns.
    let (rx, tx) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the child runs only async-signal-safe system calls (close,
    // read, setsockopt, kill, setns, execv, _exit) on data prepared before the fork, and never
    // returns, so no lock or allocator state of other threads matters.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: see above; every pointer is to live data of this process.
        unsafe {
            libc::close(tx.as_raw_fd());
            let mut b = 0u8;
            let n = loop {
                let n = libc::read(rx.as_raw_fd(), (&raw mut b).cast(), 1);
                if n >= 0 || *libc::__errno_location() != libc::EINTR {
                    break n;
                }
            };
            if n <= 0 {
                for &(fd, reuse) in socks {
                    let off: libc::c_int = TCP_REPAIR_OFF_NO_WP;
                    let reuse = libc::c_int::from(reuse);
                    let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                    libc::setsockopt(
                        fd,
                        libc::IPPROTO_TCP,
                        libc::TCP_REPAIR,
                        (&raw const off).cast(),
                        len,
                    );
                    libc::setsockopt(
                        fd,
                        libc::SOL_SOCKET,
                        libc::SO_REUSEADDR,
                        (&raw const reuse).cast(),
                        len,
                    );
                }
                // Only now may the held processes run (TcpRepair::hold).
                for &pid in running {
                    libc::kill(pid, libc::SIGCONT);
                }
                if let (Some((prog, _, netns)), Some(argv)) = (&unlock, &unlock_ptrs)
                    && libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) == 0
                {
                    libc::execv(prog.as_ptr(), argv.as_ptr());
                }
            }
            libc::_exit(0);
        }
    }
    drop(rx);
    Ok((pid, tx))
}

/// What the guard of [`fork_repair_guard`] runs to delete the network
/// lock: `program` with `argv`, in the network namespace `netns`.
pub struct GuardUnlock {
    /// The `nft` to exec.
    pub program: std::path::PathBuf,
    /// Its arguments, `argv[0]` included.
    pub argv: Vec<String>,
    /// The lock's network namespace, opened beforehand.
    pub netns: std::fs::File,
}

/// `TCP_REPAIR_OFF_NO_WP`: repair off without a window probe.
pub const TCP_REPAIR_OFF_NO_WP: libc::c_int = -1;

/// Tells the guard of [`fork_repair_guard`] the dumper dealt with its
/// sockets, and reaps it.
pub fn dismiss_repair_guard(pid: i32, tx: std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    let b = 1u8;
    // SAFETY: writes one byte from a live local.
    unsafe { libc::write(tx.as_raw_fd(), (&raw const b).cast(), 1) };
    drop(tx);
    let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
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
    ioctl_int(fd, libc::FIONREAD)
}

/// Packet mode of a pty master (`TIOCGPKT`).
pub fn pty_packet_mode(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<bool> {
    ioctl_int(fd, libc::TIOCGPKT).map(|v| v != 0)
}

/// Whether a pty master's slave is locked (`TIOCGPTLCK`).
pub fn pty_locked(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<bool> {
    ioctl_int(fd, libc::TIOCGPTLCK).map(|v| v != 0)
}

/// Bytes waiting to be read in fd `fd` of `pid` (`FIONREAD` on a copy taken
/// with `pidfd_getfd`, which reads nothing).
pub fn queued_bytes(pid: i32, fd: i32) -> std::io::Result<u32> {
    let copy = take_fd(pid, fd)?;
    readable_bytes(std::os::fd::AsFd::as_fd(&copy)).map(|n| n as u32)
}

/// The events of `events` ready on `fd` now (`poll` without waiting);
/// raw `revents`, since nix drops bits it has no name for (`POLLRDHUP`).
pub fn poll_now(
    fd: std::os::fd::BorrowedFd<'_>,
    events: libc::c_short,
) -> std::io::Result<libc::c_short> {
    let mut pfd = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&fd),
        events,
        revents: 0,
    };
    // SAFETY: one pollfd, a live local, and its true count.
    if unsafe { libc::poll(&mut pfd, 1, 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(pfd.revents)
}

/// What one `MSG_PEEK` of a UNIX socket saw.
pub struct Peeked {
    /// The message's (datagram) or the copied (stream) length.
    pub len: usize,
    /// The kernel had ancillary data that did not fit the control buffer.
    pub ctrunc: bool,
    /// The files passed with it (SCM_RIGHTS), now installed in ckpt.
    pub fds: Vec<std::os::fd::OwnedFd>,
    /// The sender's credentials (SCM_CREDENTIALS).
    pub creds: Option<libc::ucred>,
    /// The type of the first other control message (SCM_SECURITY,
    /// SCM_PIDFD), which ckpt does not keep.
    pub other: Option<i32>,
}

/// SCM_PIDFD (Linux 6.5+; not in every libc): a pidfd of the sender.
const SCM_PIDFD: i32 = 0x4c;

/// Room for the most fds one message carries (SCM_MAX_FD, 253), the
/// sender's credentials and one more control message, in 8-byte words.
const PEEK_CONTROL_WORDS: usize = 160;

/// Peeks at the next message of `fd` (`MSG_PEEK | MSG_DONTWAIT`, plus
/// `MSG_TRUNC` for `whole`) into `buf`, with its ancillary data. File
/// descriptors in flight are installed into ckpt (close-on-exec) as the
/// receiver would get them; closing them is what closing a dup does,
/// since the queue keeps its own references.
pub fn peek_message(
    fd: std::os::fd::BorrowedFd<'_>,
    buf: &mut [u8],
    whole: bool,
) -> std::io::Result<Peeked> {
    use std::os::fd::FromRawFd;
    let mut control = [0u64; PEEK_CONTROL_WORDS];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; all zeroes is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let mut flags = libc::MSG_PEEK | libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC;
    if whole {
        flags |= libc::MSG_TRUNC;
    }
    // SAFETY: every pointer in `msg` is to a live local or to `buf`, with
    // their true lengths; the kernel writes within them.
    let n = unsafe { libc::recvmsg(std::os::fd::AsRawFd::as_raw_fd(&fd), &mut msg, flags) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut out = Peeked {
        len: n as usize,
        ctrunc: msg.msg_flags & libc::MSG_CTRUNC != 0,
        fds: Vec::new(),
        creds: None,
        other: None,
    };
    // SAFETY: `msg` is the header recvmsg filled; the CMSG_* macros walk
    // its control buffer within msg_controllen, and each payload is read
    // unaligned within its cmsg_len.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let data = libc::CMSG_DATA(c);
            let payload = (*c).cmsg_len as usize - (data as usize - c as usize);
            match ((*c).cmsg_level, (*c).cmsg_type) {
                (libc::SOL_SOCKET, libc::SCM_RIGHTS) => {
                    let count = payload / std::mem::size_of::<libc::c_int>();
                    for i in 0..count {
                        let raw = std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i));
                        out.fds.push(std::os::fd::OwnedFd::from_raw_fd(raw));
                    }
                }
                (libc::SOL_SOCKET, libc::SCM_CREDENTIALS)
                    if payload >= std::mem::size_of::<libc::ucred>() =>
                {
                    out.creds = Some(std::ptr::read_unaligned(data.cast::<libc::ucred>()));
                }
                (level, other) => {
                    if (level, other) == (libc::SOL_SOCKET, SCM_PIDFD)
                        && payload >= std::mem::size_of::<libc::c_int>()
                    {
                        // Installed like SCM_RIGHTS: closed with this.
                        let raw = std::ptr::read_unaligned(data.cast::<libc::c_int>());
                        drop(std::os::fd::OwnedFd::from_raw_fd(raw));
                    }
                    out.other.get_or_insert(other);
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok(out)
}

/// `pidfd_open(pid)`: a handle that stays with this process, whatever
/// later takes its pid.
pub fn pidfd_open(pid: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: integer arguments only.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd_open returned a new fd that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether the process of `pidfd` still holds its pid (running, stopped
/// or a zombie not yet reaped): `pidfd_send_signal` with signal 0.
pub fn pidfd_holds_pid(pidfd: std::os::fd::BorrowedFd<'_>) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: signal 0 is only a check; no siginfo is passed (null).
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    r == 0
}

/// `struct sched_attr` up to the utilization clamps (SCHED_ATTR_SIZE_VER1).
#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct SchedAttr {
    /// Size of the structure.
    pub size: u32,
    /// SCHED_* policy.
    pub policy: u32,
    /// SCHED_FLAG_* bits.
    pub flags: u64,
    /// Nice value (normal policies).
    pub nice: i32,
    /// Real-time priority.
    pub priority: u32,
    /// SCHED_DEADLINE runtime.
    pub runtime: u64,
    /// SCHED_DEADLINE deadline.
    pub deadline: u64,
    /// SCHED_DEADLINE period.
    pub period: u64,
    /// Utilization clamp minimum.
    pub util_min: u32,
    /// Utilization clamp maximum.
    pub util_max: u32,
}

/// `sched_getattr(tid)`: thread `tid`'s policy, flags, nice and priority.
pub fn sched_getattr(tid: i32) -> std::io::Result<SchedAttr> {
    let mut a = SchedAttr::default();
    let size = std::mem::size_of::<SchedAttr>() as u32;
    // SAFETY: the kernel writes at most `size` bytes into `a`, which is
    // that large and lives across the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getattr,
            tid,
            &mut a as *mut SchedAttr,
            size,
            0,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(a)
}

/// Bytes of the largest CPU mask asked for (8192 CPUs).
const MAX_AFFINITY_BYTES: usize = 1024;

/// `sched_getaffinity(tid)`: the thread's CPU mask, 64 CPUs a word, as
/// long as the kernel's mask (`nr_cpu_ids` rounded up to a word).
pub fn sched_getaffinity(tid: i32) -> std::io::Result<Vec<u64>> {
    let mut words = vec![0u64; MAX_AFFINITY_BYTES / 8];
    // SAFETY: the kernel writes at most MAX_AFFINITY_BYTES into `words`,
    // which is that large.
    let r = unsafe {
        libc::syscall(
            libc::SYS_sched_getaffinity,
            tid,
            MAX_AFFINITY_BYTES,
            words.as_mut_ptr(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    words.truncate((r as usize).div_ceil(8));
    Ok(words)
}

/// `ioprio_get` "who" for one thread.
const IOPRIO_WHO_PROCESS: libc::c_int = 1;

/// `ioprio_get(IOPRIO_WHO_PROCESS, tid)`: the thread's I/O priority.
pub fn ioprio_get(tid: i32) -> std::io::Result<u32> {
    // SAFETY: ioprio_get takes only integers.
    let r = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, tid) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r as u32)
}

/// Moves the calling thread into the namespace open at `ns` (one of
/// `/proc/PID/ns/*`) of kind `nstype` (`CLONE_NEWUTS`, `CLONE_NEWIPC`).
/// UTS and IPC namespaces are per thread: the rest of the process stays.
pub fn setns(ns: std::os::fd::BorrowedFd<'_>, nstype: libc::c_int) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: setns takes an fd we hold and an integer; it changes only
    // the calling thread's namespaces.
    if unsafe { libc::setns(ns.as_raw_fd(), nstype) } < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The calling thread's UTS names: (nodename, domainname).
pub fn uts_names() -> std::io::Result<(String, String)> {
    // SAFETY: an all-zero utsname is a valid value of the plain C struct.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uname fills the struct it is given.
    if unsafe { libc::uname(&mut u) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let text = |field: &[libc::c_char]| -> String {
        let bytes: Vec<u8> = field
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    Ok((text(&u.nodename), text(&u.domainname)))
}

/// `clock_gettime(clock)` in nanoseconds, as the calling thread's time
/// namespace shows it.
pub fn clock_ns(clock: libc::clockid_t) -> std::io::Result<i64> {
    // SAFETY: an all-zero timespec is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime fills the timespec it is given.
    if unsafe { libc::clock_gettime(clock, &mut ts) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ts.tv_sec * NANOS_PER_SEC + ts.tv_nsec)
}

/// Nanoseconds in a second.
pub const NANOS_PER_SEC: i64 = 1_000_000_000;

/// Sets a terminal's line settings (`TCSETS`, at once: nothing is
/// drained or flushed).
pub fn set_termios(
    fd: std::os::fd::BorrowedFd<'_>,
    termios: &libc::termios,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: TCSETS reads one struct termios from the pointer, a live
    // reference.
    if unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TCSETS,
            termios as *const libc::termios,
        )
    } < 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Opens the slave of pty master `fd` (`TIOCGPTPEER`), without making it a
/// controlling terminal and without a path lookup.
pub fn open_pty_peer(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NONBLOCK;
    // SAFETY: TIOCGPTPEER takes its flags by value and returns a new fd.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGPTPEER, flags) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the ioctl returned a new fd that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(r) })
}
