//! Freeze a process, collect its state and write a checkpoint image.
//!
//! Data flows one way: **freeze** ([`ckpt_parasite::Tracee::seize`]) →
//! **collect** (parasite for what only the task knows, then /proc, pagemap
//! and ptrace for the rest) → **write** (pages streamed in parallel into the
//! image directory, metadata, then the manifest and an atomic rename).
//!
//! The phases are separate calls so a coordinator can hold a tree frozen
//! while other nodes catch up: [`freeze`] → [`Frozen::drain`] →
//! [`Frozen::write`] → [`Written::resume`] or [`Written::kill`]; [`dump`]
//! runs them in one go.
//!
//! This file holds the phase handles; each phase has its module (`freeze`,
//! `collect`, `write`, `kill`), each way of saving pages its file under
//! `strategy/`, and the phases' helpers theirs (`translate` for the pids
//! an image records, `manifest`, `owner`, `options`, `stats`).
//!
//! The target is never left stopped or changed by a failed dump: the
//! [`ckpt_parasite::Infection`] cures itself, a dropped [`Frozen`] thaws
//! the tree, and the temporary image directory removes itself unless
//! committed. Only after the manifest is durable, and the committed
//! directory is checked to be the one written (see
//! [`ckpt_image::Committed::verify`]), can the tree be killed.

#![warn(missing_docs)]

mod aio;
mod background;
mod blockers;
mod caller;
mod collect;
mod creds;
pub mod error;
pub mod fd;
pub mod features;
mod freeze;
mod held;
mod ib;
mod inherit;
mod ipc;
mod kill;
mod loginuid;
mod manifest;
mod membarrier;
pub mod mm;
mod ns;
mod options;
mod owner;
pub mod pages;
mod pidns;
mod prctl;
mod predump;
mod procfile;
mod sched;
mod seccomp;
mod shapes;
mod shared_tables;
mod shmem;
mod srun_pmix;
mod stats;
mod stopped;
mod strategy;
mod sys;
pub mod task;
mod thread;
mod timer;
mod translate;
mod tree;
mod write;

use std::time::Instant;

use blockers::Blockers;
use ckpt_image::{Committed, ImageKey};

pub use background::BackgroundStats;
pub use error::{Blocker, DumpError, Result};
pub use held::{HeldBuf, HeldMemory};
pub use options::{
    DrainOptions, DumpOptions, FinalState, FreezeOptions, LOG_NAME, NetworkLock, STATS_NAME,
    WriteOptions,
};
pub use predump::Previous;
pub use stats::{DumpReport, DumpStats, PhaseTimes};

/// Dumps a process and all its descendants (with all their threads): the
/// phases [`freeze`] → [`Frozen::drain`] → [`Frozen::write`] →
/// [`Written::resume`] or [`Written::kill`] in one call.
pub fn dump(opts: &DumpOptions<'_>) -> Result<DumpReport> {
    let mut frozen = freeze(opts.pid)?;
    frozen.drain(&opts.drain)?;
    let written = frozen.write(&opts.write)?;
    match opts.final_state {
        FinalState::LeaveRunning => written.resume(),
        FinalState::Kill => written.kill(),
    }
}

/// Freezes `root` and every descendant, each with all its threads. Nothing
/// of the tree runs until the returned [`Frozen`] is resumed, killed or
/// dropped; dropping it (e.g. on any later error) thaws the tree exactly
/// as it was.
pub fn freeze(root: i32) -> Result<Frozen> {
    freeze::tree(root, FreezeOptions::default())
}

/// [`freeze`] with choices about what the checks before the freeze let
/// through.
pub fn freeze_with(root: i32, opts: FreezeOptions) -> Result<Frozen> {
    freeze::tree(root, opts)
}

/// A frozen process tree (phase 1 of a dump).
pub struct Frozen {
    root: i32,
    /// The PID namespace the tree fills.
    ns: pidns::TreeNs,
    /// Tree order: parents before children.
    procs: Vec<tree::FrozenProcess>,
    frozen_at: Instant,
    /// How long freezing took.
    freeze_ms: f64,
    /// What freezing found that cannot be saved (reported with the rest
    /// by [`Frozen::write`]).
    blockers: Blockers,
    /// What the drain chose to save (`None`: not drained yet).
    drain_opts: Option<DrainOptions>,
    /// Established TCP connections in repair mode, once the collection's
    /// parasites are gone.
    tcp: Option<fd::inet::TcpRepair>,
    /// Set when a background dump thawed the tree: how long it was frozen.
    thawed_after: Option<std::time::Duration>,
    /// Trackers of a pre-dump, ended in their processes, closed after the
    /// thaw (closing one walks all the memory it tracked).
    retired: Vec<ckpt_parasite::uffd::Userfault>,
}

impl Frozen {
    /// Pids of every process of the tree, parents first (zombies included).
    pub fn pids(&self) -> Vec<i32> {
        self.procs.iter().map(|p| p.pid).collect()
    }

    /// Drains interconnect state while the whole job is frozen (the place a
    /// coordinator calls between every node's FREEZE and DUMP). For TCP
    /// this chooses which established connections are saved: they go into
    /// repair mode (their queues hold still and can be read without
    /// consuming them) when [`Frozen::write`] reads them, once every
    /// process's parasite is gone, until the tree is thawed, which switches
    /// it off again, or killed, which closes them silently. InfiniBand
    /// state will join here. [`Frozen::write`] drains with the default
    /// options if this was not called.
    pub fn drain(&mut self, opts: &DrainOptions) -> Result<()> {
        self.drain_opts = Some(*opts);
        Ok(())
    }

    /// Collects everything and writes the checkpoint (fsynced, manifest
    /// last, renamed into place). The tree stays frozen; on error it is
    /// thawed unharmed and no directory is left.
    pub fn write(mut self, opts: &WriteOptions<'_>) -> Result<Written> {
        let wrote = write::images(&mut self, opts).map_err(|e| self.explain(e))?;
        Ok(Written {
            frozen: self,
            report: wrote.report,
            committed: wrote.committed,
            ipc: wrote.ipc,
            key: opts.key.clone(),
        })
    }

    /// A pre-dump (`--pre-dump`): leaves write tracking in every process,
    /// lets the tree run again at once, and saves its private memory while
    /// it runs (with [`WriteOptions::prev`], only what changed since that
    /// pre-dump is read from the tree). Not restorable: a later dump with
    /// `--prev` uses it. On error the tree is thawed unharmed.
    pub fn pre_dump(mut self, opts: &WriteOptions<'_>) -> Result<DumpReport> {
        let written = write::pre_dump(&mut self, opts);
        let mut report = written.map_err(|e| self.explain(e))?;
        report.frozen_ms = self.frozen_for().as_millis() as u64;
        Ok(report)
    }
}

/// A frozen tree whose checkpoint is durable (phase 2 of a dump). Dropping
/// it resumes the tree.
pub struct Written {
    frozen: Frozen,
    report: DumpReport,
    committed: Committed,
    key: ImageKey,
    /// The SysV IPC objects saved, removed by [`Written::kill`].
    ipc: ckpt_image::ipc::Ipc,
}

impl Written {
    /// What was written.
    pub fn report(&self) -> &DumpReport {
        &self.report
    }

    /// Lets the tree carry on.
    pub fn resume(mut self) -> Result<DumpReport> {
        self.frozen.thaw()?;
        let r = self.finish();
        self.frozen.retired.clear();
        log::info!(
            "resume: {} processes running again, frozen {:.3} ms",
            r.processes,
            r.stats.frozen_ms
        );
        Ok(r)
    }

    /// Kills the tree, once the committed checkpoint is checked to still be
    /// the one written, complete and sealed (so nothing is lost). If it is
    /// not, the tree is resumed untouched and the error returned.
    pub fn kill(self) -> Result<DumpReport> {
        kill::tree(self)
    }

    fn finish(&mut self) -> DumpReport {
        let mut r = self.report.clone();
        let frozen = self.frozen.frozen_for();
        r.frozen_ms = frozen.as_millis() as u64;
        r.stats.frozen_ms = stats::ms(frozen);
        r
    }
}
