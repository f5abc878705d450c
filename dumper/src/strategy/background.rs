//! `--background`: private anonymous memory write-protected and the rest
//! saved while frozen, then the tree thawed and the protected memory saved
//! while it runs, still as it was at the freeze (see [`crate::background`]).

use std::time::Instant;

use ckpt_image::mm::PageChunk;

use super::{PageStrategy, PagesJob, page_progress, page_writers, sinks};
use crate::error::{DumpError, Result};
use crate::stats::{ms, ms_since};
use crate::{background, pages};

/// The tree runs while its private memory is saved.
pub(crate) struct Background;

impl PageStrategy for Background {
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
        let on_disk_before = w.written_bytes();
        let writers = page_writers(w, procs, saved)?;
        let sinks = sinks(&writers, procs, opts.compress)?;
        let started = Instant::now();
        let mut guarded = Vec::with_capacity(procs.len());
        let mut frozen_bytes = 0u64;
        for (c, sink) in procs.iter_mut().zip(&sinks) {
            // Armed while collecting (see `collect_process`).
            let split = c.armed.take().ok_or_else(|| DumpError::Unsupported {
                pid: c.pid,
                what: "a background dump without a userfaultfd".into(),
            })?;
            pages::save_chunks(&c.mem, &split.frozen, sink, &|_| {})?;
            frozen_bytes += split.frozen.iter().map(|r| r.len()).sum::<u64>();
            guarded.push(split.guarded);
        }
        log::info!(
            "background: memory write-protected, {frozen_bytes} bytes saved frozen ({:.3} ms)",
            ms_since(started)
        );
        // Nothing else needs the tree stopped: let it run.
        super::before_thaw(opts, procs.first().map_or(0, |c| c.pid))?;
        tree.thaw_early()?;
        log::info!(
            "background: tree running again after {:.3} ms frozen",
            ms(tree.frozen_for())
        );
        let root = procs.first().map_or(0, |c| c.pid);
        let running: Vec<background::Guarded<'_, '_>> = procs
            .iter_mut()
            .zip(&sinks)
            .zip(guarded)
            .filter_map(|((c, sink), chunks)| {
                Some(background::Guarded {
                    uffd: c.uffd.take()?,
                    mem: &c.mem,
                    sink,
                    chunks,
                })
            })
            .collect();
        let progress = page_progress(opts, frozen_bytes, total, root);
        let bg = background::run(&running, &progress)?;
        log::info!(
            "background: {} bytes saved while running, {} chunks first for a waiting writer ({:.3} ms)",
            bg.bytes,
            bg.faults,
            bg.copy_ms
        );
        // Protection off everywhere before anything else can fail.
        drop(running);
        stats.background = Some(bg);
        let blocks = sinks
            .into_iter()
            .map(pages::Sink::finish)
            .collect::<Result<Vec<_>>>()?;
        w.finish_pages_all(writers)?;
        stats.pages_written_bytes += w.written_bytes() - on_disk_before;
        Ok(blocks)
    }
}
