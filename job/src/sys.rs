//! The crate's raw system calls: what a child process starts with, set in
//! the forked child before `exec` (the one place this crate needs
//! `unsafe`).

use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};

/// A script (or `ckpt slurm`'s application) gets stdin, stdout and stderr
/// only: fds ckpt itself inherited without close-on-exec (from its caller,
/// or `--inherit-fd` fds meant for the restored tree) must not reach it.
pub fn close_inherited_fds(cmd: &mut Command) {
    let hook = || -> std::io::Result<()> {
        // SAFETY: close_range takes no pointers and only changes fd flags
        // of this (forked child) process.
        let rc = unsafe {
            libc::close_range(
                3,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC as libc::c_int,
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // SAFETY: the hook runs in the forked child before exec and only calls
    // close_range, which is async-signal-safe and neither allocates nor
    // takes locks.
    unsafe {
        cmd.pre_exec(hook);
    }
}

/// What a child of the wrapper starts with blocked.
#[derive(Debug, Clone, Copy)]
pub enum ChildSignals {
    /// Nothing: the application (and what starts or restores it) gets
    /// every signal as it would without the wrapper. The wrapper's own
    /// blocked set (its signals wait for `sigwait`) is not its business,
    /// and a child with SIGCHLD blocked may never see its own children end
    /// (a shell's `wait`).
    None,
    /// The checkpoint signal and SIGTERM: a dump is not cut short by
    /// another warning or by Slurm's SIGTERM at the end (proctrack signals
    /// every process of the job), it finishes within KillWait or is
    /// SIGKILLed, which the next start reports (`ATTEMPT`).
    Dump(Signal),
}

/// Makes `cmd`'s process start with exactly `which` blocked.
pub fn child_signals(cmd: &mut Command, which: ChildSignals) {
    let mut blocked = SigSet::empty();
    if let ChildSignals::Dump(sig) = which {
        blocked.add(sig);
        blocked.add(Signal::SIGTERM);
    }
    let hook = move || -> std::io::Result<()> {
        sigprocmask(SigmaskHow::SIG_SETMASK, Some(&blocked), None).map_err(std::io::Error::from)
    };
    // SAFETY: the hook runs in the forked child before exec and only calls
    // sigprocmask (the set was made before the fork), which is
    // async-signal-safe and neither allocates nor takes locks.
    unsafe {
        cmd.pre_exec(hook);
    }
}
