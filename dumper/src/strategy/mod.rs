//! How the pages of a dump are saved: one [`PageStrategy`] per way, each in
//! its own file, chosen from the [`WriteOptions`] by [`choose`]. Every
//! strategy writes one pages file per process in the same format (raw
//! pages at their planned offsets, or LZ4 blocks) and returns the block
//! lists the mm images record; they differ in where the pages come from
//! and in when the tree may run again.
//!
//! - [`frozen`]: everything read from the tree while it is frozen (also a
//!   pre-dump's, read once its tracking is armed and the tree runs).
//! - [`incremental`]: `--prev`: chunks unchanged since the pre-dump taken
//!   from it, the rest read from the frozen tree.
//! - [`background`]: `--background`: private memory write-protected, the
//!   tree thawed, that memory saved while it runs.
//! - [`background_incremental`]: `--prev --background`: only what was
//!   written since the pre-dump read while frozen, the rest copied from
//!   the pre-dump while the tree runs.
//!
//! A new strategy is a new file here implementing [`PageStrategy`], and a
//! line in [`choose`].

mod background;
mod background_incremental;
mod frozen;
mod incremental;

use ckpt_image::ImageWriter;
use ckpt_image::mm::PageChunk;

use crate::collect::Collected;
use crate::error::Result;
use crate::pages;
use crate::{DumpStats, Frozen, WriteOptions};

// The restorer bounds every LZ4 block by this limit before allocating.
const _: () = assert!(pages::CHUNK_BYTES <= ckpt_image::mm::MAX_BLOCK_RAW_LEN);

/// What a strategy saves, into what, and what it reports.
pub(crate) struct PagesJob<'j, 'o> {
    /// The tree, for a strategy that lets it run before every page is
    /// saved.
    pub tree: &'j mut Frozen,
    /// The images being written.
    pub w: &'j mut ImageWriter,
    /// Every live process, with its planned pages.
    pub procs: &'j mut [Collected],
    /// What the dump was asked to do.
    pub opts: &'j WriteOptions<'o>,
    /// Bytes of pages planned in all (for the progress reports).
    pub total: u64,
    /// The dump's figures, to which the strategy adds its own.
    pub stats: &'j mut DumpStats,
    /// The pid an image records for a host pid.
    pub saved: &'j dyn Fn(i32) -> i32,
}

/// One way of saving the pages of every process of a dump.
pub(crate) trait PageStrategy {
    /// Saves every process's pages into its pages file (thawing the tree
    /// if the strategy lets it run before the end). Returns each process's
    /// LZ4 block list (empty for raw pages), in the order of `job.procs`.
    fn save(&self, job: PagesJob<'_, '_>) -> Result<Vec<Vec<PageChunk>>>;
}

/// The strategy `opts` asks for.
pub(crate) fn choose(opts: &WriteOptions<'_>) -> &'static dyn PageStrategy {
    match (opts.background, opts.prev.is_some()) {
        (true, true) => &background_incremental::BackgroundIncremental,
        (true, false) => &background::Background,
        (false, _) => read_all(opts),
    }
}

/// The strategy that reads every page it saves from the tree as it is
/// (frozen, or running after a pre-dump's thaw), taking from `opts.prev`
/// what it can.
pub(crate) fn read_all(opts: &WriteOptions<'_>) -> &'static dyn PageStrategy {
    if opts.prev.is_some() {
        &incremental::Incremental
    } else {
        &frozen::AllFrozen
    }
}

/// Progress of the page copy for the caller, with the fault points tests
/// use to kill ckpt (or `pid`) in the middle of it.
fn page_progress<'a>(
    opts: &'a WriteOptions<'_>,
    base: u64,
    total: u64,
    pid: i32,
) -> impl Fn(u64) + Sync + 'a {
    move |done: u64| {
        ckpt_parasite::fault::inject(ckpt_parasite::fault::FaultPoint::DuringPages);
        ckpt_parasite::fault::kill_target(
            ckpt_parasite::fault::FaultPoint::KillTargetDuringPages,
            pid,
        );
        if let Some(p) = opts.progress {
            p(base + done, total)
        }
    }
}

/// One pages file per process, all open at once (saved in any order).
fn page_writers(
    w: &ImageWriter,
    procs: &[Collected],
    saved: &dyn Fn(i32) -> i32,
) -> Result<Vec<ckpt_image::PagesWriter>> {
    Ok(procs
        .iter()
        .map(|c| w.pages(&ckpt_image::pages_name(saved(c.pid))))
        .collect::<std::result::Result<Vec<_>, _>>()?)
}

/// One sink per process, into its pages file.
fn sinks<'w>(
    writers: &'w [ckpt_image::PagesWriter],
    procs: &[Collected],
    compress: bool,
) -> Result<Vec<pages::Sink<'w>>> {
    writers
        .iter()
        .zip(procs)
        .map(|(pw, c)| pages::Sink::new(pw, compress, c.pages_bytes))
        .collect()
}

/// Asks the caller's [`WriteOptions::before_thaw`] whether the tree of
/// `root` may thaw now (everything frozen is captured).
fn before_thaw(opts: &WriteOptions<'_>, root: i32) -> Result<()> {
    ckpt_parasite::fault::inject(ckpt_parasite::fault::FaultPoint::BeforeThaw);
    match opts.before_thaw {
        Some(gate) => gate().map_err(|reason| crate::DumpError::ThawRefused { pid: root, reason }),
        None => Ok(()),
    }
}
