//! Every page read from the tree as it stands, several processes at a
//! time: the plain dump (frozen throughout), and a pre-dump's copy once
//! the tree runs again.

use std::time::Instant;

use ckpt_image::PagesWriter;
use ckpt_image::mm::PageChunk;

use super::{PageStrategy, PagesJob, page_progress};
use crate::collect::Collected;
use crate::error::Result;
use crate::pages::BufferPool;
use crate::stats::ms_since;
use crate::{DumpStats, WriteOptions, pages};

/// Page files synced together at most (each holds an fd until then).
const SYNC_BATCH: usize = 64;

/// Everything read from the tree.
pub(crate) struct AllFrozen;

impl PageStrategy for AllFrozen {
    fn save(&self, job: PagesJob<'_, '_>) -> Result<Vec<Vec<PageChunk>>> {
        save_each(job, copy_whole)
    }
}

/// One process's pages to copy, and where to.
pub(super) struct OneProcess<'a, 'o> {
    /// The process, with its planned pages.
    pub c: &'a Collected,
    /// Its pages file.
    pub out: &'a PagesWriter,
    /// What the dump was asked to do.
    pub opts: &'a WriteOptions<'o>,
    /// Reports the bytes of this process copied so far.
    pub progress: &'a (dyn Fn(u64) + Sync),
    /// Compression buffers, shared by the processes copied at once.
    pub pool: &'a BufferPool,
}

/// Copies one process's pages into its pages file, adding to the figures
/// what it reports itself. Returns its LZ4 block list (empty for raw
/// pages).
pub(super) type CopyProcess = fn(&OneProcess<'_, '_>, &mut DumpStats) -> Result<Vec<PageChunk>>;

/// Saves every process's pages with `copy`, several processes at once on
/// the pool's threads (a tree of small processes is mostly per-process
/// work: reading, compressing, hashing), syncing the pages files a batch
/// at a time. Returns each one's LZ4 block list (empty for raw pages), in
/// the order of `procs`.
pub(super) fn save_each(job: PagesJob<'_, '_>, copy: CopyProcess) -> Result<Vec<Vec<PageChunk>>> {
    use rayon::prelude::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    let PagesJob {
        w,
        procs,
        opts,
        total,
        stats,
        saved,
        ..
    } = job;
    let mut out = Vec::with_capacity(procs.len());
    // Bytes copied so far over all processes, for the progress line.
    let copied = AtomicU64::new(0);
    // Kept from one process to the next: most processes of a large tree
    // are small, and buffers of their own were mostly fresh zeroed memory.
    let pool = BufferPool::default();
    // Page files are copied a batch at a time, then synced (and read back
    // for their checksums) together.
    for batch in procs.chunks(SYNC_BATCH) {
        let names: Vec<String> = batch
            .iter()
            .map(|c| ckpt_image::pages_name(saved(c.pid)))
            .collect();
        let done = batch
            .par_iter()
            .zip(&names)
            .map(|(c, name)| -> Result<CopiedProcess> {
                let started = Instant::now();
                let pw = w.pages(name)?;
                let report = page_progress(opts, 0, total, c.pid);
                let mine = AtomicU64::new(0);
                let progress = |done: u64| {
                    let delta = done.saturating_sub(mine.swap(done, Ordering::Relaxed));
                    report(copied.fetch_add(delta, Ordering::Relaxed) + delta);
                };
                let one = OneProcess {
                    c,
                    out: &pw,
                    opts,
                    progress: &progress,
                    pool: &pool,
                };
                let mut own = DumpStats::default();
                let blocks = copy(&one, &mut own)?;
                log::info!(
                    "write pages pid {}: {} bytes, {} on disk ({:.3} ms)",
                    c.pid,
                    c.pages_bytes,
                    pw.written(),
                    ms_since(started)
                );
                Ok(CopiedProcess {
                    pages: pw,
                    blocks,
                    reused_bytes: own.reused_bytes,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut unsynced = Vec::with_capacity(done.len());
        for d in done {
            stats.pages_written_bytes += d.pages.written();
            if let Some(r) = d.reused_bytes {
                *stats.reused_bytes.get_or_insert(0) += r;
            }
            unsynced.push(d.pages);
            out.push(d.blocks);
        }
        w.finish_pages_all(unsynced)?;
    }
    Ok(out)
}

/// One process's pages, copied and not synced yet.
struct CopiedProcess {
    pages: PagesWriter,
    blocks: Vec<PageChunk>,
    /// What a copy from a pre-dump took from it (the only figure a
    /// [`CopyProcess`] adds).
    reused_bytes: Option<u64>,
}

/// Reads every planned page of the process.
pub(super) fn copy_whole(one: &OneProcess<'_, '_>, _: &mut DumpStats) -> Result<Vec<PageChunk>> {
    let c = one.c;
    if one.opts.compress {
        pages::copy_pages_compressed(&c.mem, &c.vmas, one.out, one.pool, one.progress)
    } else {
        pages::copy_pages(&c.mem, &c.vmas, one.out, one.progress)?;
        Ok(Vec::new())
    }
}
