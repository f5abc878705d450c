//! aio contexts (`io_setup(2)`): the ring each is, and the completions it
//! held at the dump.
//!
//! The messages are defined in `image/proto/mm.proto`; this module gives
//! them their Rust path, the ring's layout as the kernel defines it, and
//! the checks restore makes before it trusts an image's ring.

pub use crate::pb::{AioEvent, AioRing};

/// Bytes of `struct aio_ring`, the header before the event slots.
pub const RING_HEADER_LEN: u64 = 32;
/// Bytes of one `struct io_event`.
pub const EVENT_LEN: u64 = 32;
/// `AIO_RING_MAGIC`, the header's `magic`.
pub const RING_MAGIC: u32 = 0xa10a_10a1;
/// The largest ring restore accepts: far more than `fs.aio-max-nr`'s
/// default lets one context have, small enough that a forged length
/// cannot make restore allocate much.
pub const MAX_RING_LEN: u64 = 64 << 20;

/// Offsets of the header's fields (`struct aio_ring`).
pub mod header {
    /// `unsigned nr`: event slots.
    pub const NR: usize = 4;
    /// `unsigned head`: next slot the program reaps.
    pub const HEAD: usize = 8;
    /// `unsigned tail`: next slot the kernel fills.
    pub const TAIL: usize = 12;
    /// `unsigned magic`.
    pub const MAGIC: usize = 16;
    /// `unsigned header_length`.
    pub const HEADER_LENGTH: usize = 28;
}

/// Event slots of a ring mapping of `ring_len` bytes.
pub fn slots_in(ring_len: u64) -> u64 {
    ring_len.saturating_sub(RING_HEADER_LEN) / EVENT_LEN
}

/// Completions waiting between `head` and `tail` of a ring of `nr` slots.
pub fn waiting(nr: u32, head: u32, tail: u32) -> u32 {
    if tail >= head {
        tail - head
    } else {
        nr - head + tail
    }
}

impl AioRing {
    /// The `nr_events` to ask `io_setup` for so the kernel makes a ring of
    /// `nr` slots again: it doubles the request and adds two slots, then
    /// fills the last page.
    pub fn nr_requests(&self) -> u32 {
        self.nr.saturating_sub(2) / 2
    }

    /// Byte offset in the ring of event slot `slot`.
    pub fn slot_offset(slot: u32) -> u64 {
        RING_HEADER_LEN + u64::from(slot) * EVENT_LEN
    }

    /// Checks everything restore relies on: a page-aligned ring of bounded
    /// size whose slots match `nr`, positions inside it, and exactly the
    /// completions between them.
    pub fn validate(&self) -> Result<(), String> {
        let ps = crate::PAGE_SIZE;
        let at = format!("aio ring {:#x}", self.id);
        if self.id == 0
            || !self.id.is_multiple_of(ps)
            || self.ring_len == 0
            || !self.ring_len.is_multiple_of(ps)
        {
            return Err(format!(
                "{at}: address or length {:#x} not page aligned",
                self.ring_len
            ));
        }
        if self.ring_len > MAX_RING_LEN || self.id.checked_add(self.ring_len).is_none() {
            return Err(format!("{at}: length {:#x} out of bounds", self.ring_len));
        }
        if u64::from(self.nr) != slots_in(self.ring_len) || self.nr < 2 {
            return Err(format!(
                "{at}: {} slots for {:#x} bytes",
                self.nr, self.ring_len
            ));
        }
        if self.head >= self.nr || self.tail >= self.nr {
            return Err(format!(
                "{at}: head {} or tail {} outside its {} slots",
                self.head, self.tail, self.nr
            ));
        }
        let want = waiting(self.nr, self.head, self.tail);
        if self.events.len() != want as usize {
            return Err(format!(
                "{at}: {} completions saved, {want} between head and tail",
                self.events.len()
            ));
        }
        Ok(())
    }
}

impl AioEvent {
    /// The event as the kernel lays it out in a ring slot.
    pub fn to_bytes(&self) -> [u8; EVENT_LEN as usize] {
        let mut b = [0u8; EVENT_LEN as usize];
        b[0..8].copy_from_slice(&self.data.to_ne_bytes());
        b[8..16].copy_from_slice(&self.obj.to_ne_bytes());
        b[16..24].copy_from_slice(&self.res.to_ne_bytes());
        b[24..32].copy_from_slice(&self.res2.to_ne_bytes());
        b
    }

    /// The event in a ring slot's bytes.
    pub fn from_bytes(b: &[u8; EVENT_LEN as usize]) -> AioEvent {
        let word = |i: usize| -> [u8; 8] { b[i..i + 8].try_into().expect("8 bytes") };
        AioEvent {
            data: u64::from_ne_bytes(word(0)),
            obj: u64::from_ne_bytes(word(8)),
            res: i64::from_ne_bytes(word(16)),
            res2: i64::from_ne_bytes(word(24)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(head: u32, tail: u32, events: usize) -> AioRing {
        AioRing {
            id: 0x7f00_0000_0000,
            ring_len: 2 * crate::PAGE_SIZE,
            nr: 255,
            head,
            tail,
            events: vec![AioEvent::default(); events],
        }
    }

    #[test]
    fn a_ring_must_hold_exactly_its_waiting_completions() {
        assert_eq!(ring(3, 7, 4).validate(), Ok(()));
        assert_eq!(ring(250, 2, 7).validate(), Ok(()));
        assert!(ring(3, 7, 5).validate().is_err());
        assert!(ring(3, 255, 252).validate().is_err());
        let mut forged = ring(0, 0, 0);
        forged.ring_len = 1 << 40;
        assert!(forged.validate().is_err());
        forged.nr = slots_in(forged.ring_len) as u32;
        assert!(forged.validate().is_err());
    }

    #[test]
    fn events_keep_their_layout() {
        let e = AioEvent {
            data: 1,
            obj: 2,
            res: -3,
            res2: 4,
        };
        assert_eq!(AioEvent::from_bytes(&e.to_bytes()), e);
        assert_eq!(ring(0, 0, 0).nr_requests(), 126);
        // 126 requests: 254 slots and two more, one page and a bit: 255.
        assert_eq!(slots_in(2 * crate::PAGE_SIZE), 255);
    }
}
