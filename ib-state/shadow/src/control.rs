//! The C interface ckpt drives (and a job may call itself): checkpoint,
//! resume, restart. Each returns 0 or a negative errno; the reason of the
//! last failure is kept for [`ckpt_ib_last_error`].

#![allow(clippy::missing_safety_doc)]

use std::ffi::{c_char, c_int};
use std::sync::Mutex;
use std::time::Duration;

use crate::restart::{self, DrainReport, Failure};

/// The last failure's message, nul-terminated.
static LAST_ERROR: Mutex<Vec<u8>> = Mutex::new(Vec::new());
/// The blob of the last `ckpt_ib_restart_local`, kept for the caller.
static BLOB: Mutex<Vec<u8>> = Mutex::new(Vec::new());

fn report(r: Result<(), Failure>) -> c_int {
    match r {
        Ok(()) => 0,
        Err(f) => {
            if let Ok(mut e) = LAST_ERROR.try_lock() {
                e.clear();
                e.extend_from_slice(f.what.as_bytes());
                e.push(0);
            }
            -f.errno.abs().max(1)
        }
    }
}

/// Drains every CQ: waits until every outstanding send completed, or no
/// completion came for `quiet_ms`, at most `max_wait_ms`. Fills `out` (if
/// not null). -EBUSY: a thread is inside a verbs call (thaw it a moment
/// and try again).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ckpt_ib_checkpoint(
    quiet_ms: u32,
    max_wait_ms: u32,
    out: *mut DrainReport,
) -> c_int {
    report(
        restart::drain(
            Duration::from_millis(quiet_ms.into()),
            Duration::from_millis(max_wait_ms.into()),
        )
        .map(|r| {
            if !out.is_null() {
                // SAFETY: the caller's out pointer.
                unsafe { *out = r };
            }
        }),
    )
}

/// After a checkpoint without restart: the job goes on with the same
/// resources (the drained completions are returned first).
#[unsafe(no_mangle)]
pub extern "C" fn ckpt_ib_resume() -> c_int {
    crate::open_gate();
    0
}

/// Flag of [`ckpt_ib_restart_local`]: the old resources are still alive
/// (a restart in place, without a restore); destroy them first.
pub const CKPT_IB_RETIRE_OLD: u32 = 1;

/// Recreates every verbs object; `*blob`/`*len` get this process's
/// restart blob (valid until the next call), for every process's
/// [`ckpt_ib_restart_connect`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ckpt_ib_restart_local(
    flags: u32,
    blob: *mut *const u8,
    len: *mut usize,
) -> c_int {
    // The gate was closed at the checkpoint and saved so.
    crate::CKPT_IB_GATE.store(0, std::sync::atomic::Ordering::SeqCst);
    report(
        restart::restart_local(flags & CKPT_IB_RETIRE_OLD != 0).map(|b| {
            let mut keep = BLOB.lock().unwrap_or_else(|e| e.into_inner());
            *keep = b.encode();
            // SAFETY: the caller's out pointers.
            unsafe {
                *blob = keep.as_ptr();
                *len = keep.len();
            }
        }),
    )
}

/// Connects again with every process's blob (concatenated, this one's
/// included) and re-posts the outstanding work.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ckpt_ib_restart_connect(blobs: *const u8, len: usize) -> c_int {
    if blobs.is_null() || len > restart::MAX_BLOB * 64 {
        return -libc::EINVAL;
    }
    // SAFETY: the caller's buffer of `len` bytes.
    let all = unsafe { std::slice::from_raw_parts(blobs, len) };
    let r = report(restart::restart_connect(all));
    // Threads that waited at the gate since the checkpoint go on now.
    crate::open_gate();
    r
}

/// The reason of the last failed `ckpt_ib_*` call (empty if none).
#[unsafe(no_mangle)]
pub extern "C" fn ckpt_ib_last_error() -> *const c_char {
    let mut e = LAST_ERROR.lock().unwrap_or_else(|e| e.into_inner());
    if e.is_empty() {
        e.push(0);
    }
    e.as_ptr().cast()
}
