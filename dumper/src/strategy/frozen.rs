//! Every page read from the tree as it stands, one process after the
//! other: the plain dump (frozen throughout), and a pre-dump's copy once
//! the tree runs again.

use std::time::Instant;

use ckpt_image::PagesWriter;
use ckpt_image::mm::PageChunk;

use super::{PageStrategy, PagesJob, page_progress};
use crate::collect::Collected;
use crate::error::Result;
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
}

/// Copies one process's pages into its pages file, adding to the figures
/// what it reports itself. Returns its LZ4 block list (empty for raw
/// pages).
pub(super) type CopyProcess = fn(&OneProcess<'_, '_>, &mut DumpStats) -> Result<Vec<PageChunk>>;

/// Saves every process's pages with `copy`, one process after the other,
/// syncing the pages files a batch at a time. Returns each one's LZ4 block
/// list (empty for raw pages).
pub(super) fn save_each(job: PagesJob<'_, '_>, copy: CopyProcess) -> Result<Vec<Vec<PageChunk>>> {
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
    let mut written = 0u64;
    // Page files copied but not synced yet: synced (and read back for their
    // checksums) a batch at a time, together.
    let mut unsynced = Vec::new();
    for c in procs.iter() {
        let started = Instant::now();
        let name = ckpt_image::pages_name(saved(c.pid));
        let pw = w.pages(&name)?;
        let progress = page_progress(opts, written, total, c.pid);
        let one = OneProcess {
            c,
            out: &pw,
            opts,
            progress: &progress,
        };
        let blocks = copy(&one, stats)?;
        let on_disk = pw.written();
        stats.pages_written_bytes += on_disk;
        log::info!(
            "write pages pid {}: {} bytes, {on_disk} on disk ({:.3} ms)",
            c.pid,
            c.pages_bytes,
            ms_since(started)
        );
        unsynced.push(pw);
        if unsynced.len() >= SYNC_BATCH {
            w.finish_pages_all(std::mem::take(&mut unsynced))?;
        }
        written += c.pages_bytes;
        out.push(blocks);
    }
    w.finish_pages_all(unsynced)?;
    Ok(out)
}

/// Reads every planned page of the process.
pub(super) fn copy_whole(one: &OneProcess<'_, '_>, _: &mut DumpStats) -> Result<Vec<PageChunk>> {
    let c = one.c;
    if one.opts.compress {
        pages::copy_pages_compressed(&c.mem, &c.vmas, one.out, one.progress)
    } else {
        pages::copy_pages(&c.mem, &c.vmas, one.out, one.progress)?;
        Ok(Vec::new())
    }
}
