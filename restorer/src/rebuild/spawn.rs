//! Creating the root: with its original pid (clone3 `set_tid`), or as
//! PID 1 of a new PID namespace, stopped and traced (a `ChildGuard` kills
//! it if the restore fails).

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::error::{RestoreError, Result};
use crate::held::ChildGuard;
use crate::options::RestoreOptions;
use crate::read::ProcessImages;
use crate::{fd, pid, sys};

/// The restorer's pidfd, inherited by the processes of the tree (see
/// [`fd::RESTORER_PIDFD`]), while it lives.
pub(super) struct RestorerPidfd {
    _fd: std::os::fd::OwnedFd,
}

impl RestorerPidfd {
    /// Above every fd number of the tree, so no fd restored replaces it
    /// before the last process has taken what it needs.
    pub(super) fn new(procs: &[ProcessImages]) -> Result<RestorerPidfd> {
        use std::os::fd::AsRawFd;
        let above = procs
            .iter()
            .flat_map(|p| p.fds.fds.iter().chain(&p.fds.in_flight).map(|f| f.fd))
            .max()
            .map_or(0, |m| m.saturating_add(1));
        let fd = sys::own_pidfd_at_least(above)
            .map_err(|e| RestoreError::os(std::process::id() as i32, "pidfd of the restorer", e))?;
        fd::RESTORER_PIDFD.store(fd.as_raw_fd(), std::sync::atomic::Ordering::Relaxed);
        Ok(RestorerPidfd { _fd: fd })
    }
}

impl Drop for RestorerPidfd {
    fn drop(&mut self) {
        fd::RESTORER_PIDFD.store(fd::NO_PIDFD, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Creates the root as PID 1 of a new PID namespace (`root` is its pid in
/// the image, which must be 1), stopped and traced by us.
pub(super) fn spawn_in_new_pidns(root: i32, ns_flags: u64) -> Result<ChildGuard> {
    const NS_INIT_PID: i32 = 1;
    if root != NS_INIT_PID {
        return Err(RestoreError::Host {
            pid: root,
            what: "the image's PID namespace root is not pid 1".into(),
        });
    }
    let got = sys::fork_stopped_in_new_pidns(ns_flags)
        .map_err(|e| RestoreError::os(root, "clone3 with CLONE_NEWPID", e))?;
    let guard = ChildGuard::new(got);
    match waitpid(Pid::from_raw(got), Some(WaitPidFlag::__WALL)) {
        Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) => Ok(guard),
        other => Err(RestoreError::os(
            root,
            format!("new PID namespace's init did not stop as expected: {other:?}"),
            std::io::Error::other("unexpected child state"),
        )),
    }
}

/// Creates the child with the original pid, stopped and traced by us.
pub(super) fn spawn(pid: i32, ns_flags: u64, opts: &RestoreOptions<'_>) -> Result<ChildGuard> {
    let deadline = Instant::now() + opts.pid_wait;
    loop {
        pid::wait_free(
            pid,
            deadline.saturating_duration_since(Instant::now()),
            opts.notice,
        )?;
        match sys::fork_stopped_with_pid(pid, ns_flags) {
            Ok(got) => {
                let guard = ChildGuard::new(got);
                match waitpid(Pid::from_raw(got), Some(WaitPidFlag::__WALL)) {
                    Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) => return Ok(guard),
                    other => {
                        return Err(RestoreError::os(
                            pid,
                            format!("new process did not stop as expected: {other:?}"),
                            std::io::Error::other("unexpected child state"),
                        ));
                    }
                }
            }
            // Taken between our check and clone3 (or a zombie not yet
            // visible as one): check again.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(RestoreError::os(pid, "clone3 with set_tid", e)),
        }
    }
}
