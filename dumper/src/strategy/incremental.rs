//! `--prev` without `--background`: frozen throughout, every chunk the
//! pre-dump holds unchanged taken from it, the rest read from the tree.

use ckpt_image::mm::PageChunk;

use super::frozen::{OneProcess, copy_whole, save_each};
use super::{PageStrategy, PagesJob};
use crate::error::Result;
use crate::{DumpStats, pages, predump};

/// Unchanged chunks from the pre-dump, written ones from the tree.
pub(crate) struct Incremental;

impl PageStrategy for Incremental {
    fn save(&self, job: PagesJob<'_, '_>) -> Result<Vec<Vec<PageChunk>>> {
        save_each(job, copy_reusing)
    }
}

/// Takes what it can of one process from the pre-dump; a process the
/// pre-dump does not hold, or whose writes are not known, is read whole.
fn copy_reusing(one: &OneProcess<'_, '_>, stats: &mut DumpStats) -> Result<Vec<PageChunk>> {
    let c = one.c;
    let before = one
        .opts
        .prev
        .and_then(|prev| Some((prev, prev.process(c.saved_pid)?)));
    let (Some((prev, before)), Some(since)) = (before, &c.written) else {
        return copy_whole(one, stats);
    };
    let sink = pages::Sink::new(one.out, one.opts.compress, c.pages_bytes)?;
    // Frozen throughout: reading a whole chunk from the process is
    // cheaper than patching the stored one.
    let sources = predump::Sources::split(&c.vmas, prev, before, since, one.opts.compress, false);
    let r = predump::copy_pages(&c.mem, &sources, &sink, one.progress)?;
    log::info!(
        "pid {}: {} bytes of pages taken from {}, {} read from the process",
        c.pid,
        r.reused,
        prev.path().display(),
        r.fresh
    );
    *stats.reused_bytes.get_or_insert(0) += r.reused;
    sink.finish()
}
