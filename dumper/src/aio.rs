//! aio contexts (`io_setup(2)`): each is a ring the kernel maps into the
//! process (`/[aio] (deleted)`), whose address is the context id. Saved
//! apart from the VMAs: its size, where the program and the kernel are in
//! it, and the completions the program has not reaped yet.
//!
//! A request still in flight cannot be carried over (its buffer and file
//! position are the kernel's), so the dump waits, bounded, for the ring to
//! settle: a request completing meanwhile moves the tail. What the kernel
//! does not show is a request that never completes (a poll of an idle
//! file): restore has no such request.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use ckpt_image::aio::{self, AioEvent, AioRing, header};

use crate::error::{DumpError, Result};
use crate::procfile;

/// One aio ring mapping of the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingSpan {
    /// Its address, the context id.
    pub start: u64,
    /// Where it ends.
    pub end: u64,
}

/// How long completions may keep arriving before the dump gives up.
const SETTLE_BOUND: Duration = Duration::from_secs(2);
/// How long the tail must stay still to count as settled.
const SETTLED_FOR: Duration = Duration::from_millis(50);
/// Between two looks at the tail.
const POLL: Duration = Duration::from_millis(5);

/// The aio rings of the frozen process `pid`, each once its requests in
/// flight have completed.
pub fn collect(pid: i32) -> Result<Vec<AioRing>> {
    let spans = crate::mm::aio_ring_spans(pid)?;
    if spans.is_empty() {
        return Ok(Vec::new());
    }
    let path = procfile::path(pid, "mem");
    let mem = File::open(&path).map_err(|s| procfile::proc_err(pid, path.clone(), s))?;
    let ring = Reader { pid, mem: &mem };
    spans.iter().map(|s| ring.collect(*s)).collect()
}

/// Reads rings through `/proc/PID/mem`.
struct Reader<'a> {
    pid: i32,
    mem: &'a File,
}

/// The header fields the dump uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Positions {
    head: u32,
    tail: u32,
}

impl Reader<'_> {
    fn collect(&self, span: RingSpan) -> Result<AioRing> {
        let ring_len = span.end - span.start;
        let nr = self.word(span, header::NR)?;
        let magic = self.word(span, header::MAGIC)?;
        let header_length = self.word(span, header::HEADER_LENGTH)?;
        if magic != aio::RING_MAGIC
            || u64::from(header_length) != aio::RING_HEADER_LEN
            || u64::from(nr) != aio::slots_in(ring_len)
        {
            return Err(self.refused(
                span,
                format!(
                    "not a ring ckpt knows (magic {magic:#x}, header {header_length} bytes, \
                     {nr} slots in {ring_len:#x} bytes)"
                ),
            ));
        }
        let at = self.settled(span)?;
        if at.head >= nr || at.tail >= nr {
            return Err(self.refused(
                span,
                format!(
                    "head {} or tail {} outside its {nr} slots",
                    at.head, at.tail
                ),
            ));
        }
        let waiting = aio::waiting(nr, at.head, at.tail);
        let events = (0..waiting)
            .map(|i| self.event(span, (at.head + i) % nr))
            .collect::<Result<Vec<_>>>()?;
        log::debug!(
            "pid {}: aio context {:#x}: {nr} slots, head {}, tail {}, {waiting} completions not reaped",
            self.pid,
            span.start,
            at.head,
            at.tail
        );
        Ok(AioRing {
            id: span.start,
            ring_len,
            nr,
            head: at.head,
            tail: at.tail,
            events,
        })
    }

    /// Where the ring is once no completion has arrived for
    /// [`SETTLED_FOR`]; refused if completions still arrive after
    /// [`SETTLE_BOUND`].
    fn settled(&self, span: RingSpan) -> Result<Positions> {
        let started = Instant::now();
        let mut seen = self.positions(span)?;
        let mut still_since = Instant::now();
        while still_since.elapsed() < SETTLED_FOR {
            if started.elapsed() > SETTLE_BOUND {
                return Err(self.refused(
                    span,
                    format!(
                        "requests still completing after {} s",
                        SETTLE_BOUND.as_secs()
                    ),
                ));
            }
            std::thread::sleep(POLL);
            let now = self.positions(span)?;
            if now != seen {
                seen = now;
                still_since = Instant::now();
            }
        }
        Ok(seen)
    }

    fn positions(&self, span: RingSpan) -> Result<Positions> {
        Ok(Positions {
            head: self.word(span, header::HEAD)?,
            tail: self.word(span, header::TAIL)?,
        })
    }

    fn word(&self, span: RingSpan, offset: usize) -> Result<u32> {
        let mut b = [0u8; 4];
        self.read(span, offset as u64, &mut b)?;
        Ok(u32::from_ne_bytes(b))
    }

    fn event(&self, span: RingSpan, slot: u32) -> Result<AioEvent> {
        let mut b = [0u8; aio::EVENT_LEN as usize];
        self.read(span, AioRing::slot_offset(slot), &mut b)?;
        Ok(AioEvent::from_bytes(&b))
    }

    fn read(&self, span: RingSpan, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.mem
            .read_exact_at(buf, span.start + offset)
            .map_err(|s| procfile::proc_err(self.pid, procfile::path(self.pid, "mem"), s))
    }

    fn refused(&self, span: RingSpan, why: String) -> DumpError {
        DumpError::Unsupported {
            pid: self.pid,
            what: format!("aio context {:#x}: {why}", span.start),
        }
    }
}
