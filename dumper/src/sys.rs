//! Raw syscalls of the dumper that neither nix nor the parasite crate wrap.

/// `kcmp` type: compare two file descriptors' open file descriptions.
const KCMP_FILE: libc::c_int = 0;

/// True when fd `a` and fd `b` of `pid` refer to the same open file
/// description (share offset and flags), per `kcmp(2)`.
pub fn same_file_description(pid: i32, a: i32, b: i32) -> std::io::Result<bool> {
    // SAFETY: kcmp takes only integers and touches no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid, pid, KCMP_FILE, a, b) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r == 0)
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

/// The `PAGEMAP_SCAN` ioctl on a pagemap fd: an all-zero argument is
/// rejected with EINVAL when the ioctl exists, ENOTTY when it does not.
pub fn pagemap_scan_probe(pagemap: &std::fs::File) -> Result<(), i32> {
    // _IOWR('f', 16, struct pm_scan_arg) with a 64-byte argument.
    const PAGEMAP_SCAN: libc::c_ulong = 0xc040_6610;
    let arg = [0u64; 8];
    // SAFETY: arg is a live 64-byte buffer the kernel only reads here.
    let r = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(pagemap),
            PAGEMAP_SCAN,
            arg.as_ptr(),
        )
    };
    match ret(r as libc::c_long) {
        Err(libc::ENOTTY) => Err(libc::ENOTTY),
        _ => Ok(()),
    }
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
