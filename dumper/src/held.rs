//! Memory ckpt holds page data in between reading it from a frozen tree
//! and writing it once the tree runs again (`dump --prev --background`).
//!
//! Reading into memory ckpt has just allocated costs a page fault per page
//! (on a VM, often a fault on the host too): about three times the copy
//! itself, all of it while the tree is frozen. A reservation made and
//! faulted in *before* the freeze, sized from what the pre-dump's tracker
//! says was written so far, takes that cost out of the frozen time. What
//! does not fit (pages written between the estimate and the freeze) is
//! read into ordinary allocations as before.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::WriteOptions;

/// The most page data written since a pre-dump that a `--prev
/// --background` dump holds in memory between reading it (frozen) and
/// writing it (running); more is written while frozen.
pub const HELD_FRESH_BYTES: u64 = 1 << 30;

/// Room left for pages written between the estimate and the freeze.
const HEADROOM_BYTES: u64 = 8 << 20;

/// A reservation of faulted-in memory, handed out in disjoint pieces.
#[derive(Default)]
pub struct HeldMemory {
    map: Option<memmap2::MmapRaw>,
    /// Bytes handed out so far.
    used: AtomicUsize,
}

impl HeldMemory {
    /// What a dump with `opts` will hold, reserved now, before the freeze:
    /// nothing unless it is a `--prev --background` dump. Call it as late
    /// before the freeze as possible: what is written after it is read into
    /// fresh allocations.
    pub fn for_dump(opts: &WriteOptions<'_>) -> HeldMemory {
        let Some(prev) = opts.prev.filter(|_| opts.background) else {
            return HeldMemory::default();
        };
        let started = std::time::Instant::now();
        let estimate = prev.frozen_read_estimate();
        if estimate == 0 || estimate > HELD_FRESH_BYTES {
            return HeldMemory::default();
        }
        let bytes = (estimate + estimate / 8 + HEADROOM_BYTES).min(HELD_FRESH_BYTES);
        let held = HeldMemory::reserve(bytes);
        log::info!(
            "held memory: {} bytes reserved for the {estimate} bytes written since the pre-dump ({:.3} ms)",
            held.capacity(),
            started.elapsed().as_secs_f64() * 1e3
        );
        held
    }

    /// Reserves `bytes` (rounded to pages) and faults them in now. On
    /// failure (no memory to spare) the reservation is empty: every piece
    /// is then allocated when taken.
    pub fn reserve(bytes: u64) -> HeldMemory {
        let Ok(len) = usize::try_from(bytes) else {
            return HeldMemory::default();
        };
        if len == 0 {
            return HeldMemory::default();
        }
        let map = memmap2::MmapOptions::new()
            .len(len)
            .populate()
            .map_anon()
            .inspect_err(|e| log::debug!("held memory: {len} bytes not reserved: {e}"))
            .ok()
            .map(memmap2::MmapRaw::from);
        HeldMemory {
            map,
            used: AtomicUsize::new(0),
        }
    }

    /// Bytes reserved.
    pub fn capacity(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len())
    }

    /// A zeroed buffer of `len` bytes: from the reservation while
    /// it lasts, else freshly allocated.
    pub fn take(&self, len: usize) -> HeldBuf<'_> {
        if let Some(map) = &self.map {
            let mut at = self.used.load(Ordering::Relaxed);
            while at + len <= map.len() {
                match self.used.compare_exchange_weak(
                    at,
                    at + len,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        // SAFETY: `at..at + len` lies inside the mapping,
                        // which lives as long as `self`, and the
                        // compare-exchange hands out every byte of it at
                        // most once, so no two slices overlap; the mapping
                        // is private anonymous memory no one else writes.
                        let piece = unsafe {
                            std::slice::from_raw_parts_mut(map.as_mut_ptr().add(at), len)
                        };
                        return HeldBuf::Reserved(piece);
                    }
                    Err(now) => at = now,
                }
            }
        }
        HeldBuf::Owned(vec![0u8; len])
    }

    /// Bytes taken from the reservation so far.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

/// A buffer from [`HeldMemory::take`].
pub enum HeldBuf<'m> {
    /// A piece of the reservation.
    Reserved(&'m mut [u8]),
    /// Allocated when taken: the reservation was used up.
    Owned(Vec<u8>),
}

impl Deref for HeldBuf<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            HeldBuf::Reserved(s) => s,
            HeldBuf::Owned(v) => v,
        }
    }
}

impl DerefMut for HeldBuf<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            HeldBuf::Reserved(s) => s,
            HeldBuf::Owned(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_are_disjoint_then_allocated() {
        let held = HeldMemory::reserve(3 * 4096);
        assert_eq!(held.capacity(), 3 * 4096);
        let mut a = held.take(4096);
        let mut b = held.take(2 * 4096);
        a.fill(1);
        b.fill(2);
        assert!(a.iter().all(|&x| x == 1) && b.iter().all(|&x| x == 2));
        assert!(matches!(a, HeldBuf::Reserved(_)) && matches!(b, HeldBuf::Reserved(_)));
        let c = held.take(1);
        assert!(matches!(c, HeldBuf::Owned(_)));
        assert_eq!(c.len(), 1);
        assert_eq!(held.used(), 3 * 4096);
    }

    #[test]
    fn empty_reservation_allocates() {
        let held = HeldMemory::default();
        assert!(matches!(held.take(10), HeldBuf::Owned(v) if v.len() == 10));
    }
}
