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

use ckpt_parasite::{Infection, ParasiteError};

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

/// How long the dump watches a ring for completions still arriving.
#[derive(Debug, Clone, Copy)]
struct Settle {
    /// How long completions may keep arriving before the dump gives up.
    bound: Duration,
    /// How long the positions must stay still to count as settled.
    still_for: Duration,
    /// Between two looks at them.
    poll: Duration,
}

const SETTLE: Settle = Settle {
    bound: Duration::from_secs(2),
    still_for: Duration::from_millis(50),
    poll: Duration::from_millis(5),
};

/// Refuses a ring the process maps without owning its context: a child
/// forked after `io_setup` inherits the mapping, never the context, and
/// restore could only give it one of its own. Asked inside the process:
/// `io_getevents` for no event fails with EINVAL on a context of another
/// process and reaps nothing on its own.
pub fn check_owned(inf: &Infection<'_>, pid: i32) -> Result<()> {
    for span in crate::mm::aio_ring_spans(pid)? {
        match inf.syscall(
            "io_getevents (aio context probe)",
            libc::SYS_io_getevents,
            [span.start, 0, 0, 0, 0, 0],
        ) {
            Ok(_) => {}
            Err(ParasiteError::RemoteSyscall {
                errno: nix::errno::Errno::EINVAL,
                ..
            }) => {
                return Err(DumpError::Unsupported {
                    pid,
                    what: format!(
                        "aio context {:#x}: ring inherited from a parent, which owns the context",
                        span.start
                    ),
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

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

/// Why a ring did not settle.
enum Unsettled {
    /// Reading it failed.
    Read(DumpError),
    /// Completions still arrived after the bound.
    StillCompleting(Duration),
}

impl Unsettled {
    fn into_dump_error(self, refused: impl FnOnce(String) -> DumpError) -> DumpError {
        match self {
            Unsettled::Read(e) => e,
            Unsettled::StillCompleting(bound) => refused(format!(
                "requests still in flight after {} ms",
                bound.as_millis()
            )),
        }
    }
}

/// The positions `look` reports once they have stayed the same for
/// `s.still_for`, or [`Unsettled::StillCompleting`] if they still move
/// after `s.bound`: completions of requests in flight move the tail.
fn settled(
    s: Settle,
    mut look: impl FnMut() -> Result<Positions>,
) -> std::result::Result<Positions, Unsettled> {
    let started = Instant::now();
    let mut seen = look().map_err(Unsettled::Read)?;
    let mut still_since = Instant::now();
    while still_since.elapsed() < s.still_for {
        if started.elapsed() > s.bound {
            return Err(Unsettled::StillCompleting(s.bound));
        }
        std::thread::sleep(s.poll);
        let now = look().map_err(Unsettled::Read)?;
        if now != seen {
            seen = now;
            still_since = Instant::now();
        }
    }
    Ok(seen)
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

    /// Where the ring is once it has settled (see [`settled`]).
    fn settled(&self, span: RingSpan) -> Result<Positions> {
        settled(SETTLE, || self.positions(span))
            .map_err(|e| e.into_dump_error(|why| self.refused(span, why)))
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

#[cfg(test)]
mod tests {
    use super::*;

    const QUICK: Settle = Settle {
        bound: Duration::from_millis(100),
        still_for: Duration::from_millis(10),
        poll: Duration::from_millis(1),
    };

    #[test]
    fn a_ring_is_taken_once_its_completions_stop() {
        let mut tail = 0;
        let at = settled(QUICK, || {
            tail = (tail + 1).min(3);
            Ok(Positions { head: 0, tail })
        });
        assert!(matches!(at, Ok(Positions { head: 0, tail: 3 })));
    }

    #[test]
    fn a_ring_still_completing_is_refused_naming_pid_and_context() {
        let mut tail = 0;
        let err = settled(QUICK, || {
            tail += 1;
            Ok(Positions { head: 0, tail })
        })
        .expect_err("never settles");
        let r = Reader {
            pid: 42,
            mem: &File::open("/dev/null").unwrap(),
        };
        let span = RingSpan {
            start: 0x7f00_0000_0000,
            end: 0x7f00_0000_3000,
        };
        let msg = err.into_dump_error(|why| r.refused(span, why)).to_string();
        assert!(
            msg.contains("42") && msg.contains("aio context 0x7f0000000000"),
            "{msg}"
        );
        assert!(msg.contains("in flight"), "{msg}");
    }
}
