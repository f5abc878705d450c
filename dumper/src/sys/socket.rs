//! Socket calls the dumper makes on its own copies of the tree's sockets.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Accepts one connection pending on the listening socket `listener`, if
/// one is pending now; never waits (a poll first, since the listener's
/// file may be blocking and its blocking mode is the process's).
pub fn accept_pending(listener: BorrowedFd<'_>) -> std::io::Result<Option<OwnedFd>> {
    if super::poll_now(listener, libc::POLLIN)? & libc::POLLIN == 0 {
        return Ok(None);
    }
    // SAFETY: no address is asked for (null pointers); the result is a new
    // fd or -1.
    let r = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: accept4 returned a new fd nobody else owns.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(r) }))
}
