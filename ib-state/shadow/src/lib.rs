//! `libckpt_ibverbs.so`: the shadow verbs layer.
//!
//! A job started with `LD_PRELOAD=libckpt_ibverbs.so` (what `ckpt run
//! --ib` sets up) calls this library's `ibv_*` functions instead of
//! libibverbs'; they forward to the real ones and hand the application
//! shadow objects (see [`objects`]). Its ids stay virtual: equal to the
//! real ones until a restart recreates the resources on whatever device
//! the process now runs on, after which every post and completion is
//! translated. This is the design of "Transparent Checkpoint-Restart over
//! InfiniBand" (Cao, Kerr, Arya, Cooperman, HPDC'14), with what its
//! follow-up on petascale jobs and DMTCP's own plugin left open done
//! differently:
//! - the checkpoint drains every CQ until every signaled send completed or
//!   a quiet window passed, not one sweep;
//! - a restart re-posts exactly the sends the peer has not received (the
//!   peer's count of consumed receives says which were delivered), so
//!   nothing is delivered twice and PSNs need not be reset;
//! - GIDs (RoCE) are virtual too, and keys created after a restart never
//!   collide with live virtual ones in the same domain.
//!
//! ckpt drives checkpoint and restart through the `ckpt_ib_*` functions of
//! [`control`].

pub mod control;
pub mod datapath;
pub mod objects;
pub mod real;
pub mod restart;
pub mod ring;
pub mod verbs;

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Threads currently inside a verb of this layer. A checkpoint only
/// proceeds when it is zero, so no lock of the layer is held by a frozen
/// thread and no request is half-recorded.
pub static IN_VERBS: AtomicUsize = AtomicUsize::new(0);

/// Marks the calling thread as inside a verb for its lifetime.
pub struct Entry(());

impl Entry {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Entry {
        IN_VERBS.fetch_add(1, Ordering::SeqCst);
        Entry(())
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        IN_VERBS.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A negative errno, as `poll_cq` and the `ckpt_ib_*` functions return.
pub fn errno_rc(errno: c_int) -> c_int {
    -errno
}

/// Sets `errno` (the verbs returning a pointer report failures there).
pub fn set_errno(errno: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot.
    unsafe { *libc::__errno_location() = errno };
}

/// The calling thread's `errno`.
pub fn errno() -> c_int {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Says why the process cannot go on and aborts (a missing libibverbs
/// symbol: nothing sensible can be returned to the application).
pub fn fatal(msg: &str) -> ! {
    let line = format!("libckpt_ibverbs: {msg}\n");
    // SAFETY: writing a buffer we own to stderr.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
    std::process::abort();
}

/// Reports once on stderr that the application used a verb the layer
/// cannot checkpoint, naming it.
pub fn unsupported(name: &str) {
    let line = format!("libckpt_ibverbs: {name} is not supported under ckpt\n");
    // SAFETY: writing a buffer we own to stderr.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}
