//! `ckpt dump --background`: a short freeze, and the private memory saved
//! while the job runs, still exactly as it was at the freeze.
//!
//! While the tree is frozen, each process's private anonymous memory is
//! write-protected through a userfaultfd ckpt holds (made inside the
//! process, see `ckpt_parasite::uffd`); everything else (registers, fds,
//! shared memory, private file mappings, which userfaultfd cannot protect)
//! is saved frozen as always. Then the tree runs. ckpt copies the protected
//! chunks in the background and lifts the protection of each one right
//! after reading it. A thread writing to a chunk not saved yet stops in the
//! kernel until ckpt has read that chunk (first, ahead of the rest) and
//! lifted its protection. So every chunk is read before anything changed
//! it: the image is the memory of the freeze instant. QEMU's background
//! snapshots keep guest RAM consistent the same way.
//!
//! What write protection cannot hold back is memory the job gives up:
//! `munmap`, `madvise(MADV_DONTNEED)` and `mremap` of a chunk not saved yet
//! lose or move its freeze-time contents. The userfaultfd reports each
//! (the caller waits until ckpt has read the report); one that touches an
//! unsaved chunk fails the dump with an error naming the range, and the job
//! goes on unharmed. If ckpt dies, the kernel drops the protection with the
//! last reference to the userfaultfd and wakes every waiting thread.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::time::Instant;

use ckpt_image::mm::{PageRange, Vma, VmaKind};
use ckpt_parasite::uffd::{Applied, Event, Features, RegisterMode, Userfault};
use rayon::prelude::*;
use std::collections::VecDeque;

use crate::error::{DumpError, Result};
use crate::pages::{self, CHUNK_BYTES, Memory, Sink};

/// What the userfaultfd reports: protected writes, and memory the job
/// gives up.
fn features() -> Features {
    Features::PAGEFAULT_FLAG_WP
        .with(Features::EVENT_REMOVE)
        .with(Features::EVENT_UNMAP)
        .with(Features::EVENT_REMAP)
}

/// One process's pages, split by when they are saved.
pub struct Split {
    /// Chunks saved while the tree is frozen.
    pub frozen: Vec<PageRange>,
    /// Chunks write-protected, saved while the tree runs.
    pub guarded: Vec<PageRange>,
}

/// Write-protects what can be of the planned pages of `vmas` and returns
/// the chunks, split by when they are saved. Private anonymous memory is
/// protected (the only private kind userfaultfd protects); a VMA whose
/// registration the kernel refuses is saved frozen instead.
pub fn arm(uffd: &Userfault, vmas: &[Vma]) -> Result<Split> {
    uffd.enable(features())?;
    let with_pages = || vmas.iter().filter(|v| !v.pages.is_empty());
    let registered: Vec<bool> = with_pages()
        .map(|v| {
            VmaKind::try_from(v.kind) == Ok(VmaKind::Anon)
                && uffd
                    .register(v.start, v.end - v.start, RegisterMode::WriteProtect)
                    .inspect_err(|e| not_guarded(uffd, v, e))
                    .is_ok()
        })
        .collect();
    // Protecting walks every page table entry: the saved ranges in pieces
    // on every core (the kernel takes the address space lock shared).
    let pieces: Vec<(usize, u64, u64)> = with_pages()
        .zip(&registered)
        .enumerate()
        .filter(|(_, (_, r))| **r)
        .flat_map(|(i, (v, _))| {
            v.pages.iter().flat_map(move |r| {
                (0..r.len().div_ceil(PROTECT_PIECE)).map(move |k| {
                    let at = r.addr + k * PROTECT_PIECE;
                    (i, at, PROTECT_PIECE.min(r.addr + r.len() - at))
                })
            })
        })
        .collect();
    let failed: Vec<usize> = pieces
        .par_iter()
        .filter_map(|&(i, at, len)| match uffd.write_protect(at, len, true) {
            Ok(Applied::Done) => None,
            // Nothing changes a frozen tree's memory, so not expected;
            // the VMA is then simply saved frozen.
            Ok(Applied::Busy) => Some(i),
            Err(e) => {
                log::debug!("pid {}: {at:#x}+{len:#x} not protected: {e}", uffd.pid());
                Some(i)
            }
        })
        .collect();
    let mut frozen = Vec::new();
    let mut guarded = Vec::new();
    for (i, (v, registered)) in with_pages().zip(registered).enumerate() {
        let protected = registered && !failed.contains(&i);
        if registered && !protected {
            // Unregistering also lifts what protection was set.
            let _ = uffd.unregister(v.start, v.end - v.start);
        }
        let into = if protected { &mut guarded } else { &mut frozen };
        into.extend(pages::split(&v.pages));
    }
    Ok(Split { frozen, guarded })
}

/// Bytes write-protected by one call while arming.
const PROTECT_PIECE: u64 = 64 << 20;

fn not_guarded(uffd: &Userfault, v: &Vma, e: &ckpt_parasite::ParasiteError) {
    log::debug!(
        "pid {}: VMA {:#x}-{:#x} saved frozen: {e}",
        uffd.pid(),
        v.start,
        v.end
    );
}

/// A chunk's progress.
const PENDING: u8 = 0;
/// Someone is reading it; its protection is lifted once read.
const READING: u8 = 1;
/// Read and unprotected.
const SAVED: u8 = 2;

/// One running process whose guarded chunks are being saved.
pub struct Guarded<'a, 's> {
    /// Its userfaultfd.
    pub uffd: Userfault,
    /// Its memory.
    pub mem: &'a Memory,
    /// Where its chunks go.
    pub sink: &'a Sink<'s>,
    /// The chunks, in address order.
    pub chunks: Vec<PageRange>,
}

/// Figures of the background part of a dump.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct BackgroundStats {
    /// Bytes saved while the tree ran.
    pub bytes: u64,
    /// Chunks saved first because a thread wrote to them.
    pub faults: u64,
    /// How long saving them took, in milliseconds.
    pub copy_ms: f64,
}

/// How long the fault handler waits for a report before it looks whether
/// the copy is over.
const POLL_MS: i32 = 20;
/// How long a copier waits before it retries while the job changes its
/// address space (the handler reads the event meanwhile).
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_micros(100);

/// Saves every guarded chunk of every process while the tree runs, chunks
/// a thread waits for first. `progress` gets bytes saved so far.
pub fn run(procs: &[Guarded<'_, '_>], progress: &(dyn Fn(u64) + Sync)) -> Result<BackgroundStats> {
    let started = Instant::now();
    let states: Vec<Vec<AtomicU8>> = procs
        .iter()
        .map(|p| p.chunks.iter().map(|_| AtomicU8::new(PENDING)).collect())
        .collect();
    let work = Work {
        procs,
        states: &states,
        stop: AtomicBool::new(false),
        faults: AtomicU64::new(0),
        done: AtomicU64::new(0),
        progress,
    };
    let all: Vec<(usize, usize)> = procs
        .iter()
        .enumerate()
        .flat_map(|(p, g)| (0..g.chunks.len()).map(move |i| (p, i)))
        .collect();
    let (swept, handled) = std::thread::scope(|s| {
        let handler = s.spawn(|| work.handle_faults());
        let swept: Result<()> = all.par_iter().try_for_each_init(
            || vec![0u8; CHUNK_BYTES as usize],
            |buf, &(p, i)| {
                if work.stop.load(Ordering::Relaxed) {
                    return Ok(());
                }
                let mut wait = || {
                    // The handler reads the event that holds the address
                    // space; unless it stopped (and this dump with it).
                    std::thread::sleep(BUSY_WAIT);
                    Ok(!work.stop.load(Ordering::Relaxed))
                };
                if work.save(p, i, buf, &mut wait)? {
                    // Only the sweep stops here: the fault handler keeps
                    // serving the running job meanwhile.
                    ckpt_parasite::fault::inject(
                        ckpt_parasite::fault::FaultPoint::DuringBackground,
                    );
                }
                Ok(())
            },
        );
        if swept.is_err() {
            work.stop.store(true, Ordering::Relaxed);
        }
        // Every chunk is claimed by now; the handler finishes the ones it
        // took and stops.
        work.stop.store(true, Ordering::Relaxed);
        let handled = handler
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (swept, handled)
    });
    // The handler's error first: a copier's failed read is often the
    // consequence of the change the handler reports by name.
    handled?;
    swept?;
    Ok(BackgroundStats {
        bytes: work.done.load(Ordering::Relaxed),
        faults: work.faults.load(Ordering::Relaxed),
        copy_ms: crate::stats::ms_since(started),
    })
}

struct Work<'a, 'p, 's> {
    procs: &'a [Guarded<'p, 's>],
    states: &'a [Vec<AtomicU8>],
    stop: AtomicBool,
    faults: AtomicU64,
    done: AtomicU64,
    progress: &'a (dyn Fn(u64) + Sync),
}

impl Work<'_, '_, '_> {
    /// Reads chunk `i` of process `p`, lifts its protection and stores it;
    /// false if someone else had it already. While the job changes its
    /// address space the kernel refuses to lift protections until the
    /// event is read: `busy` is called then, and says whether to retry.
    fn save(
        &self,
        p: usize,
        i: usize,
        buf: &mut [u8],
        busy: &mut dyn FnMut() -> Result<bool>,
    ) -> Result<bool> {
        let g = &self.procs[p];
        let state = &self.states[p][i];
        if state
            .compare_exchange(PENDING, READING, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Ok(false);
        }
        let c = &g.chunks[i];
        let b = &mut buf[..c.len() as usize];
        if let Err(e) = g.mem.read(c.addr, b) {
            return Err(self.vanished(p, c, e));
        }
        // Read: writers may go on (this wakes the ones waiting here).
        while g.uffd.write_protect(c.addr, c.len(), false)? == Applied::Busy {
            if !busy()? {
                return Ok(false);
            }
        }
        state.store(SAVED, Ordering::Release);
        g.sink.put(c, b)?;
        let done = self.done.fetch_add(c.len(), Ordering::Relaxed) + c.len();
        (self.progress)(done);
        Ok(true)
    }

    /// Serves write faults (the chunk first) and watches for memory the job
    /// gives up, until the sweep is over.
    fn handle_faults(&self) -> Result<()> {
        let mut buf = vec![0u8; CHUNK_BYTES as usize];
        let r = self.handle_until_stopped(&mut buf);
        if let Err(e) = &r {
            log::info!("background: stopping: {e}");
            self.stop.store(true, Ordering::Relaxed);
        }
        r
    }

    fn handle_until_stopped(&self, buf: &mut [u8]) -> Result<()> {
        // Faults read while waiting for an address-space change to settle,
        // served next.
        let mut pending: VecDeque<(usize, Event)> = VecDeque::new();
        loop {
            for p in 0..self.procs.len() {
                for e in self.procs[p].uffd.read_events()? {
                    pending.push_back((p, e));
                }
            }
            let any = !pending.is_empty();
            while let Some((p, e)) = pending.pop_front() {
                self.event(p, e, buf, &mut pending)?;
            }
            if self.stop.load(Ordering::Relaxed) && !any {
                return Ok(());
            }
            if !any {
                self.wait_any()?;
            }
        }
    }

    /// While process `p` changes its address space: reads its reports,
    /// settling the changes now and keeping faults for later.
    fn settle(&self, p: usize, pending: &mut VecDeque<(usize, Event)>) -> Result<bool> {
        let events = self.procs[p].uffd.read_events()?;
        if events.is_empty() {
            std::thread::sleep(BUSY_WAIT);
        }
        for e in events {
            match e {
                Event::Fault { .. } => pending.push_back((p, e)),
                other => self.change(p, other)?,
            }
        }
        Ok(true)
    }

    /// Waits (briefly) until some userfaultfd has a report.
    fn wait_any(&self) -> Result<()> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::AsFd;
        let mut fds: Vec<PollFd<'_>> = self
            .procs
            .iter()
            .map(|g| PollFd::new(g.uffd.as_fd(), PollFlags::POLLIN))
            .collect();
        match poll(&mut fds, PollTimeout::from(POLL_MS as u16)) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(()),
            Err(errno) => Err(ckpt_parasite::ParasiteError::Userfault {
                pid: self.procs[0].uffd.pid(),
                what: "poll",
                errno,
            }
            .into()),
        }
    }

    fn event(
        &self,
        p: usize,
        e: Event,
        buf: &mut [u8],
        pending: &mut VecDeque<(usize, Event)>,
    ) -> Result<()> {
        let g = &self.procs[p];
        match e {
            Event::Fault { addr, .. } => {
                let mut busy = || self.settle(p, pending);
                match self.chunk_at(p, addr) {
                    Some(i) => {
                        if self.save(p, i, buf, &mut busy)? {
                            self.faults.fetch_add(1, Ordering::Relaxed);
                        } else if self.states[p][i].load(Ordering::Acquire) == SAVED {
                            // Lifted before the report was read: the
                            // writer may still sleep on it.
                            g.uffd.wake(g.chunks[i].addr, g.chunks[i].len())?;
                        }
                        // READING: the reader lifts the protection and
                        // wakes the writer.
                    }
                    None => {
                        // A protected page the plan does not save (it read
                        // as zeros at the freeze): nothing to keep.
                        let page = addr & !(ckpt_image::PAGE_SIZE - 1);
                        while g.uffd.write_protect(page, ckpt_image::PAGE_SIZE, false)?
                            == Applied::Busy
                        {
                            busy()?;
                        }
                    }
                }
                Ok(())
            }
            other => self.change(p, other),
        }
    }

    /// An address-space change of process `p` (anything but a fault).
    fn change(&self, p: usize, e: Event) -> Result<()> {
        let g = &self.procs[p];
        match e {
            Event::Fault { .. } => Ok(()),
            Event::Remove { start, end } => self.given_up(p, start, end, "dropped (madvise)"),
            Event::Unmap { start, end } => self.given_up(p, start, end, "unmapped"),
            Event::Remap { from, len, .. } => {
                self.given_up(p, from, from.saturating_add(len), "moved (mremap)")
            }
            // Never asked for (no EVENT_FORK): its fd is closed if it comes.
            Event::Fork { ufd } => {
                drop(ckpt_parasite::uffd::Userfault::from_fork(ufd, g.uffd.pid()));
                Ok(())
            }
            Event::Other { code } => {
                log::debug!("pid {}: userfaultfd event {code:#x} ignored", g.uffd.pid());
                Ok(())
            }
        }
    }

    /// The job gave up `[start, end)`: fine if every chunk there is saved.
    fn given_up(&self, p: usize, start: u64, end: u64, how: &'static str) -> Result<()> {
        let g = &self.procs[p];
        let first = g.chunks.partition_point(|c| c.addr + c.len() <= start);
        let lost = g.chunks[first..]
            .iter()
            .zip(&self.states[p][first..])
            .take_while(|(c, _)| c.addr < end)
            .find(|(_, s)| s.load(Ordering::Acquire) != SAVED);
        match lost {
            None => Ok(()),
            Some((c, _)) => Err(DumpError::BackgroundLost {
                pid: g.uffd.pid(),
                start: start.max(c.addr),
                end: end.min(c.addr + c.len()),
                how,
            }),
        }
    }

    /// Why chunk `c` of process `p` could not be read while the job runs:
    /// the process died, or it unmapped the chunk.
    fn vanished(&self, p: usize, c: &PageRange, e: DumpError) -> DumpError {
        let pid = self.procs[p].uffd.pid();
        if crate::tree::is_alive(pid) {
            DumpError::BackgroundLost {
                pid,
                start: c.addr,
                end: c.addr + c.len(),
                how: "unmapped",
            }
        } else {
            DumpError::Exited {
                pid,
                detail: e.to_string(),
            }
        }
    }

    /// The chunk holding `addr`.
    fn chunk_at(&self, p: usize, addr: u64) -> Option<usize> {
        let chunks = &self.procs[p].chunks;
        let i = chunks.partition_point(|c| c.addr + c.len() <= addr);
        chunks.get(i).filter(|c| c.addr <= addr).map(|_| i)
    }
}
