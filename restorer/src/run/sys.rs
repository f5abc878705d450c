//! Raw syscalls of `ckpt run`: namespaces, the private /proc, signal
//! forwarding.

use std::io;
use std::sync::atomic::{AtomicI32, Ordering};

/// Where forwarded signals go: the pid the forwarding handler kills (0:
/// nowhere yet). A static because a signal handler can reach nothing else.
static FORWARD_TO: AtomicI32 = AtomicI32::new(0);

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Sets the host name of this process's UTS namespace (no allocation:
/// safe between fork and exec).
pub fn sethostname(name: &[u8]) -> io::Result<()> {
    // SAFETY: the pointer and length describe `name`, which outlives the
    // call; the kernel copies at most `len` bytes.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })
}

/// Puts the children this process creates from now on into a new PID
/// namespace (the first one becomes its PID 1).
pub fn unshare_pid_namespace() -> io::Result<()> {
    // SAFETY: unshare takes no pointers; CLONE_NEWPID only changes the
    // namespace of children created later.
    check(unsafe { libc::unshare(libc::CLONE_NEWPID) })
}

/// In a freshly forked child, before exec: a new mount namespace whose
/// mounts do not propagate back to the host (a slave: the host's still
/// arrive), with a /proc of the child's PID
/// namespace on /proc; a new session; every fd above 2 closed. Only raw
/// syscalls, no allocation (it runs between fork and exec).
pub fn enter_private_proc_and_session() -> io::Result<()> {
    // SAFETY: unshare takes no pointers and affects only this process.
    check(unsafe { libc::unshare(libc::CLONE_NEWNS) })?;
    // SAFETY: static NUL-terminated strings; a recursive propagation change
    // of this (new, private) mount namespace.
    check(unsafe {
        libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_SLAVE,
            std::ptr::null(),
        )
    })?;
    // SAFETY: static NUL-terminated strings; mounts a new proc instance
    // over /proc in this mount namespace only (the host's /proc is
    // untouched). procfs takes the PID namespace of the mounting process,
    // which is the new one: this child is its PID 1.
    check(unsafe {
        libc::mount(
            c"proc".as_ptr(),
            c"/proc".as_ptr(),
            c"proc".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            std::ptr::null(),
        )
    })?;
    // SAFETY: setsid takes no arguments.
    check(unsafe { libc::setsid() })?;
    // SAFETY: close_range takes no pointers and only closes fds of this
    // (child) process.
    check(unsafe { libc::close_range(3, libc::c_uint::MAX, 0) })
}

extern "C" fn forward(sig: libc::c_int) {
    let to = FORWARD_TO.load(Ordering::Relaxed);
    if to > 0 {
        // SAFETY: kill is async-signal-safe and takes no pointers.
        unsafe {
            libc::kill(to, sig);
        }
    }
}

/// From now on each of `signals` received is sent on to `pid`.
pub fn forward_signals(signals: &[libc::c_int], pid: i32) -> io::Result<()> {
    FORWARD_TO.store(pid, Ordering::Relaxed);
    for &sig in signals {
        // SAFETY: an all-zero sigaction is a valid value of the plain C
        // struct; the fields are set below.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = forward as extern "C" fn(libc::c_int) as usize;
        // Interrupted waits resume: the wait loop only cares about exits.
        act.sa_flags = libc::SA_RESTART;
        // SAFETY: `act` is a valid sigaction; the handler only reads an
        // atomic and calls kill, both async-signal-safe.
        check(unsafe { libc::sigaction(sig, &act, std::ptr::null_mut()) })?;
    }
    Ok(())
}

/// Blocks (`block`) or unblocks `signals` in this thread.
pub fn mask_signals(signals: &[libc::c_int], block: bool) -> io::Result<()> {
    // SAFETY: an all-zero sigset_t is a valid value; it is emptied below.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t owned here.
    unsafe { libc::sigemptyset(&mut set) };
    for &sig in signals {
        // SAFETY: as above; sig is a valid signal number.
        unsafe { libc::sigaddset(&mut set, sig) };
    }
    let how = if block {
        libc::SIG_BLOCK
    } else {
        libc::SIG_UNBLOCK
    };
    // SAFETY: `set` is valid; the old mask is not asked for.
    let rc = unsafe { libc::pthread_sigmask(how, &set, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

/// Closes every fd above 2.
pub fn close_fds_above_stdio() -> io::Result<()> {
    // SAFETY: close_range takes no pointers and closes only our own fds;
    // nothing of this process uses them (it was just exec'd).
    check(unsafe { libc::close_range(3, libc::c_uint::MAX, 0) })
}

/// `unshare(flags)` for this thread (CLONE_NEWUTS, CLONE_NEWIPC: at once;
/// CLONE_NEWTIME: for the children it creates and its next exec).
pub fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes no pointers and affects only this thread.
    check(unsafe { libc::unshare(flags) })
}
