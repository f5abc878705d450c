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
//! - RDMA writes and atomics, which the peer counts nowhere, are never
//!   re-posted: the drain waits until each is proven executed (behind a
//!   fence of its own where nothing else would complete) or refuses the
//!   checkpoint;
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
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Threads currently inside a verb of this layer. A checkpoint only
/// proceeds when it is zero, so no lock of the layer is held by a frozen
/// thread and no request is half-recorded. Exported: the dumper reads it
/// in the process's memory (the counter is at the symbol's address).
#[unsafe(no_mangle)]
pub static CKPT_IB_IN_VERBS: OwnLines<AtomicUsize> = OwnLines(AtomicUsize::new(0));

/// A value alone on its cache lines (two: the adjacent-line prefetcher
/// pairs them). Every verb of every thread writes the in-verbs count;
/// beside it, what every verb only reads (the gate, whether a restart
/// happened) would be evicted from each core's cache each time another
/// thread counted itself, and those reads would miss too: with two
/// threads posting at once, the layer cost more than twice as much with
/// them together (scripts/bench-ib-layer.sh).
#[repr(C, align(128))]
pub struct OwnLines<T>(pub T);

impl<T> std::ops::Deref for OwnLines<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Closed (non-zero) by the dumper while it waits for the threads inside
/// a verb to come out: a thread entering a verb waits at the gate instead,
/// in a futex wait the freeze can stop cleanly. The layer clears it when a
/// checkpoint resumes or a restart begins.
#[unsafe(no_mangle)]
pub static CKPT_IB_GATE: AtomicU32 = AtomicU32::new(0);

/// How long a thread waits at a closed gate before it goes through anyway:
/// if ckpt died while the gate was closed, the job goes on by itself.
const GATE_MAX_WAIT: Duration = Duration::from_secs(30);
/// One futex wait at the gate (the gate is re-checked after each).
const GATE_POLL: Duration = Duration::from_millis(10);

pub use CKPT_IB_IN_VERBS as IN_VERBS;

/// Marks the calling thread as inside a verb for its lifetime.
pub struct Entry(());

impl Entry {
    #[allow(clippy::new_without_default)]
    pub fn new() -> Entry {
        let mut since: Option<Instant> = None;
        loop {
            if CKPT_IB_GATE.load(Ordering::SeqCst) == 0
                || since.is_some_and(|t| t.elapsed() >= GATE_MAX_WAIT)
            {
                IN_VERBS.fetch_add(1, Ordering::SeqCst);
                // Re-checked after counting in: the dumper closes the gate,
                // then reads the count; one of the two sees the other.
                if CKPT_IB_GATE.load(Ordering::SeqCst) == 0
                    || since.is_some_and(|t| t.elapsed() >= GATE_MAX_WAIT)
                {
                    return Entry(());
                }
                IN_VERBS.fetch_sub(1, Ordering::SeqCst);
            }
            since.get_or_insert_with(Instant::now);
            wait_at_gate();
        }
    }
}

fn wait_at_gate() {
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: GATE_POLL.as_nanos() as libc::c_long,
    };
    // SAFETY: a futex wait on the gate's word with a relative timeout; the
    // kernel only reads the word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            CKPT_IB_GATE.as_ptr(),
            libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
            1u32,
            &ts,
        )
    };
}

/// Opens the gate and wakes every thread waiting at it.
pub fn open_gate() {
    CKPT_IB_GATE.store(0, Ordering::SeqCst);
    // SAFETY: a futex wake on the gate's word.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            CKPT_IB_GATE.as_ptr(),
            libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
            i32::MAX,
        )
    };
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
