//! `--background` with `--prev`: only the chunks written since the
//! pre-dump are read while the tree is frozen; it then runs while the rest
//! is copied from the pre-dump (that data no longer depends on the tree,
//! so nothing needs write protection).
//!
//! Chunks with a few pages written since are patched (only those pages
//! read while frozen) as long as what is read fits in memory; else every
//! written chunk is read whole and saved while frozen.

use std::time::Instant;

use ckpt_image::mm::{PageChunk, PageRange};

use super::{PageStrategy, PagesJob, page_progress, page_writers, sinks};
use crate::collect::Collected;
use crate::error::Result;
use crate::held::{self, HeldBuf, HeldMemory};
use crate::stats::{ms, ms_since};
use crate::{WriteOptions, pages, predump};

/// Only what was written since the pre-dump read frozen.
pub(crate) struct BackgroundIncremental;

impl PageStrategy for BackgroundIncremental {
    fn save(&self, job: PagesJob<'_, '_>) -> Result<Vec<Vec<PageChunk>>> {
        let PagesJob {
            tree,
            w,
            procs,
            opts,
            total,
            stats,
            saved,
        } = job;
        let procs: &[Collected] = procs;
        let on_disk_before = w.written_bytes();
        let started = Instant::now();
        let writers = page_writers(w, procs, saved)?;
        let sinks = sinks(&writers, procs, opts.compress)?;
        log::debug!(
            "background: page writers open ({:.3} ms)",
            ms_since(started)
        );
        let plan = Plan::choose(procs, opts);
        log::debug!("background: planned ({:.3} ms)", ms_since(started));
        let unreserved = HeldMemory::default();
        let memory = opts.held.unwrap_or(&unreserved);
        let frozen = FrozenRead {
            procs,
            sinks: &sinks,
            plan: &plan,
            opts,
            total,
            started,
        };
        let held = frozen.read(memory)?;
        super::before_thaw(opts, procs.first().map_or(0, |c| c.pid))?;
        tree.thaw_early()?;
        log::info!(
            "background: {} bytes written since the pre-dump {}, tree running again after {:.3} ms frozen",
            plan.to_read,
            if plan.hold { "read" } else { "saved" },
            ms(tree.frozen_for())
        );
        if plan.hold {
            log::info!(
                "background: {} of them into memory reserved before the freeze",
                memory.used()
            );
            stats.held_reserved_bytes = Some(memory.used() as u64);
        }
        let patched = frozen.put_held(held)?;
        if plan.hold {
            log::info!(
                "background: {patched} bytes of chunks patched with the pages written since"
            );
            stats.patched_bytes = Some(patched);
        }
        let reused = frozen.copy_reused()?;
        log::info!("background: {reused} bytes taken from the pre-dump while running");
        stats.reused_bytes = Some(reused);
        let blocks = sinks
            .into_iter()
            .map(pages::Sink::finish)
            .collect::<Result<Vec<_>>>()?;
        w.finish_pages_all(writers)?;
        stats.pages_written_bytes += w.written_bytes() - on_disk_before;
        Ok(blocks)
    }
}

/// Where each process's pages come from, and how much is read frozen.
struct Plan<'p> {
    /// Per process: what the pre-dump holds of it, if anything.
    sources: Vec<Option<predump::Sources<'p>>>,
    /// Per process: the chunks read whole from it.
    fresh: Vec<Vec<PageRange>>,
    /// Bytes read from the tree while frozen.
    to_read: u64,
    /// What is read frozen is held in memory and written once the tree
    /// runs (else it is written while frozen).
    hold: bool,
}

impl<'p> Plan<'p> {
    /// Patches chunks if what is then read fits in memory, else reads
    /// every written chunk whole.
    fn choose(procs: &'p [Collected], opts: &WriteOptions<'p>) -> Plan<'p> {
        let patching = Plan::split(procs, opts, true);
        if patching.to_read <= held::HELD_FRESH_BYTES {
            return patching;
        }
        Plan::split(procs, opts, false)
    }

    /// Splits every process's chunks by where they come from, patching
    /// with `patch`.
    fn split(procs: &'p [Collected], opts: &WriteOptions<'p>, patch: bool) -> Plan<'p> {
        let sources: Vec<Option<predump::Sources<'p>>> = procs
            .iter()
            .map(|c| {
                opts.prev.zip(c.written.as_ref()).and_then(|(prev, since)| {
                    let before = prev.process(c.saved_pid)?;
                    Some(predump::Sources::split(
                        &c.vmas,
                        prev,
                        before,
                        since,
                        opts.compress,
                        patch,
                    ))
                })
            })
            .collect();
        let fresh: Vec<Vec<PageRange>> = procs
            .iter()
            .zip(&sources)
            .map(|(c, split)| match split {
                Some(s) => s.fresh.clone(),
                None => pages::split(c.vmas.iter().flat_map(|v| v.pages.iter())),
            })
            .collect();
        let to_read = fresh.iter().flatten().map(PageRange::len).sum::<u64>()
            + sources
                .iter()
                .flatten()
                .flat_map(|s| s.patched.iter())
                .map(predump::Patch::written_bytes)
                .sum::<u64>();
        Plan {
            sources,
            fresh,
            to_read,
            hold: patch,
        }
    }
}

/// What one process's frozen read left in memory, to be written once the
/// tree runs.
struct Held<'m> {
    /// Its fresh chunks, read whole.
    read: pages::ReadChunks<'m>,
    /// The written pages of its patched chunks.
    patches: Vec<HeldBuf<'m>>,
}

/// The pages of a plan, and where they go.
struct FrozenRead<'a, 'o, 'w, 'p> {
    procs: &'a [Collected],
    sinks: &'a [pages::Sink<'w>],
    plan: &'a Plan<'p>,
    opts: &'a WriteOptions<'o>,
    total: u64,
    started: Instant,
}

impl FrozenRead<'_, '_, '_, '_> {
    /// While frozen: reads what the plan says into `memory` (held), or
    /// saves it (not held, nothing is returned).
    fn read<'m>(&self, memory: &'m HeldMemory) -> Result<Vec<Held<'m>>> {
        let plan = self.plan;
        let mut held = Vec::with_capacity(self.procs.len());
        let mut saved_bytes = 0;
        for (((c, sink), split), chunks) in self
            .procs
            .iter()
            .zip(self.sinks)
            .zip(&plan.sources)
            .zip(&plan.fresh)
        {
            if plan.hold {
                let patches = match split {
                    Some(s) => s.read_patches(&c.mem, memory)?,
                    None => Vec::new(),
                };
                log::debug!(
                    "background: pid {} patches read ({:.3} ms)",
                    c.pid,
                    ms_since(self.started)
                );
                let read = pages::read_chunks(&c.mem, chunks, memory)?;
                held.push(Held { read, patches });
                log::debug!(
                    "background: pid {} chunks read ({:.3} ms)",
                    c.pid,
                    ms_since(self.started)
                );
            } else {
                let progress = page_progress(self.opts, saved_bytes, self.total, c.pid);
                pages::save_chunks(&c.mem, chunks, sink, &progress)?;
            }
            saved_bytes += chunks.iter().map(PageRange::len).sum::<u64>();
        }
        Ok(held)
    }

    /// With the tree running: writes what was held, patching chunks with
    /// their written pages. Returns the bytes of chunks patched.
    fn put_held(&self, held: Vec<Held<'_>>) -> Result<u64> {
        let (opts, total) = (self.opts, self.total);
        let mut patched = 0;
        let mut put_bytes = 0;
        for ((((c, sink), split), chunks), h) in self
            .procs
            .iter()
            .zip(self.sinks)
            .zip(&self.plan.sources)
            .zip(&self.plan.fresh)
            .zip(held)
        {
            pages::put_read(h.read, sink, &page_progress(opts, put_bytes, total, c.pid))?;
            put_bytes += chunks.iter().map(PageRange::len).sum::<u64>();
            if let Some(s) = split {
                let progress = page_progress(opts, put_bytes, total, c.pid);
                s.put_patches(h.patches, sink, &progress)?;
                patched += s.patched_bytes();
                put_bytes += s.patched_bytes();
            }
        }
        Ok(patched)
    }

    /// With the tree running: copies every chunk the pre-dump holds
    /// unchanged. Returns the bytes copied.
    fn copy_reused(&self) -> Result<u64> {
        let root = self.procs.first().map_or(0, |c| c.pid);
        let mut reused = 0;
        for (split, sink) in self.plan.sources.iter().zip(self.sinks) {
            if let Some(s) = split {
                let progress =
                    page_progress(self.opts, self.plan.to_read + reused, self.total, root);
                s.copy_reused(sink, &progress)?;
                reused += s.reused_bytes();
            }
        }
        Ok(reused)
    }
}
