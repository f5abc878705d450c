//! Raw syscalls of the restorer: clone3 with `set_tid`, prlimit, mapping the pages file.

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

/// Creates a child with pid `pid` (fork semantics: a copy of this process).
/// In the child it calls `PTRACE_TRACEME` and stops itself with SIGSTOP, so
/// the parent holds it before it runs any code of its own; it never returns
/// in the child.
pub fn fork_stopped_with_pid(pid: i32) -> std::io::Result<i32> {
    let tid: libc::pid_t = pid;
    let args = CloneArgs {
        exit_signal: libc::SIGCHLD as u64,
        set_tid: &tid as *const libc::pid_t as u64,
        set_tid_size: 1,
        ..Default::default()
    };
    // SAFETY: args is a valid clone_args that outlives the call; with no
    // CLONE_VM and no stack the child gets a copy-on-write copy of our
    // memory, like fork(), and runs only async-signal-safe raw syscalls.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
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
    unsafe { memmap2::Mmap::map(file) }
}

/// `pidfd_open` + `pidfd_getfd`: a copy in the restorer of fd `fd` of
/// process `pid` (the same open file description).
pub fn take_fd(pid: i32, fd: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: pidfd_open takes only integers.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd is a new fd owned here from now on.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: pidfd_getfd takes only integers and returns a new fd.
    let got = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if got < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pidfd_getfd returned a new fd (O_CLOEXEC) nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(got as i32) })
}

/// `setsockopt(fd, SOL_SOCKET, opt)` with a value of type `T` (an int or
/// a struct timeval).
pub fn setsockopt<T: Copy>(fd: std::os::fd::BorrowedFd<'_>, opt: i32, v: T) -> std::io::Result<()> {
    // SAFETY: the kernel reads size_of::<T>() bytes from a live local.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SOL_SOCKET,
            opt,
            (&v as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
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
