//! Raw syscalls of the restorer: clone3 with `set_tid`, prlimit, mapping the pages file.

mod ipc;
mod sockopt;
pub use ipc::*;
pub use sockopt::*;

/// The kernel's `struct clone_args` (clone3(2)), up to `set_tid_size`.
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
}

/// `clone3(args)` without CLONE_VM or a stack: fork semantics, the child
/// gets a copy-on-write copy of this process's memory. Returns 0 in the
/// child, the child's pid (or -1 with errno) in the parent.
///
/// # Safety
/// The child is a copy of a possibly multi-threaded process with only the
/// calling thread: it must run async-signal-safe code only (raw syscalls,
/// then `_exit` or exec).
unsafe fn fork_like_clone3(args: &CloneArgs) -> libc::c_long {
    // SAFETY: `args` is a valid clone_args that outlives the call and the
    // size passed is its size; the caller keeps the child to raw syscalls.
    unsafe {
        libc::syscall(
            libc::SYS_clone3,
            args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    }
}

/// A pidfd of a process that has exited and been reaped, with
/// `O_NONBLOCK` (PIDFD_NONBLOCK) if `nonblock`: a child made for it
/// (clone3 with CLONE_PIDFD, so the pidfd exists before anything could
/// reap the child) exits at once and is reaped here.
pub fn reaped_pidfd(nonblock: bool) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let mut pidfd: libc::c_int = -1;
    let args = CloneArgs {
        flags: libc::CLONE_PIDFD as u64,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..Default::default()
    };
    // SAFETY: the child makes one raw syscall, exit.
    let r = unsafe { fork_like_clone3(&args) };
    match r {
        0 => {
            // SAFETY: in the child: exit at once, nothing of ours runs.
            unsafe { libc::syscall(libc::SYS_exit, 0) };
            unreachable!("exit returned");
        }
        r if r < 0 => Err(std::io::Error::last_os_error()),
        child => {
            // SAFETY: CLONE_PIDFD put a new fd nobody else owns in `pidfd`.
            let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(pidfd) };
            let child = nix::unistd::Pid::from_raw(child as i32);
            loop {
                match nix::sys::wait::waitpid(child, None) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err(e.into()),
                    Ok(_) => break,
                }
            }
            if nonblock {
                let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFL)?;
                let flags =
                    nix::fcntl::OFlag::from_bits_retain(flags) | nix::fcntl::OFlag::O_NONBLOCK;
                nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_SETFL(flags))?;
            }
            Ok(fd)
        }
    }
}

/// Creates a child with pid `pid` (fork semantics: a copy of this process).
/// In the child it calls `PTRACE_TRACEME` and stops itself with SIGSTOP, so
/// the parent holds it before it runs any code of its own; it never returns
/// in the child. `ns_flags`: CLONE_NEW* flags of namespaces it gets new.
pub fn fork_stopped_with_pid(pid: i32, ns_flags: u64) -> std::io::Result<i32> {
    let tid: libc::pid_t = pid;
    let args = CloneArgs {
        flags: ns_flags,
        exit_signal: libc::SIGCHLD as u64,
        set_tid: &tid as *const libc::pid_t as u64,
        set_tid_size: 1,
        ..Default::default()
    };
    // SAFETY: the child runs only the async-signal-safe raw syscalls below.
    let r = unsafe { fork_like_clone3(&args) };
    match r {
        0 => {
            // SAFETY: in the child: raw syscalls only; _exit if the parent
            // cannot take control, so nothing of ours ever runs here.
            unsafe {
                libc::syscall(libc::SYS_ptrace, libc::PTRACE_TRACEME, 0, 0, 0);
                libc::syscall(
                    libc::SYS_kill,
                    libc::syscall(libc::SYS_getpid),
                    libc::SIGSTOP,
                );
                libc::_exit(127);
            }
        }
        r if r < 0 => Err(std::io::Error::last_os_error()),
        r => Ok(r as i32),
    }
}

/// Sets resource limit `res` of process `pid` (prlimit64).
pub fn set_rlimit(pid: i32, res: u32, soft: u64, hard: u64) -> std::io::Result<()> {
    let new = libc::rlimit64 {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: prlimit64 reads `new` and writes nothing (old is null).
    let rc = unsafe {
        libc::prlimit64(
            pid,
            res as libc::__rlimit_resource_t,
            &new,
            std::ptr::null_mut(),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Reads resource limit `res` of process `pid`: (soft, hard).
pub fn get_rlimit(pid: i32, res: u32) -> std::io::Result<(u64, u64)> {
    let mut cur = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit64 writes one rlimit64 into `cur` and reads nothing.
    let rc = unsafe {
        libc::prlimit64(
            pid,
            res as libc::__rlimit_resource_t,
            std::ptr::null(),
            &mut cur,
        )
    };
    if rc == 0 {
        Ok((cur.rlim_cur, cur.rlim_max))
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Maps a verified page file read-only.
pub fn map_readonly(file: &std::fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: the pages file is a private (0600) image file that ckpt
    // verified just before and only reads; nothing else is expected to
    // modify it while the restore runs. A concurrent truncation would fault
    // the restorer, whose death kills the half-built child
    // (PTRACE_O_EXITKILL), so no half-restored process can result.
    let map = unsafe { memmap2::Mmap::map(file) }?;
    // Ask for the whole file now: the disk then streams it at full speed
    // while the copy runs, instead of serving one small read-ahead window
    // per page fault of the mapping (a cold restore's bottleneck).
    if let Err(e) = map.advise(memmap2::Advice::WillNeed) {
        log::debug!("read-ahead of a pages file not started: {e}");
    }
    Ok(map)
}

/// A new shared anonymous object of `size` bytes (what `MAP_SHARED |
/// MAP_ANONYMOUS` creates), held as an fd: mapped here once, opened
/// through `/proc/self/map_files`, unmapped.
pub fn shared_anon(size: u64) -> std::io::Result<std::fs::File> {
    let len = usize::try_from(size).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a fresh mapping at an address the kernel chooses; nothing of
    // ours is there, and it is unmapped below without being touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    let start = p as u64;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!(
            "/proc/self/map_files/{:x}-{:x}",
            start,
            start + size.next_multiple_of(ckpt_image::PAGE_SIZE)
        ));
    // SAFETY: unmapping exactly the mapping made above, which no reference
    // points into.
    unsafe { libc::munmap(p, len) };
    opened
}

/// A new memfd named `name` (close-on-exec, sealable: the dumped seals,
/// F_SEAL_SEAL included for a memfd made without MFD_ALLOW_SEALING, are
/// added at the end).
pub fn memfd(name: &str) -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    let c = std::ffi::CString::new(name)
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call.
    let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just created and is owned by nothing else.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Adds `seals` to memfd `fd` (F_ADD_SEALS).
pub fn add_seals(fd: i32, seals: u32) -> std::io::Result<()> {
    // SAFETY: F_ADD_SEALS takes an int and changes only the file's seals.
    let r = unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals as libc::c_int) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Largest file handle the kernel hands out (`MAX_HANDLE_SZ`).
const MAX_HANDLE_SZ: usize = 128;

/// `struct file_handle` with room for the largest handle.
#[repr(C)]
struct FileHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

/// `open_by_handle_at(mount_fd, handle, O_PATH)`: the inode a file handle
/// names, on the filesystem of `mount_fd` (needs CAP_DAC_READ_SEARCH).
pub fn open_by_handle(
    mount_fd: std::os::fd::BorrowedFd<'_>,
    handle_type: i32,
    bytes: &[u8],
) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    if bytes.len() > MAX_HANDLE_SZ {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    let mut h = FileHandle {
        handle_bytes: bytes.len() as u32,
        handle_type,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    h.f_handle[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: the handle is a live local struct of the kernel's layout with
    // handle_bytes no larger than its buffer; the kernel only reads it.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd.as_raw_fd(),
            &mut h as *mut FileHandle,
            libc::O_PATH | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us, and nothing else owns it.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// `pidfd_open(pid)` + `pidfd_getfd(fd)` run by the restorer: its own copy
/// of fd `fd` of process `pid` (the same open file description).
pub fn take_fd(pid: i32, fd: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: integer arguments only.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: integer arguments only.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, fd, 0) };
    let err = std::io::Error::last_os_error();
    // SAFETY: pidfd is ours and closed once.
    unsafe { libc::close(pidfd as i32) };
    if got < 0 {
        return Err(err);
    }
    // SAFETY: pidfd_getfd returned a new fd that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(got as i32) })
}

/// SIGKILLs the process behind `pidfd` (`pidfd_send_signal`).
pub fn pidfd_kill(pidfd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid fd, a null siginfo (the kernel fills in a kill's),
    // no flags.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn check(r: libc::c_int) -> std::io::Result<()> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `setsockopt` of a plain-old-data value (an int, an array of
/// `struct tcp_repair_opt`, `struct tcp_repair_window`).
pub fn setsockopt_raw<T: Copy>(
    fd: std::os::fd::BorrowedFd<'_>,
    level: i32,
    opt: i32,
    val: &[T],
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the kernel reads at most the given length from the live
    // slice `val`.
    check(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            val.as_ptr().cast(),
            std::mem::size_of_val(val) as libc::socklen_t,
        )
    })
}

/// `setsockopt` of an int option.
pub fn setsockopt_int(
    fd: std::os::fd::BorrowedFd<'_>,
    level: i32,
    opt: i32,
    val: i32,
) -> std::io::Result<()> {
    setsockopt_raw(fd, level, opt, &[val as libc::c_int])
}

/// `getsockopt` of an int option.
pub fn getsockopt_int(
    fd: std::os::fd::BorrowedFd<'_>,
    level: i32,
    opt: i32,
) -> std::io::Result<i32> {
    use std::os::fd::AsRawFd;
    let mut val: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `val`, a live local.
    check(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            opt,
            (&mut val as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(val)
}

/// A socket address in the kernel's layout.
struct RawAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

fn raw_addr(a: &std::net::SocketAddr) -> RawAddr {
    // SAFETY: sockaddr_storage is plain old data.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        std::net::SocketAddr::V4(v4) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: v4.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*v4.ip()).to_be(),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in.
            unsafe { *(&raw mut storage).cast::<libc::sockaddr_in>() = sin };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        std::net::SocketAddr::V6(v6) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: v6.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr {
                    s6_addr: v6.ip().octets(),
                },
                sin6_scope_id: v6.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for
            // sockaddr_in6.
            unsafe { *(&raw mut storage).cast::<libc::sockaddr_in6>() = sin6 };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    RawAddr {
        storage,
        len: len as libc::socklen_t,
    }
}

/// `bind(2)`.
pub fn bind(fd: std::os::fd::BorrowedFd<'_>, a: &std::net::SocketAddr) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let raw = raw_addr(a);
    // SAFETY: the kernel reads `len` bytes of the live local address.
    check(unsafe { libc::bind(fd.as_raw_fd(), (&raw const raw.storage).cast(), raw.len) })
}

/// `connect(2)` without waiting for the handshake, whatever the blocking
/// mode of the socket's description (shared with the process, and put
/// back as it was): `Ok` once the SYN is sent (EINPROGRESS) or the
/// connection is made.
pub fn connect_nonblocking(
    fd: std::os::fd::BorrowedFd<'_>,
    a: &std::net::SocketAddr,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let raw_fd = fd.as_raw_fd();
    // SAFETY: F_GETFL reads the description's flags and takes no pointer.
    let flags = unsafe { libc::fcntl(raw_fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: F_SETFL takes an int, no pointer.
    check(unsafe { libc::fcntl(raw_fd, libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
    let r = match connect(fd, a) {
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(()),
        other => other,
    };
    // SAFETY: as above.
    check(unsafe { libc::fcntl(raw_fd, libc::F_SETFL, flags) })?;
    r
}

/// `bind(2)` of a packet socket to interface `ifindex` and ethertype
/// `protocol` (host order).
pub fn bind_packet(
    fd: std::os::fd::BorrowedFd<'_>,
    protocol: u16,
    ifindex: i32,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: sockaddr_ll is plain old data.
    let mut ll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    ll.sll_family = libc::AF_PACKET as u16;
    ll.sll_protocol = protocol.to_be();
    ll.sll_ifindex = ifindex;
    let len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: the kernel reads `len` bytes of the live local address.
    check(unsafe { libc::bind(fd.as_raw_fd(), (&raw const ll).cast(), len) })
}

/// `connect(2)`.
pub fn connect(fd: std::os::fd::BorrowedFd<'_>, a: &std::net::SocketAddr) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let raw = raw_addr(a);
    // SAFETY: the kernel reads `len` bytes of the live local address.
    check(unsafe { libc::connect(fd.as_raw_fd(), (&raw const raw.storage).cast(), raw.len) })
}

/// `sendto(2)` of one datagram `buf` to `ip` (port 0: a raw socket's).
pub fn send_to(
    fd: std::os::fd::BorrowedFd<'_>,
    buf: &[u8],
    ip: std::net::IpAddr,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let raw = raw_addr(&std::net::SocketAddr::new(ip, 0));
    // SAFETY: the kernel reads `buf.len()` bytes of `buf` and `len` bytes
    // of the live local address.
    let n = unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            buf.as_ptr().cast(),
            buf.len(),
            0,
            (&raw const raw.storage).cast(),
            raw.len,
        )
    };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// `listen(2)`.
pub fn listen(fd: std::os::fd::BorrowedFd<'_>, backlog: i32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: integer arguments only.
    check(unsafe { libc::listen(fd.as_raw_fd(), backlog) })
}

/// `shutdown(SHUT_WR)`: the socket sends its FIN after what it queued.
pub fn shutdown_write(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: integer arguments only.
    check(unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_WR) })
}

/// The TCP state of a socket (`tcpi_state`, the first byte of TCP_INFO).
pub fn tcp_state(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<u8> {
    use std::os::fd::AsRawFd;
    // Room for the start of `struct tcp_info`; the kernel copies at most
    // the length given.
    let mut info = [0u8; 8];
    let mut len = info.len() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into the live local
    // array and updates `len`.
    check(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    })?;
    Ok(info[0])
}

/// Sends all of `data` without blocking (`MSG_DONTWAIT`: the socket's
/// description is the process's, whose blocking mode ckpt leaves alone).
pub fn send_all(fd: std::os::fd::BorrowedFd<'_>, mut data: &[u8]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    while !data.is_empty() {
        // SAFETY: the kernel reads at most `data.len()` bytes of `data`.
        let n = unsafe {
            libc::send(
                fd.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::WriteZero));
        }
        data = &data[n as usize..];
    }
    Ok(())
}
/// Sends one message on a UNIX socket without blocking, with the files
/// `files` attached (SCM_RIGHTS) and, given, the credentials `creds`
/// (SCM_CREDENTIALS, which needs the privilege to name another process or
/// user). Returns the bytes sent (a stream may take fewer).
pub fn send_unix_message(
    fd: std::os::fd::BorrowedFd<'_>,
    data: &[u8],
    files: &[std::os::fd::BorrowedFd<'_>],
    creds: Option<libc::ucred>,
) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    // Room for SCM_MAX_FD (253) fds and one ucred, in 8-byte words.
    const CONTROL_WORDS: usize = 136;
    let fds_len = files.len() * std::mem::size_of::<libc::c_int>();
    let rights_space = if files.is_empty() {
        0
    } else {
        // SAFETY: CMSG_SPACE only computes a size.
        unsafe { libc::CMSG_SPACE(fds_len as u32) as usize }
    };
    let creds_space = if creds.is_some() {
        // SAFETY: as above.
        unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::ucred>() as u32) as usize }
    } else {
        0
    };
    let mut control = [0u64; CONTROL_WORDS];
    if rights_space + creds_space > std::mem::size_of_val(&control) {
        return Err(std::io::Error::from_raw_os_error(libc::E2BIG));
    }
    let mut iov = libc::iovec {
        iov_base: data.as_ptr().cast_mut().cast(),
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain old data; all zeroes is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if rights_space + creds_space > 0 {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = rights_space + creds_space;
    }
    // SAFETY: the control buffer holds `rights_space + creds_space` bytes
    // (checked above); CMSG_FIRSTHDR/NXTHDR stay within msg_controllen and
    // each payload is written unaligned within its cmsg_len.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        if !files.is_empty() {
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fds_len as u32) as _;
            let at = libc::CMSG_DATA(c).cast::<libc::c_int>();
            for (i, f) in files.iter().enumerate() {
                std::ptr::write_unaligned(at.add(i), f.as_raw_fd());
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        if let Some(creds) = creds {
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_CREDENTIALS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::ucred>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<libc::ucred>(), creds);
        }
    }
    loop {
        // SAFETY: every pointer in `msg` is to a live local or to `data`,
        // with their true lengths; the kernel only reads them.
        let n = unsafe {
            libc::sendmsg(
                fd.as_raw_fd(),
                &msg,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// An ioctl whose argument is an int passed by pointer (`TIOCPKT`,
/// `TIOCSPTLCK`).
pub fn ioctl_set_int(
    fd: std::os::fd::BorrowedFd<'_>,
    req: libc::Ioctl,
    value: i32,
) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let v: libc::c_int = value;
    // SAFETY: the request reads one int from the pointer, a live local.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), req, &v as *const libc::c_int) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Sets a terminal's line settings and window size through `fd` (on a pty
/// master they are its slave's).
pub fn set_term_state(
    fd: std::os::fd::BorrowedFd<'_>,
    termios: &libc::termios,
    winsize: &libc::winsize,
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
    // SAFETY: TIOCSWINSZ reads one struct winsize from the pointer, a live
    // reference.
    if unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TIOCSWINSZ,
            winsize as *const libc::winsize,
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
    let flags = libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC;
    // SAFETY: TIOCGPTPEER takes its flags by value and returns a new fd.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGPTPEER, flags) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the ioctl returned a new fd that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(r) })
}

/// `SIOCUNIXFILE`: an `O_PATH` fd of the file a UNIX socket is bound to.
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

fn check_ret(r: libc::c_long) -> std::io::Result<libc::c_long> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// Creates a child as PID 1 of a new PID namespace, in a new mount
/// namespace (a slave of ours) whose /proc is that PID namespace's, traced and stopped
/// (SIGSTOP) by this process before it runs any code of ours. It cannot
/// stop itself as [`fork_stopped_with_pid`]'s child does: a namespace's init
/// ignores the signals it sends itself, SIGSTOP included, so once its /proc
/// is mounted it says so through a pipe and waits in a loop of raw
/// syscalls for `PTRACE_ATTACH` from here (a signal from the parent
/// namespace reaches it). `ns_flags`: further CLONE_NEW* flags.
pub fn fork_stopped_in_new_pidns(ns_flags: u64) -> std::io::Result<i32> {
    let mut ready = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two fds into the array it is given.
    check(unsafe { libc::pipe2(ready.as_mut_ptr(), libc::O_CLOEXEC) })?;
    let [ready_r, ready_w] = ready;
    let args = CloneArgs {
        flags: (libc::CLONE_NEWPID | libc::CLONE_NEWNS) as u64 | ns_flags,
        exit_signal: libc::SIGCHLD as u64,
        ..Default::default()
    };
    // SAFETY: the child runs only the raw syscalls below.
    let r = unsafe { fork_like_clone3(&args) };
    match r {
        0 => {
            // SAFETY: in the child: raw syscalls on static strings only;
            // _exit if /proc cannot be made the namespace's, and otherwise
            // yield until the parent attaches and takes over.
            unsafe {
                let private = libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_SLAVE,
                    std::ptr::null(),
                );
                let proc = libc::mount(
                    c"proc".as_ptr(),
                    c"/proc".as_ptr(),
                    c"proc".as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                    std::ptr::null(),
                );
                if private < 0 || proc < 0 {
                    libc::_exit(126);
                }
                libc::close(ready_r);
                let byte = 1u8;
                libc::write(ready_w, (&byte as *const u8).cast(), 1);
                libc::close(ready_w);
                loop {
                    libc::syscall(libc::SYS_sched_yield);
                }
            }
        }
        r if r < 0 => {
            let e = std::io::Error::last_os_error();
            // SAFETY: our own fds, closed once.
            unsafe {
                libc::close(ready_r);
                libc::close(ready_w);
            }
            Err(e)
        }
        r => {
            let pid = r as i32;
            let mut byte = 0u8;
            // SAFETY: our own fds; read writes at most one byte into `byte`.
            // EOF (the child died before mounting /proc) leaves it 0.
            let got = unsafe {
                libc::close(ready_w);
                let n = libc::read(ready_r, (&mut byte as *mut u8).cast(), 1);
                libc::close(ready_r);
                n
            };
            // SAFETY: integer arguments only.
            if got != 1 || unsafe { libc::ptrace(libc::PTRACE_ATTACH, pid, 0, 0) } < 0 {
                let e = if got != 1 {
                    std::io::Error::other("the new namespace's init could not mount its /proc")
                } else {
                    std::io::Error::last_os_error()
                };
                // SAFETY: integer arguments only; our own child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, std::ptr::null_mut(), 0);
                }
                return Err(e);
            }
            Ok(pid)
        }
    }
}

/// A pidfd of this process at an fd number of at least `min`, which the
/// processes it forks inherit (`pidfd_getfd` from inside a new PID
/// namespace, where this process has no pid).
pub fn own_pidfd_at_least(min: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: integer arguments only.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd is ours; F_DUPFD makes a new fd nothing else owns.
    let moved = unsafe { libc::fcntl(pidfd as i32, libc::F_DUPFD, min) };
    let err = std::io::Error::last_os_error();
    // SAFETY: pidfd is ours and closed once.
    unsafe { libc::close(pidfd as i32) };
    if moved < 0 {
        return Err(err);
    }
    // SAFETY: a new fd that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(moved) })
}

/// `pidfd_open(pid)`: readable once the process has exited; it keeps
/// naming that process, never a later holder of its pid.
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

/// Which side of [`daemonize`] the caller is on.
pub enum Forked {
    /// The calling process, which goes on as before.
    Parent,
    /// The daemon: a new session, stdio on /dev/null, only `keep` of the
    /// other fds left open.
    Daemon,
}

/// Forks a daemon: the child leaves the session and terminal, points its
/// stdio at /dev/null, closes every fd but `keep`, and ignores the signals
/// a terminal or a casual `kill` sends (only SIGKILL ends it early).
///
/// The caller must hold no lock another thread could be holding (the
/// child has only the calling thread).
pub fn daemonize(keep: &[std::os::fd::RawFd]) -> std::io::Result<Forked> {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: the caller holds no lock; the child goes on with the calling
    // thread only, as documented above.
    match unsafe { libc::fork() } {
        -1 => return Err(std::io::Error::last_os_error()),
        0 => {}
        _ => return Ok(Forked::Parent),
    }
    // SAFETY: plain syscalls on integer arguments and a constant path.
    unsafe {
        libc::setsid();
        for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for fd in 0..=2 {
                libc::dup2(null, fd);
            }
            if null > 2 {
                libc::close(null);
            }
        }
    }
    // The OOM killer must not pick the server: the pages it has not filled
    // yet would read as zeros in the processes it serves.
    let _ = std::fs::write("/proc/self/oom_score_adj", "-1000");
    let open: Vec<i32> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    for fd in open.into_iter().filter(|fd| *fd > 2 && !keep.contains(fd)) {
        // SAFETY: closing an fd of ours that nothing here uses any more
        // (the directory's own fd is closed already, so this may fail).
        unsafe { libc::close(fd) };
    }
    Ok(Forked::Daemon)
}

/// One line to the system log (the detached page server has no terminal).
pub fn syslog(err: bool, msg: &str) {
    let Ok(msg) = std::ffi::CString::new(msg.replace('\0', " ")) else {
        return;
    };
    let level = if err { libc::LOG_ERR } else { libc::LOG_INFO };
    // SAFETY: constant format and ident strings, `msg` a live C string.
    unsafe {
        libc::openlog(c"ckpt-lazy".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON);
        libc::syslog(level, c"%s".as_ptr(), msg.as_ptr());
    }
}

/// Moves the calling thread into the namespace open at `ns` of kind
/// `nstype` (UTS and IPC namespaces are per thread).
pub fn setns(ns: std::os::fd::BorrowedFd<'_>, nstype: libc::c_int) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: setns takes an fd we hold and an integer; it changes only
    // the calling thread's namespaces.
    check(unsafe { libc::setns(ns.as_raw_fd(), nstype) })
}

/// `NS_GET_NSTYPE` (`_IO(0xb7, 0x3)`): the `CLONE_NEW*` kind of a
/// namespace fd.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// The kind (`CLONE_NEW*`) of the namespace `ns` refers to; an error for
/// anything but a namespace file.
pub fn ns_type(ns: std::os::fd::BorrowedFd<'_>) -> std::io::Result<libc::c_int> {
    use std::os::fd::AsRawFd;
    // SAFETY: NS_GET_NSTYPE takes no argument and only answers about the
    // fd; any other file refuses it (ENOTTY).
    let r = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_NSTYPE) };
    check(r).map(|()| r)
}

/// Sets the calling thread's UTS namespace's host and domain names.
pub fn set_uts_names(hostname: &[u8], domainname: &[u8]) -> std::io::Result<()> {
    // SAFETY: the pointers and lengths describe live slices; the kernel
    // copies at most `len` bytes (and refuses more than it holds).
    check(unsafe { libc::sethostname(hostname.as_ptr().cast(), hostname.len()) })?;
    // SAFETY: as above.
    check(unsafe { libc::setdomainname(domainname.as_ptr().cast(), domainname.len()) })
}

/// `unshare(CLONE_NEWTIME)`: the children the calling thread creates from
/// now on are in a new time namespace, whose offsets can be written (in
/// /proc/self/timens_offsets, from the main thread) until the first of
/// them exists.
pub fn unshare_time_namespace() -> std::io::Result<()> {
    // SAFETY: unshare takes no pointers; CLONE_NEWTIME changes only the
    // namespace of children created later.
    check(unsafe { libc::unshare(libc::CLONE_NEWTIME) })
}

/// `unshare(CLONE_FS)`: the calling thread gets a root, cwd and umask of
/// its own, no longer shared with the process's other threads (setns of a
/// mount namespace refuses a caller whose are shared, EINVAL). A no-op
/// where they are its own already.
pub fn unshare_fs() -> std::io::Result<()> {
    // SAFETY: unshare takes no pointers; CLONE_FS copies only the calling
    // thread's filesystem context.
    check(unsafe { libc::unshare(libc::CLONE_FS) })
}

/// `fchdir(dir)` (an `O_PATH` fd will do): the calling thread's cwd (its
/// own after [`unshare_fs`]) is `dir`.
pub fn fchdir(dir: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fchdir takes an fd we hold and changes only the cwd.
    check(unsafe { libc::fchdir(dir.as_raw_fd()) })
}

/// `chroot(".")`: the calling thread's root becomes its cwd.
pub fn chroot_to_cwd() -> std::io::Result<()> {
    // SAFETY: a static NUL-terminated path; chroot changes only the root.
    check(unsafe { libc::chroot(c".".as_ptr()) })
}

/// The calling thread's id.
pub fn gettid() -> i32 {
    // SAFETY: gettid takes no arguments.
    unsafe { libc::gettid() }
}

/// Whether the calling thread is its process's main thread (the one
/// /proc/self speaks for).
pub fn is_main_thread() -> bool {
    // SAFETY: gettid and getpid take no arguments.
    unsafe { libc::gettid() == libc::getpid() }
}

/// `clock_gettime(clock)` in nanoseconds.
pub fn clock_ns(clock: libc::clockid_t) -> std::io::Result<i64> {
    // SAFETY: an all-zero timespec is a valid value.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: clock_gettime fills the timespec it is given.
    check(unsafe { libc::clock_gettime(clock, &mut ts) })?;
    Ok(ts.tv_sec * NANOS_PER_SEC + ts.tv_nsec)
}

/// Nanoseconds in a second.
pub const NANOS_PER_SEC: i64 = 1_000_000_000;

/// `getauxval(AT_SYSINFO_EHDR)`: where the kernel mapped this process's
/// vDSO (0 without one).
#[cfg(test)]
pub fn sysinfo_ehdr() -> u64 {
    // SAFETY: getauxval only reads the auxiliary vector the kernel gave
    // this process; any type is a valid argument.
    unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) }
}

/// Bytes waiting to be read from a terminal fd (`FIONREAD`).
pub fn readable_bytes(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<i32> {
    use std::os::fd::AsRawFd;
    let mut v: libc::c_int = 0;
    // SAFETY: FIONREAD writes one int into the live local `v`.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut v as *mut libc::c_int) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(v)
}
