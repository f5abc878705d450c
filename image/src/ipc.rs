//! SysV IPC objects: shared memory segments, semaphore sets, message
//! queues.
//!
//! The messages are defined in `image/proto/ipc.proto`.

pub use crate::pb::{Ipc, IpcPerm, MsgQueue, QueuedMessage, SemSet, ShmPages, ShmSegment};

use crate::PAGE_SIZE;

/// The permission bits of `IpcPerm::mode` (the rest of the kernel's mode
/// word is state, like SHM_DEST, not permission).
pub const MODE_BITS: u32 = 0o777;

impl ShmSegment {
    /// The segment's id.
    pub fn id(&self) -> i32 {
        self.perm.as_ref().map_or(0, |p| p.id)
    }

    /// Bytes of saved pages (the size of its `ipc-shm-ID.img`).
    pub fn saved_bytes(&self) -> u64 {
        self.pages
            .iter()
            .map(|r| r.nr_pages.saturating_mul(PAGE_SIZE))
            .fold(0, u64::saturating_add)
    }

    /// The size rounded up to whole pages (what an attach maps).
    pub fn mapped_len(&self) -> u64 {
        self.size.div_ceil(PAGE_SIZE).saturating_mul(PAGE_SIZE)
    }
}

impl Ipc {
    /// Whether the job has no IPC object at all.
    pub fn is_empty(&self) -> bool {
        self.shm.is_empty() && self.sem.is_empty() && self.msg.is_empty()
    }
}
