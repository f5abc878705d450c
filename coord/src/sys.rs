//! The few raw system calls the coordinator makes, and the file-descriptor reserve.
//!
//! Most of it is about one resource: the process's file descriptors, of which a hostile
//! network can make the coordinator run out (every TCP connection costs one); the rest
//! names the peer of a Unix socket connection and the owner its socket file must have.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;

/// Where the reserve descriptor points: any file that always opens and costs nothing.
const RESERVE_PATH: &str = "/dev/null";

/// The process's soft limit on open file descriptors (`RLIMIT_NOFILE`), or `None` when it
/// is unlimited.
pub(crate) fn nofile_soft_limit() -> io::Result<Option<u64>> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable `rlimit` for the duration of the call, which only
    // writes that struct.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur))
}

/// True for the errors that mean "no descriptor (or no kernel memory) for a new socket":
/// the process (`EMFILE`) or the system (`ENFILE`) is out of descriptors, or the kernel is
/// short of buffers. They pass once something is closed; retrying at once only spins.
pub(crate) fn is_fd_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// The process's effective user id: the owner a Unix socket file and its directory must
/// have.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid takes no arguments, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// The credentials the kernel recorded for the peer of a connected Unix socket when it
/// connected (`SO_PEERCRED`): its pid and uid. The peer cannot forge them.
pub(crate) fn peer_cred(fd: std::os::fd::RawFd) -> io::Result<(i32, u32)> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a valid, writable `ucred` of `len` bytes for the duration of the
    // call, which writes at most `len` bytes to it and updates `len`; `fd` is borrowed
    // from a live socket by the caller.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((cred.pid, cred.uid))
}

/// One descriptor held in reserve, so that when `accept` fails for want of descriptors the
/// loop can still take the pending connection off the listen queue and close it (the
/// classic libev/nginx technique). Without it a full descriptor table leaves the
/// connections queued in the kernel, unanswered until their clients give up.
#[derive(Debug)]
pub(crate) struct ReserveFd {
    file: Option<File>,
}

impl ReserveFd {
    /// Opens the reserve.
    pub(crate) fn open() -> io::Result<ReserveFd> {
        Ok(ReserveFd {
            file: Some(File::open(RESERVE_PATH)?),
        })
    }

    /// Closes the reserve, freeing one descriptor; false if it was not held (a previous
    /// [`ReserveFd::reacquire`] failed).
    pub(crate) fn release(&mut self) -> bool {
        self.file.take().is_some()
    }

    /// Takes the descriptor back. Fails while the table is still full (another thread or
    /// a connection took the freed slot); the next release then has nothing to give.
    pub(crate) fn reacquire(&mut self) -> io::Result<()> {
        if self.file.is_none() {
            self.file = Some(File::open(RESERVE_PATH)?);
        }
        Ok(())
    }

    /// Whether the reserve is held.
    #[cfg(test)]
    pub(crate) fn is_held(&self) -> bool {
        self.file.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_is_readable_and_fd_errors_are_recognised() {
        assert!(nofile_soft_limit().unwrap().is_none_or(|n| n > 0));
        assert!(is_fd_exhaustion(&io::Error::from_raw_os_error(
            libc::EMFILE
        )));
        assert!(is_fd_exhaustion(&io::Error::from_raw_os_error(
            libc::ENFILE
        )));
        assert!(!is_fd_exhaustion(&io::Error::from_raw_os_error(
            libc::ECONNABORTED
        )));
    }

    #[test]
    fn reserve_releases_and_reacquires() {
        let mut r = ReserveFd::open().unwrap();
        assert!(r.is_held());
        assert!(r.release());
        assert!(!r.release());
        r.reacquire().unwrap();
        assert!(r.is_held());
    }
}
