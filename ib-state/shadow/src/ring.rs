//! Fixed-capacity queues for the bookkeeping of outstanding work requests
//! and drained completions. They never allocate after creation: the drain
//! at checkpoint time runs in a frozen process where another thread may
//! have stopped inside malloc.

use ckpt_ib_state::sys::{ibv_sge, ibv_wc};

/// A FIFO of at most `capacity` items.
pub struct Ring<T: Copy + Default> {
    slots: Vec<T>,
    head: usize,
    len: usize,
}

impl<T: Copy + Default> Ring<T> {
    /// An empty ring that holds `capacity` items (at least one).
    pub fn new(capacity: usize) -> Ring<T> {
        Ring {
            slots: vec![T::default(); capacity.max(1)],
            head: 0,
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `item`, or hands it back when the ring is full.
    pub fn push(&mut self, item: T) -> Result<usize, T> {
        if self.len == self.slots.len() {
            return Err(item);
        }
        let at = (self.head + self.len) % self.slots.len();
        self.slots[at] = item;
        self.len += 1;
        Ok(at)
    }

    pub fn pop_front(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        let item = self.slots[self.head];
        self.head = (self.head + 1) % self.slots.len();
        self.len -= 1;
        Some(item)
    }

    /// Drops the newest item (a work request the device refused).
    pub fn pop_back(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        Some(self.slots[(self.head + self.len) % self.slots.len()])
    }

    /// The slot index of the `i`-th item from the front.
    pub fn slot_of(&self, i: usize) -> usize {
        (self.head + i) % self.slots.len()
    }

    pub fn get(&self, i: usize) -> Option<&T> {
        (i < self.len).then(|| &self.slots[self.slot_of(i)])
    }

    /// Removes the `i`-th item from the front, keeping the order of the
    /// rest (a shared receive queue completes out of order).
    pub fn remove(&mut self, i: usize) -> Option<T> {
        if i >= self.len {
            return None;
        }
        let item = self.slots[self.slot_of(i)];
        for k in i..self.len - 1 {
            let (to, from) = (self.slot_of(k), self.slot_of(k + 1));
            self.slots[to] = self.slots[from];
        }
        self.len -= 1;
        Some(item)
    }
}

/// A work request as it was posted: what a re-post after a restart needs.
#[derive(Clone, Copy, Default)]
pub struct WorkRecord {
    pub wr_id: u64,
    pub opcode: u32,
    pub send_flags: u32,
    pub imm_data: u32,
    /// The `wr` union (RDMA address and rkey, atomic operands, or UD
    /// address handle, remote QPN and QKey), raw.
    pub wr: [u64; 4],
    pub num_sge: usize,
    /// Bytes of an inline send's payload, copied at post time (the
    /// application may reuse the buffer as soon as the post returns).
    pub inline_len: usize,
    /// Whether the device will report a completion for it.
    pub signaled: bool,
    /// Posted by the layer itself (a drain's fence, see
    /// `restart::post_fence`): its completion is never the application's.
    pub internal: bool,
}

/// Outstanding work requests of one queue with their gather lists (and
/// inline payloads) in slabs indexed by ring slot.
pub struct WorkQueue {
    pub ring: Ring<WorkRecord>,
    pub max_sge: usize,
    sges: Vec<ibv_sge>,
    pub max_inline: usize,
    inline: Vec<u8>,
}

impl WorkQueue {
    pub fn new(max_wr: usize, max_sge: usize, max_inline: usize) -> WorkQueue {
        let cap = max_wr.max(1);
        let max_sge = max_sge.max(1);
        WorkQueue {
            ring: Ring::new(cap),
            max_sge,
            sges: vec![ibv_sge::default(); cap * max_sge],
            max_inline,
            inline: vec![0; cap * max_inline],
        }
    }

    /// Records a request; `None` when the queue is full or the request has
    /// more entries than the queue was created for (the device refuses it
    /// too).
    pub fn record(&mut self, rec: WorkRecord, sges: &[ibv_sge], inline: &[u8]) -> Option<()> {
        if sges.len() > self.max_sge || inline.len() > self.max_inline {
            return None;
        }
        let slot = self.ring.push(rec).ok()?;
        self.sges[slot * self.max_sge..slot * self.max_sge + sges.len()].copy_from_slice(sges);
        self.inline[slot * self.max_inline..slot * self.max_inline + inline.len()]
            .copy_from_slice(inline);
        Some(())
    }

    /// The gather list of the `i`-th outstanding request.
    pub fn sges_of(&self, i: usize) -> &[ibv_sge] {
        let slot = self.ring.slot_of(i);
        let n = self.ring.get(i).map_or(0, |r| r.num_sge);
        &self.sges[slot * self.max_sge..slot * self.max_sge + n]
    }

    /// The saved inline payload of the `i`-th outstanding request.
    pub fn inline_of(&self, i: usize) -> &[u8] {
        let slot = self.ring.slot_of(i);
        let n = self.ring.get(i).map_or(0, |r| r.inline_len);
        &self.inline[slot * self.max_inline..slot * self.max_inline + n]
    }

    /// Removes the `i`-th request, moving the gather lists of those behind
    /// it along (shared receive queues complete out of order).
    pub fn remove(&mut self, i: usize) -> Option<WorkRecord> {
        let len = self.ring.len();
        if i >= len {
            return None;
        }
        for k in i..len - 1 {
            let (to, from) = (self.ring.slot_of(k), self.ring.slot_of(k + 1));
            self.sges.copy_within(
                from * self.max_sge..(from + 1) * self.max_sge,
                to * self.max_sge,
            );
            self.inline.copy_within(
                from * self.max_inline..(from + 1) * self.max_inline,
                to * self.max_inline,
            );
        }
        self.ring.remove(i)
    }
}

/// Completions drained from a device CQ, returned by `poll_cq` before
/// the device's own.
pub type CompletionQueue = Ring<ibv_wc>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_order_across_wraps_and_removals() {
        let mut r = Ring::<u32>::new(3);
        for round in 0..5u32 {
            r.push(round * 10).unwrap();
            r.push(round * 10 + 1).unwrap();
            assert_eq!(r.pop_front(), Some(round * 10));
            assert_eq!(r.pop_front(), Some(round * 10 + 1));
        }
        r.push(1).unwrap();
        r.push(2).unwrap();
        r.push(3).unwrap();
        assert!(r.push(4).is_err(), "full");
        assert_eq!(r.remove(1), Some(2));
        assert_eq!(r.pop_back(), Some(3));
        assert_eq!(r.pop_front(), Some(1));
        assert!(r.is_empty());
    }

    #[test]
    fn work_queue_moves_gather_lists_with_their_requests() {
        let mut q = WorkQueue::new(3, 2, 4);
        let sge = |k: u32| ibv_sge {
            addr: u64::from(k),
            length: k,
            lkey: k,
        };
        for id in 0..3u64 {
            let rec = WorkRecord {
                wr_id: id,
                num_sge: 2,
                inline_len: 1,
                ..Default::default()
            };
            let n = u32::try_from(id).unwrap();
            q.record(rec, &[sge(n), sge(n + 100)], &[n as u8]).unwrap();
        }
        assert!(q.record(WorkRecord::default(), &[], &[]).is_none(), "full");
        q.remove(0).unwrap();
        assert_eq!(q.sges_of(0)[1].lkey, 101);
        assert_eq!(q.inline_of(1), &[2]);
        assert!(
            q.record(WorkRecord::default(), &[sge(1); 3], &[]).is_none(),
            "too many entries"
        );
    }
}
