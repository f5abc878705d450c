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
//! The target is never left stopped or changed by a failed dump: the
//! [`ckpt_parasite::Infection`] cures itself, a dropped [`Frozen`] thaws
//! the tree, and the temporary image directory removes itself unless
//! committed. Only after the manifest is durable, and the committed
//! directory is checked to be the one written (see
//! [`ckpt_image::Committed::verify`]), can the tree be killed.

#![warn(missing_docs)]

mod background;
mod blockers;
mod creds;
pub mod error;
mod held;

pub mod fd;
pub mod features;
mod ib;
mod inherit;
mod ipc;
pub mod mm;
mod ns;
pub mod pages;
mod pidns;
mod prctl;
mod predump;
mod procfile;
mod sched;
mod seccomp;
mod shapes;
mod shmem;
mod stopped;
mod sys;
pub mod task;
mod thread;
mod timer;
mod tree;

use std::path::PathBuf;
use std::time::Instant;

use blockers::Blockers;
use ckpt_image::manifest::{Manifest, ProcessEntry};
use ckpt_image::mm::{Mm, PageRange};
use ckpt_image::{Committed, ImageKey, ImageKind, ImageWriter};
use ckpt_parasite::ParasiteError;
use nix::errno::Errno;

pub use background::BackgroundStats;
pub use error::{Blocker, DumpError, Result};
pub use held::{HeldBuf, HeldMemory};
pub use predump::Previous;

/// What happens to the target once its images are complete and synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FinalState {
    /// Detach; the process carries on (the default).
    #[default]
    LeaveRunning,
    /// SIGKILL it.
    Kill,
}

/// Options of a whole dump ([`dump`]).
pub struct DumpOptions<'a> {
    /// The process to dump.
    pub pid: i32,
    /// Where and how to write.
    pub write: WriteOptions<'a>,
    /// What to do with the process afterwards.
    pub final_state: FinalState,
    /// What the drain saves of interconnect state.
    pub drain: DrainOptions,
}

/// Options of [`Frozen::drain`].
#[derive(Debug, Clone, Copy, Default)]
pub struct DrainOptions {
    /// Established TCP connections to a peer outside the tree are saved
    /// too (`ckpt dump --tcp-established`); without it they are refused.
    /// Connections with both ends in the tree are always saved.
    pub tcp_established: bool,
}

/// Options of [`Frozen::write`].
#[derive(Clone)]
pub struct WriteOptions<'a> {
    /// The checkpoint directory to create (must not exist).
    pub dir: PathBuf,
    /// Called with (bytes of page data written, total) while pages are copied.
    pub progress: Option<&'a (dyn Fn(u64, u64) + Sync)>,
    /// Store pages as LZ4 blocks (smaller images of compressible memory;
    /// restore decompresses instead of mapping the file).
    pub compress: bool,
    /// The site's key, which seals the manifest.
    pub key: &'a ImageKey,
    /// The log so far, stored as `dump.log` with the images just before
    /// the commit (so it is listed and sealed like every other file).
    pub log: Option<&'a (dyn Fn() -> Vec<u8> + Sync)>,
    /// Keys of open files the user declared external (`--external`):
    /// `pipe:[INODE]`, `socket:[INODE]` or a path, as `/proc/PID/fd` shows.
    pub externals: &'a [String],
    /// Let the tree run while its private memory is saved
    /// (`--background`): the tree is thawed once the rest is saved and that
    /// memory write-protected, and the image is still the memory of the
    /// freeze instant. [`Written::kill`] is refused after it.
    pub background: bool,
    /// A pre-dump to take unchanged pages from (`--prev`), opened before
    /// the freeze.
    pub prev: Option<&'a Previous>,
    /// Leave write tracking in every process after this (restorable)
    /// dump, as a pre-dump does (`--track`), so that the next dump can
    /// take `--prev` on it: periodic checkpoints, each whole, each saving
    /// only what was written since the one before. Not with `background`
    /// or a kill.
    pub track: bool,
    /// Memory reserved before the freeze for the pages a `--prev
    /// --background` dump reads while frozen ([`HeldMemory::for_dump`]).
    pub held: Option<&'a HeldMemory>,
}

/// Name of the dump's log in the checkpoint directory.
pub const LOG_NAME: &str = "dump.log";
/// Name of the dump's figures ([`DumpStats`] as JSON) in the checkpoint
/// directory.
pub const STATS_NAME: &str = "stats-dump.json";

/// How long each phase of a dump took, in milliseconds.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PhaseTimes {
    /// Seizing and stopping every task of the tree.
    pub freeze_ms: f64,
    /// Reading registers, memory maps, page maps and fds of every process.
    pub collect_ms: f64,
    /// Copying page data into the pages files.
    pub pages_ms: f64,
    /// Writing the metadata images and file contents.
    pub metadata_ms: f64,
    /// Writing the manifest, syncing and renaming into place; unknown when
    /// `stats-dump.json` is written (just before), so only in the report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_ms: Option<f64>,
}

/// The figures of one dump: what `stats-dump.json` holds.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DumpStats {
    /// How long the tree had been frozen, in milliseconds: up to writing
    /// `stats-dump.json` there, up to the resume or kill in the report.
    pub frozen_ms: f64,
    /// Time per phase.
    pub phases: PhaseTimes,
    /// Processes of the tree (zombies included).
    pub processes: usize,
    /// Threads of the live processes (each leader counts as one).
    pub threads: usize,
    /// VMAs saved.
    pub vmas: usize,
    /// Fds saved.
    pub fds: usize,
    /// Bytes of page data planned (the pages that must be saved).
    pub pages_planned_bytes: u64,
    /// Bytes the pages files take on disk (less than planned with
    /// `--compress`).
    pub pages_written_bytes: u64,
    /// Bytes of private and anonymous mappings not saved: never touched,
    /// or file pages never written (restore maps them from the file).
    pub pages_untouched_bytes: u64,
    /// Bytes of every image file written before `stats-dump.json` (pages,
    /// metadata, file contents; not the log, manifest and seal).
    pub disk_bytes: u64,
    /// Planned page bytes per written page byte, with `--compress` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression_ratio: Option<f64>,
    /// With `--background`: what was saved while the tree ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub background: Option<BackgroundStats>,
    /// With `--prev`: bytes of pages taken from the pre-dump (unchanged
    /// since), the rest of `pages_planned_bytes` was read from the tree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reused_bytes: Option<u64>,
    /// With `--prev --background`: bytes of chunks rebuilt from the
    /// pre-dump's block and the few pages written since (only those read
    /// while frozen).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patched_bytes: Option<u64>,
    /// With `--prev --background`: bytes of what was read while frozen
    /// that went into memory reserved and faulted in before the freeze
    /// ([`HeldMemory`]); the rest went into memory allocated while frozen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_reserved_bytes: Option<u64>,
}

/// Milliseconds since `t`, as a fraction (short phases take well under one).
fn ms_since(t: Instant) -> f64 {
    ms(t.elapsed())
}

fn ms(d: std::time::Duration) -> f64 {
    // Microsecond precision is plenty and keeps the JSON short.
    (d.as_secs_f64() * 1e6).round() / 1e3
}

// The restorer bounds every LZ4 block by this limit before allocating.
const _: () = assert!(pages::CHUNK_BYTES <= ckpt_image::mm::MAX_BLOCK_RAW_LEN);

/// What a dump produced.
#[derive(Debug, Clone)]
pub struct DumpReport {
    /// The dumped (root) pid.
    pub pid: i32,
    /// Number of processes in the tree.
    pub processes: usize,
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// Number of VMAs.
    pub vmas: usize,
    /// Bytes of page data saved.
    pub pages_bytes: u64,
    /// Number of fds.
    pub fds: usize,
    /// How long the process was frozen, in milliseconds.
    pub frozen_ms: u64,
    /// Every figure of the dump, phase times included.
    pub stats: DumpStats,
}

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
    if root <= 0 {
        return Err(DumpError::NoProcess { pid: root });
    }
    let frozen_at = Instant::now();
    let mut blockers = Blockers::default();
    log::info!("freeze: pid {root} and its descendants");
    let ns = pidns::of_root(root)?;
    if let pidns::TreeNs::RootInit { .. } = ns {
        log::info!(
            "freeze: pid {root} is PID 1 of its own PID namespace: saving that namespace's pids"
        );
    }
    let procs = tree::freeze(root, |pid| precheck(pid, ns), seize_error, &mut blockers)?;
    ckpt_parasite::fault::inject(ckpt_parasite::fault::FaultPoint::AfterSeize);
    let freeze_ms = ms_since(frozen_at);
    log::info!(
        "freeze: {} processes, {} threads frozen ({freeze_ms:.3} ms)",
        procs.len(),
        procs.iter().map(|p| p.tasks.len()).sum::<usize>()
    );
    Ok(Frozen {
        root,
        ns,
        procs,
        frozen_at,
        freeze_ms,
        blockers,
        drain_opts: None,
        tcp: None,
        thawed_after: None,
        retired: Vec::new(),
    })
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
        let written = write_images(&mut self, opts);
        let (report, committed, ipc) = written.map_err(|e| self.explain(e))?;
        Ok(Written {
            frozen: self,
            report,
            committed,
            ipc,
            key: opts.key.clone(),
        })
    }

    /// A pre-dump (`--pre-dump`): leaves write tracking in every process,
    /// lets the tree run again at once, and saves its private memory while
    /// it runs (with [`WriteOptions::prev`], only what changed since that
    /// pre-dump is read from the tree). Not restorable: a later dump with
    /// `--prev` uses it. On error the tree is thawed unharmed.
    pub fn pre_dump(mut self, opts: &WriteOptions<'_>) -> Result<DumpReport> {
        let written = write_pre_dump(&mut self, opts);
        let mut report = written.map_err(|e| self.explain(e))?;
        report.frozen_ms = self.frozen_for().as_millis() as u64;
        Ok(report)
    }

    /// A process that died while frozen makes whatever touched it next fail
    /// with an obscure error (a short read of its memory, ESRCH from ptrace):
    /// name the death instead.
    fn explain(&self, e: DumpError) -> DumpError {
        let dead = || {
            self.procs
                .iter()
                .filter(|p| p.zombie_status.is_none())
                .find(|p| !tree::is_alive(p.pid))
        };
        // SIGKILL takes a moment to turn a traced task into a zombie; only
        // errors of controlling a task can be that symptom, so only those
        // wait for it.
        let mut died = dead();
        if matches!(e, DumpError::Parasite(_)) {
            for _ in 0..DEATH_SETTLE_POLLS {
                if died.is_some() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
                died = dead();
            }
        }
        match died {
            Some(p) => DumpError::Exited {
                pid: p.pid,
                detail: e.to_string(),
            },
            None => e,
        }
    }

    /// Lets the tree run before the checkpoint is committed (a background
    /// dump or a pre-dump, once what must be saved frozen is), and records
    /// how long it was frozen.
    fn thaw_early(&mut self) -> Result<()> {
        self.thaw()?;
        self.thawed_after = Some(self.frozen_at.elapsed());
        self.retired.clear();
        Ok(())
    }

    /// How long the tree was frozen, or has been so far.
    fn frozen_for(&self) -> std::time::Duration {
        self.thawed_after
            .unwrap_or_else(|| self.frozen_at.elapsed())
    }

    /// Detaches every task, children first so no parent runs while a child
    /// is still stopped.
    fn thaw(&mut self) -> Result<()> {
        // Connections go on where they were before the tree does.
        let mut tcp = self.tcp.take().unwrap_or_default();
        tcp.release();
        let mut first_err = None;
        for p in std::mem::take(&mut self.procs).into_iter().rev() {
            for t in p.tasks {
                if let Err(e) = tcp.detach(p.pid, t) {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = self.thaw();
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
    pub fn kill(mut self) -> Result<DumpReport> {
        if self.frozen.thawed_after.is_some() {
            return Err(DumpError::Unsupported {
                pid: self.report.pid,
                what: "killing a tree after a background dump (it ran on meanwhile)".into(),
            });
        }
        ckpt_parasite::fault::inject(ckpt_parasite::fault::FaultPoint::BeforeKill);
        // Dropping `self` on error resumes the tree.
        self.committed.verify(&self.key)?;
        for pid in self.frozen.procs.iter().map(|p| p.pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        // Children before parents, threads before their leader: a parent
        // (an init above all) finishes dying only after them.
        let tasks: Vec<ckpt_parasite::Tracee> = std::mem::take(&mut self.frozen.procs)
            .into_iter()
            .rev()
            .flat_map(|p| p.tasks.into_iter().rev())
            .collect();
        // "Killed" means past the point of no return, not gone: the kernel
        // then frees the tree's memory on its own (some 50 ms per GiB
        // here), which a restore of the same pids waits for.
        let tids: Vec<i32> = tasks.iter().map(|t| t.pid()).collect();
        wait_exiting(&tids, KILL_SETTLE);
        // Their deaths are ours to collect, as their tracer (until then they
        // stay zombies their parents cannot reap): on another thread, which
        // ends with ckpt if ckpt ends first, when the kernel hands them back
        // to their parents.
        std::thread::spawn(move || {
            let until = Instant::now() + KILL_SETTLE;
            for t in tasks {
                let pid = t.pid();
                if !t.reap_killed(until) {
                    log::warn!("kill: task {pid} has not died after {KILL_SETTLE:?}");
                }
            }
        });
        ipc::remove(self.report.pid, &self.ipc);
        // Closed in repair mode: nothing reaches the peers.
        if let Some(mut tcp) = self.frozen.tcp.take() {
            tcp.abandon();
        }
        let r = self.finish();
        log::info!(
            "kill: {} processes killed, frozen {:.3} ms",
            r.processes,
            r.stats.frozen_ms
        );
        Ok(r)
    }

    fn finish(&mut self) -> DumpReport {
        let mut r = self.report.clone();
        let frozen = self.frozen.frozen_for();
        r.frozen_ms = frozen.as_millis() as u64;
        r.stats.frozen_ms = ms(frozen);
        r
    }
}

/// How long `--kill` waits for the killed processes to finish exiting.
const KILL_SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits (bounded) until every task of `tids` is exiting, a zombie or
/// gone. A task that does not get there in time (asleep where a kill does
/// not wake it) is logged, not an error: the checkpoint is committed and
/// the kill was sent.
fn wait_exiting(tids: &[i32], limit: std::time::Duration) {
    let until = Instant::now() + limit;
    for &tid in tids {
        while !ckpt_parasite::proc_read::leaving(tid) {
            if Instant::now() >= until {
                log::warn!("kill: task {tid} is not exiting after {limit:?}");
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}

/// Everything collected about one frozen process, ready to be written.
struct Collected {
    pid: i32,
    ppid: i32,
    core: ckpt_image::task::Core,
    vmas: Vec<ckpt_image::mm::Vma>,
    vdso: Option<ckpt_image::mm::VdsoInfo>,
    pages_bytes: u64,
    /// Bytes of dumpable VMAs the plan leaves out.
    untouched_bytes: u64,
    /// Its memory, readable after a thaw.
    mem: pages::Memory,
    /// With `--background`: the userfaultfd guarding its memory; with
    /// `--pre-dump` or `--track`: the one tracking its writes from now on.
    uffd: Option<ckpt_parasite::uffd::Userfault>,
    /// With `--pre-dump`: how its writes are tracked from now on.
    tracking: Option<ckpt_image::mm::WriteTracking>,
    /// With `--prev`: what it wrote since the pre-dump.
    written: Option<predump::Written>,
    /// With `--background`: its pages, write-protected or not.
    armed: Option<background::Split>,
    /// With `--prev`: the pre-dump's tracker, ended in the process; ckpt's
    /// copy is closed once the tree runs again.
    retired: Option<ckpt_parasite::uffd::Userfault>,
}

/// What a dump does with userfaultfds in the processes.
#[derive(Clone, Copy)]
enum Userfaults<'a> {
    /// Nothing.
    Untouched,
    /// A background dump's write guard, held by ckpt only.
    Background,
    /// A pre-dump or `--track`: read what was written since the one
    /// before (if any), end its tracking, and track writes from now on
    /// with a new userfaultfd kept in the process.
    Track(&'a WriteOptions<'a>),
    /// A dump after a pre-dump: read what was written, and end the
    /// tracking (the process's userfaultfd is closed).
    Untrack(&'a WriteOptions<'a>),
}

impl Userfaults<'_> {
    fn of<'a>(opts: &'a WriteOptions<'a>) -> Userfaults<'a> {
        // With --prev, a background dump reads only what changed while
        // frozen and needs no write protection.
        if opts.track {
            Userfaults::Track(opts)
        } else if opts.prev.is_some() {
            Userfaults::Untrack(opts)
        } else if opts.background {
            Userfaults::Background
        } else {
            Userfaults::Untouched
        }
    }

    /// The earlier pre-dump's tracking of `pid`.
    fn before(&self, pid: i32) -> Option<&ckpt_image::mm::WriteTracking> {
        match self {
            Userfaults::Track(o) | Userfaults::Untrack(o) => {
                o.prev?.process(pid)?.tracking.as_ref()
            }
            _ => None,
        }
    }
}

fn collect_process(p: &tree::FrozenProcess, mode: Userfaults<'_>) -> Result<Collected> {
    let pid = p.pid;
    let started = Instant::now();
    let leader = &p.tasks[0];
    log::debug!("pid {pid}: thread {pid} (leader)");
    for t in &p.tasks[1..] {
        log::debug!("pid {pid}: thread {}", t.pid());
    }
    let before = mode.before(pid);
    // A pre-dump only copies memory ahead: the verbs state is drained by
    // the dump that follows it.
    let predumping = matches!(mode, Userfaults::Track(_));
    let ib_layer = ib::find(pid)?.filter(|_| !predumping);
    if let Some(l) = &ib_layer {
        ib::quiesce(pid, &p.tasks, p.job_stop.is_some(), l)?;
    }
    let mut ib_state = None;
    let mut uffd = None;
    // The tracking `before` names, ended in the process; its last record
    // of written pages is read before a new tracker is armed.
    let mut continued = None;
    let mut tracking = None;
    let mut with_parasite = |inf: &ckpt_parasite::Infection<'_>| -> Result<()> {
        use ckpt_parasite::uffd;
        // First: the drain changes the process's memory, which everything
        // after it saves.
        if let Some(l) = &ib_layer {
            ib_state = Some(ib::drain(inf, pid, l)?);
        }
        continued = predump::retire(inf, pid, before)?;
        match mode {
            Userfaults::Untouched | Userfaults::Untrack(_) => {}
            Userfaults::Background => uffd = Some(uffd::create_in(inf)?),
            Userfaults::Track(_) => {
                let (u, fd) = uffd::create_kept_in(inf, predump::kept_fd_floor(pid))?;
                let t = ckpt_image::mm::WriteTracking {
                    fd,
                    inode: u.inode()?,
                    start_time: predump::start_time(pid)?,
                };
                predump::record(pid, &t);
                tracking = Some(t);
                uffd = Some(u);
            }
        }
        Ok(())
    };
    let (misc, threads) = task::run_parasite(leader, &p.tasks[1..], &mut with_parasite)?;
    log::debug!("pid {pid}: parasite done ({:.3} ms)", ms_since(started));
    let mut core = task::collect(leader, &misc)?;
    core.job_stop = p.job_stop;
    core.ib = ib_state;
    for (t, state) in p.tasks[1..].iter().zip(threads) {
        core.threads.push(task::collect_thread(t, pid, state)?);
    }
    seccomp::collect(pid, &p.tasks, &mut core)?;
    // smaps is read on another core while the pages are planned and, for
    // a background dump, write-protected: all three walk the page tables
    // of the whole address space, and only smaps' VmFlags are needed.
    let (vmas, pages_bytes, armed) = std::thread::scope(|s| -> Result<_> {
        let flags = s.spawn(|| {
            let f = mm::read_vm_flags(pid);
            log::debug!("pid {pid}: smaps read ({:.3} ms)", ms_since(started));
            f
        });
        let planned = (|| -> Result<_> {
            let mut vmas = mm::collect_vmas_unflagged(pid)?;
            let pages_bytes = mm::plan_pages(pid, &mut vmas)?;
            log::debug!("pid {pid}: pages planned ({:.3} ms)", ms_since(started));
            let armed = match (mode, &uffd) {
                (Userfaults::Background, Some(u)) => Some(background::arm(u, &vmas)?),
                _ => None,
            };
            if armed.is_some() {
                log::debug!("pid {pid}: guard armed ({:.3} ms)", ms_since(started));
            }
            Ok((vmas, pages_bytes, armed))
        })();
        let flags = flags
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        let (mut vmas, pages_bytes, armed) = planned?;
        mm::apply_all_vm_flags(pid, &mut vmas, &flags?)?;
        Ok((vmas, pages_bytes, armed))
    })?;
    let vdso = mm::vdso_info(leader, &vmas)?;
    // Only through a tracking userfaultfd that is still the pre-dump's:
    // without it the written bits would be nobody's (or the job's own
    // userfaultfd's), and everything is read from the process.
    let written = match continued {
        Some(_) => Some(predump::written_since(pid, &vmas)?),
        None => None,
    };
    log::debug!(
        "pid {pid}: written pages scanned ({:.3} ms)",
        ms_since(started)
    );
    // The old tracker's registrations go with its last copy. Closing it
    // clears the protection of every page it tracked, a walk of the whole
    // address space (about 70 ms for 4 GiB): that waits for the thaw,
    // unless a new tracker must register the same VMAs now.
    let retired = match mode {
        Userfaults::Track(_) => {
            drop(continued.take());
            None
        }
        _ => continued.take(),
    };
    if let (Userfaults::Track(_), Some(u)) = (mode, &uffd) {
        predump::arm(u, &vmas)?;
    }
    let mut untouched_bytes = 0;
    for v in &vmas {
        let kind = ckpt_image::mm::VmaKind::try_from(v.kind);
        let saved: u64 = v.pages.iter().map(|r| r.len()).sum();
        if matches!(
            kind,
            Ok(ckpt_image::mm::VmaKind::Anon
                | ckpt_image::mm::VmaKind::FilePrivate
                | ckpt_image::mm::VmaKind::ShmemPrivate)
        ) {
            untouched_bytes += (v.end - v.start).saturating_sub(saved);
        }
        log::debug!(
            "pid {pid}: VMA {:#x}-{:#x} prot {:#x} {} {}: {saved} bytes of pages",
            v.start,
            v.end,
            v.prot,
            kind.map_or_else(|_| "unknown".to_string(), |k| format!("{k:?}")),
            if v.path.is_empty() { "-" } else { &v.path },
        );
    }
    log::info!(
        "collect pid {pid} ({}): {} threads, {} VMAs, {pages_bytes} bytes of pages planned ({:.3} ms)",
        core.comm,
        p.tasks.len(),
        vmas.len(),
        ms_since(started)
    );
    Ok(Collected {
        pid,
        ppid: p.ppid,
        core,
        vmas,
        vdso,
        pages_bytes,
        untouched_bytes,
        mem: pages::Memory::of(leader)?,
        uffd,
        tracking,
        written,
        armed,
        retired,
    })
}

/// Switches the established TCP connections of `procs` that `opts` chose
/// to repair mode. First every running process of the tree is held
/// (`TcpRepair::hold`), so none runs its own code while a connection is in
/// repair mode even if ckpt dies; nothing may run code in the tree from
/// here on (no parasite), which would take the hold.
fn repair_tcp(procs: &[tree::FrozenProcess], opts: DrainOptions) -> Result<fd::inet::TcpRepair> {
    let live: Vec<i32> = procs
        .iter()
        .filter(|p| p.zombie_status.is_none())
        .map(|p| p.pid)
        .collect();
    let running: Vec<&tree::FrozenProcess> = procs
        .iter()
        .filter(|p| p.zombie_status.is_none() && p.job_stop.is_none())
        .collect();
    let running_pids: Vec<i32> = running.iter().map(|p| p.pid).collect();
    let policy = fd::inet::TcpPolicy {
        established: opts.tcp_established,
    };
    let hold = |tcp: &mut fd::inet::TcpRepair| -> Result<()> {
        for p in &running {
            tcp.hold(p.pid, &p.tasks)?;
        }
        Ok(())
    };
    fd::inet::TcpRepair::start(&live, &running_pids, policy, hold)
}

/// Collect, then write: nothing is written before everything is known to
/// be supported.
fn write_images(
    frozen: &mut Frozen,
    opts: &WriteOptions<'_>,
) -> Result<(DumpReport, Committed, ckpt_image::ipc::Ipc)> {
    let root = frozen.root;
    let live: Vec<&tree::FrozenProcess> = frozen
        .procs
        .iter()
        .filter(|p| p.zombie_status.is_none())
        .collect();
    let threads = live.iter().map(|p| p.tasks.len()).sum();
    // Collect everything, gathering what cannot be saved instead of
    // stopping at the first: the user gets the whole list in one run.
    let mut blockers = Blockers::default();
    let mut procs = Vec::new();
    let collect_started = Instant::now();
    for p in &live {
        if let Some(c) = blockers.absorb(collect_process(p, Userfaults::of(opts)))? {
            procs.push(c);
        }
    }
    // Every parasite is gone: the connections may go into repair mode now,
    // with the tree held (their state is read with the files below).
    frozen.tcp = Some(repair_tcp(
        &frozen.procs,
        frozen.drain_opts.unwrap_or_default(),
    )?);
    frozen
        .retired
        .extend(procs.iter_mut().filter_map(|c| c.retired.take()));
    // Each shared memory object once, whoever maps it.
    let mut objects = shmem::Objects::default();
    for c in procs.iter_mut() {
        blockers.absorb(objects.link_vmas(c.pid, &mut c.vmas))?;
    }
    let (relaid, shared) = inherit::share_with_parents(
        &mut procs
            .iter_mut()
            .map(|c| inherit::ProcessVmas {
                pid: c.pid,
                ppid: c.ppid,
                vmas: &mut c.vmas,
            })
            .collect::<Vec<_>>(),
    )?;
    if shared.bytes > 0 {
        log::info!(
            "collect: {} bytes of private memory still shared with a parent since fork, saved once",
            shared.bytes
        );
    }
    for c in procs.iter_mut().filter(|c| relaid.contains(&c.pid)) {
        c.pages_bytes = mm::reassign_offsets(&mut c.vmas);
    }
    let namespaces = blockers
        .absorb(ns::collect(
            root,
            &live.iter().map(|p| p.pid).collect::<Vec<_>>(),
            frozen.ns,
        ))?
        .unwrap_or_default();
    let mut ipc = blockers
        .absorb(namespaces.in_ipc(root, || collect_ipc(root, &procs)))?
        .unwrap_or_default();
    let fds_started = Instant::now();
    // A tracking userfaultfd left in a process is ckpt's, not the job's.
    let kept: std::collections::HashMap<i32, i32> = procs
        .iter()
        .filter_map(|c| Some((c.pid, c.tracking.as_ref()?.fd)))
        .collect();
    let files = namespaces.in_net(root, || {
        fd::collect_tree(
            &procs.iter().map(|c| c.pid).collect::<Vec<_>>(),
            opts.externals,
            &|pid, fd| kept.get(&pid) == Some(&fd),
            &mut blockers,
        )
    })?;
    let mut files = files;
    blockers.absorb(objects.link_files(&mut files))?;
    blockers.absorb(shapes::check(
        &procs
            .iter()
            .map(|c| shapes::Member {
                pid: c.pid,
                ppid: c.ppid,
                sid: c.core.sid,
                pgid: c.core.pgid,
            })
            .collect::<Vec<_>>(),
        &frozen.procs,
    ))?;
    // From here on the image speaks the tree namespace's pids; the host's
    // stay in `procs`, `frozen` and `live` for reading the processes.
    let pids = match frozen.ns {
        pidns::TreeNs::Ckpt => None,
        pidns::TreeNs::RootInit { .. } => {
            let map = pidns::PidMap::read(&frozen.procs)?;
            blockers.absorb(translate_pids(&map, &mut procs, &mut files, &mut ipc))?;
            Some(map)
        }
    };
    let saved = |host: i32| SavedPids(pids.as_ref()).pid(host);
    let saved_ppid = |host: i32| SavedPids(pids.as_ref()).ppid(host);
    let fds: usize = files.tables.iter().map(|(_, t)| t.fds.len()).sum();
    log::info!(
        "collect fds: {fds} fds, {} open files ({:.3} ms)",
        files.files.files.len(),
        ms_since(fds_started)
    );
    let mut all = frozen.blockers.clone();
    all.extend(blockers);
    all.into_result()?;

    let total: u64 = procs.iter().map(|c| c.pages_bytes).sum();
    let mut stats = DumpStats {
        phases: PhaseTimes {
            freeze_ms: frozen.freeze_ms,
            collect_ms: ms_since(collect_started),
            ..PhaseTimes::default()
        },
        processes: frozen.procs.len(),
        threads,
        fds,
        pages_planned_bytes: total,
        pages_untouched_bytes: procs.iter().map(|c| c.untouched_bytes).sum(),
        ..DumpStats::default()
    };
    let write_started = Instant::now();
    let mut w = ImageWriter::create(&opts.dir)?;
    log::info!("write: into {}", w.tmp_dir().display());
    let mut report = DumpReport {
        pid: root,
        dir: opts.dir.clone(),
        processes: frozen.procs.len(),
        vmas: 0,
        pages_bytes: total,
        fds,
        frozen_ms: 0,
        stats: DumpStats::default(),
    };
    for (pid, table) in &files.tables {
        w.write_meta(&ckpt_image::fds_name(*pid), ImageKind::FdTable, table)?;
    }
    w.write_meta(ckpt_image::FILES_NAME, ImageKind::Files, &files.files)?;
    // Shared memory before private pages: a background dump reads it while
    // the tree is still frozen.
    let shmem_started = Instant::now();
    let shmem_bytes = objects.data_bytes();
    objects.write(&mut w)?;
    log::info!(
        "write shared memory: {shmem_bytes} bytes ({:.3} ms)",
        ms_since(shmem_started)
    );
    for b in files.blobs.iter() {
        w.write_raw(&b.name, &b.data)?;
    }
    if !ipc.is_empty() {
        let ipc_started = Instant::now();
        let bytes = namespaces.in_ipc(root, || ipc::write(root, &mut w, &mut ipc))?;
        log::info!(
            "write ipc: {} segments ({bytes} bytes), {} semaphore sets, {} message queues ({:.3} ms)",
            ipc.shm.len(),
            ipc.sem.len(),
            ipc.msg.len(),
            ms_since(ipc_started)
        );
    }
    // Zombies come last: their parents are all listed by then. Read now,
    // while the tree is frozen.
    let mut zombies = Vec::new();
    for z in frozen.procs.iter().filter(|p| p.zombie_status.is_some()) {
        let owner = owner(z.pid)?;
        zombies.push(ProcessEntry {
            pid: saved(z.pid),
            ppid: saved_ppid(z.ppid),
            comm: procfile::read(z.pid, "comm")
                .map(|c| c.trim_end().to_string())
                .unwrap_or_default(),
            zombie_status: z.zombie_status,
            uids: owner.uids,
            gids: owner.gids,
            zombie_ids: Some(shapes::zombie_ids(z.pid, saved)?),
        });
    }
    let mut owners = Vec::with_capacity(procs.len());
    for c in &procs {
        owners.push(owner(c.pid)?);
    }

    let pages_started = Instant::now();
    let saved_pages = if opts.background && opts.prev.is_some() {
        thawing_incremental_pages(frozen, &mut w, &procs, opts, total, &mut stats, &saved)?
    } else if opts.background {
        background_pages(frozen, &mut w, &mut procs, opts, total, &mut stats, &saved)?
    } else {
        frozen_pages(&mut w, &procs, opts, total, &mut stats, &saved)?
    };
    let pages_time = pages_started.elapsed();
    let mut entries = Vec::new();
    let mut cores = Vec::new();
    for ((c, blocks), owner) in procs.into_iter().zip(saved_pages).zip(owners) {
        report.vmas += c.vmas.len();
        let mm = Mm {
            vmas: c.vmas,
            vdso: c.vdso,
            pages_bytes: c.pages_bytes,
            compressed: opts.compress,
            chunks: blocks,
            tracking: c.tracking,
        };
        w.write_meta(&ckpt_image::mm_name(saved(c.pid)), ImageKind::Mm, &mm)?;
        w.write_meta(
            &ckpt_image::core_name(saved(c.pid)),
            ImageKind::Core,
            &c.core,
        )?;
        entries.push(ProcessEntry {
            pid: saved(c.pid),
            ppid: saved_ppid(c.ppid),
            comm: c.core.comm.clone(),
            zombie_status: None,
            uids: owner.uids,
            gids: owner.gids,
            zombie_ids: None,
        });
        cores.push(c.core);
    }
    entries.extend(zombies);
    let mut manifest = manifest(root, entries, &cores[0])?;
    if pids.is_some() {
        manifest.root_pid = saved(root);
        manifest.pid_namespace = Some(ckpt_image::manifest::PidNamespace {
            root_host_pid: root,
        });
    }
    manifest.namespaces = namespaces.saved.clone();
    stats.vmas = report.vmas;
    stats.disk_bytes = w.written_bytes();
    stats.phases.pages_ms = ms(pages_time);
    stats.phases.metadata_ms = ms(write_started.elapsed().saturating_sub(pages_time));
    stats.compression_ratio = (opts.compress && stats.pages_written_bytes > 0).then(|| {
        // Two decimals are all a ratio needs.
        (stats.pages_planned_bytes as f64 / stats.pages_written_bytes as f64 * 100.0).round()
            / 100.0
    });
    stats.frozen_ms = ms(frozen.frozen_for());
    log::info!(
        "metadata: {} bytes of images written ({:.3} ms)",
        stats.disk_bytes,
        stats.phases.metadata_ms
    );
    write_stats_and_log(&mut w, &stats, opts)?;
    ckpt_parasite::fault::inject(ckpt_parasite::fault::FaultPoint::BeforeCommit);
    // A process killed while frozen may still have been read in full, but
    // its job is broken: no checkpoint of it becomes the valid one.
    if let Some(p) = frozen
        .procs
        .iter()
        .filter(|p| p.zombie_status.is_none())
        .find(|p| !tree::is_alive(p.pid))
    {
        return Err(DumpError::Exited {
            pid: p.pid,
            detail: "killed while frozen, before the checkpoint was committed".into(),
        });
    }
    let commit_started = Instant::now();
    let committed = w.commit(manifest, opts.key)?;
    stats.phases.commit_ms = Some(ms_since(commit_started));
    log::info!(
        "commit: {} ({:.3} ms)",
        committed.path().display(),
        ms_since(commit_started)
    );
    report.dir = committed.path().into();
    report.stats = stats;
    // Objects of the tree's own IPC namespace go with its last process;
    // their ids name others in ckpt's, which a --kill must not remove.
    if namespaces.own_ipc() {
        ipc = ckpt_image::ipc::Ipc::default();
    }
    Ok((report, committed, ipc))
}

/// The pre-dump: tracking armed and every process's pages planned while
/// frozen, then the pages saved with the tree running.
fn write_pre_dump(frozen: &mut Frozen, opts: &WriteOptions<'_>) -> Result<DumpReport> {
    if !matches!(frozen.ns, pidns::TreeNs::Ckpt) {
        return Err(DumpError::Unsupported {
            pid: frozen.root,
            what: "a pre-dump of a tree in its own PID namespace".into(),
        });
    }
    let collect_started = Instant::now();
    let mut procs = Vec::new();
    for p in frozen.procs.iter().filter(|p| p.zombie_status.is_none()) {
        procs.push(collect_process(p, Userfaults::Track(opts))?);
    }
    let mut owners = Vec::with_capacity(procs.len());
    for c in &procs {
        owners.push(owner(c.pid)?);
    }
    let total: u64 = procs.iter().map(|c| c.pages_bytes).sum();
    let mut stats = DumpStats {
        phases: PhaseTimes {
            freeze_ms: frozen.freeze_ms,
            collect_ms: ms_since(collect_started),
            ..PhaseTimes::default()
        },
        processes: procs.len(),
        pages_planned_bytes: total,
        ..DumpStats::default()
    };
    // Everything the pre-dump needs frozen is done: writes are tracked.
    frozen.thaw_early()?;
    log::info!(
        "pre-dump: tracking armed, tree running again after {:.3} ms frozen",
        ms(frozen.frozen_for())
    );
    let mut w = ImageWriter::create(&opts.dir)?;
    let pages_started = Instant::now();
    let saved = |pid: i32| pid;
    let blocks = frozen_pages(&mut w, &procs, opts, total, &mut stats, &saved)?;
    stats.phases.pages_ms = ms_since(pages_started);
    let mut entries = Vec::new();
    let mut cores = Vec::new();
    let mut vmas = 0;
    for ((c, blocks), owner) in procs.into_iter().zip(blocks).zip(owners) {
        vmas += c.vmas.len();
        let mm = Mm {
            vmas: c.vmas,
            vdso: c.vdso,
            pages_bytes: c.pages_bytes,
            compressed: opts.compress,
            chunks: blocks,
            tracking: c.tracking,
        };
        w.write_meta(&ckpt_image::mm_name(c.pid), ImageKind::Mm, &mm)?;
        entries.push(ProcessEntry {
            pid: c.pid,
            ppid: c.ppid,
            comm: c.core.comm.clone(),
            zombie_status: None,
            uids: owner.uids,
            gids: owner.gids,
            zombie_ids: None,
        });
        cores.push(c.core);
    }
    let mut manifest = manifest(frozen.root, entries, &cores[0])?;
    manifest.pre_dump = true;
    stats.vmas = vmas;
    stats.disk_bytes = w.written_bytes();
    stats.frozen_ms = ms(frozen.frozen_for());
    write_stats_and_log(&mut w, &stats, opts)?;
    let committed = w.commit(manifest, opts.key)?;
    log::info!("pre-dump: committed {}", committed.path().display());
    Ok(DumpReport {
        pid: frozen.root,
        processes: stats.processes,
        dir: committed.path().into(),
        vmas,
        pages_bytes: total,
        fds: 0,
        frozen_ms: 0,
        stats,
    })
}

/// Writes `stats-dump.json` and the log so far, the last files before the
/// manifest.
fn write_stats_and_log(
    w: &mut ImageWriter,
    stats: &DumpStats,
    opts: &WriteOptions<'_>,
) -> Result<()> {
    let json = serde_json::to_vec_pretty(stats).map_err(|e| {
        DumpError::Image(ckpt_image::ImageError::io(
            w.tmp_dir().join(STATS_NAME),
            "encode",
            e.into(),
        ))
    })?;
    w.write_raw(STATS_NAME, &json)?;
    if let Some(log) = opts.log {
        log::info!("commit: writing {LOG_NAME}, the manifest and its seal");
        w.write_raw(LOG_NAME, &log())?;
    }
    Ok(())
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

/// Saves every process's pages with the tree frozen, one process after the
/// other. Returns each one's LZ4 block list (empty for raw pages).
fn frozen_pages(
    w: &mut ImageWriter,
    procs: &[Collected],
    opts: &WriteOptions<'_>,
    total: u64,
    stats: &mut DumpStats,
    saved: &dyn Fn(i32) -> i32,
) -> Result<Vec<Vec<ckpt_image::mm::PageChunk>>> {
    let mut out = Vec::with_capacity(procs.len());
    let mut written = 0u64;
    // Page files copied but not synced yet: synced (and read back for their
    // checksums) a batch at a time, together.
    let mut unsynced = Vec::new();
    for c in procs {
        let started = Instant::now();
        let name = ckpt_image::pages_name(saved(c.pid));
        let pw = w.pages(&name)?;
        let progress = page_progress(opts, written, total, c.pid);
        let before = opts
            .prev
            .and_then(|prev| Some((prev, prev.process(c.pid)?)));
        let blocks = if let (Some((prev, before)), Some(since)) = (before, &c.written) {
            let sink = pages::Sink::new(&pw, opts.compress, c.pages_bytes)?;
            // Frozen throughout: reading a whole chunk from the process is
            // cheaper than patching the stored one.
            let sources =
                predump::Sources::split(&c.vmas, prev, before, since, opts.compress, false);
            let r = predump::copy_pages(&c.mem, &sources, &sink, &progress)?;
            log::info!(
                "pid {}: {} bytes of pages taken from {}, {} read from the process",
                c.pid,
                r.reused,
                prev.path().display(),
                r.fresh
            );
            *stats.reused_bytes.get_or_insert(0) += r.reused;
            sink.finish()?
        } else if opts.compress {
            pages::copy_pages_compressed(&c.mem, &c.vmas, &pw, &progress)?
        } else {
            pages::copy_pages(&c.mem, &c.vmas, &pw, &progress)?;
            Vec::new()
        };
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

/// Page files synced together at most (each holds an fd until then).
const SYNC_BATCH: usize = 64;

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

/// `--background` with `--prev`: only the chunks written since the
/// pre-dump are read while the tree is frozen; it then runs while the rest
/// is copied from the pre-dump (that data no longer depends on the tree,
/// so nothing needs write protection). Returns each process's LZ4 blocks.
fn thawing_incremental_pages(
    frozen: &mut Frozen,
    w: &mut ImageWriter,
    procs: &[Collected],
    opts: &WriteOptions<'_>,
    total: u64,
    stats: &mut DumpStats,
    saved: &dyn Fn(i32) -> i32,
) -> Result<Vec<Vec<ckpt_image::mm::PageChunk>>> {
    let on_disk_before = w.written_bytes();
    let started = Instant::now();
    let writers = page_writers(w, procs, saved)?;
    let sinks = sinks(&writers, procs, opts.compress)?;
    log::debug!(
        "background: page writers open ({:.3} ms)",
        ms_since(started)
    );
    let root = procs.first().map_or(0, |c| c.pid);
    // Chunks with a few pages written since are patched (only those pages
    // read while frozen) as long as what is read fits in memory; else
    // every written chunk is read whole and saved while frozen.
    /// Where each process's pages come from, and how much is read frozen.
    struct Plan<'p> {
        sources: Vec<Option<predump::Sources<'p>>>,
        fresh: Vec<Vec<PageRange>>,
        to_read: u64,
    }
    let plan = |patch: bool| {
        let sources: Vec<Option<predump::Sources<'_>>> = procs
            .iter()
            .map(|c| {
                opts.prev.zip(c.written.as_ref()).and_then(|(prev, since)| {
                    let before = prev.process(c.pid)?;
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
        }
    };
    let mut chosen = plan(true);
    let hold = chosen.to_read <= held::HELD_FRESH_BYTES;
    if !hold {
        chosen = plan(false);
    }
    let Plan {
        sources,
        fresh: fresh_chunks,
        to_read: fresh,
    } = chosen;
    log::debug!("background: planned ({:.3} ms)", ms_since(started));
    let unreserved = HeldMemory::default();
    let memory = opts.held.unwrap_or(&unreserved);
    let mut held = Vec::with_capacity(procs.len());
    let mut saved_bytes = 0;
    for (((c, sink), split), chunks) in procs.iter().zip(&sinks).zip(&sources).zip(&fresh_chunks) {
        if hold {
            let patches = match split {
                Some(s) => s.read_patches(&c.mem, memory)?,
                None => Vec::new(),
            };
            log::debug!(
                "background: pid {} patches read ({:.3} ms)",
                c.pid,
                ms_since(started)
            );
            held.push((pages::read_chunks(&c.mem, chunks, memory)?, patches));
            log::debug!(
                "background: pid {} chunks read ({:.3} ms)",
                c.pid,
                ms_since(started)
            );
        } else {
            let progress = page_progress(opts, saved_bytes, total, c.pid);
            pages::save_chunks(&c.mem, chunks, sink, &progress)?;
        }
        saved_bytes += chunks.iter().map(PageRange::len).sum::<u64>();
    }
    frozen.thaw_early()?;
    log::info!(
        "background: {fresh} bytes written since the pre-dump {}, tree running again after {:.3} ms frozen",
        if hold { "read" } else { "saved" },
        ms(frozen.frozen_for())
    );
    if hold {
        log::info!(
            "background: {} of them into memory reserved before the freeze",
            memory.used()
        );
        stats.held_reserved_bytes = Some(memory.used() as u64);
    }
    let mut patched = 0;
    let mut put_bytes = 0;
    for ((((c, sink), split), chunks), (read, patches)) in procs
        .iter()
        .zip(&sinks)
        .zip(&sources)
        .zip(&fresh_chunks)
        .zip(held)
    {
        pages::put_read(read, sink, &page_progress(opts, put_bytes, total, c.pid))?;
        put_bytes += chunks.iter().map(PageRange::len).sum::<u64>();
        if let Some(s) = split {
            s.put_patches(patches, sink, &page_progress(opts, put_bytes, total, c.pid))?;
            patched += s.patched_bytes();
            put_bytes += s.patched_bytes();
        }
    }
    if hold {
        log::info!("background: {patched} bytes of chunks patched with the pages written since");
        stats.patched_bytes = Some(patched);
    }
    let mut reused = 0;
    for (split, sink) in sources.iter().zip(&sinks) {
        if let Some(s) = split {
            let progress = page_progress(opts, fresh + reused, total, root);
            s.copy_reused(sink, &progress)?;
            reused += s.reused_bytes();
        }
    }
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

/// `--background`: write-protects private anonymous memory, saves the rest
/// of the pages, thaws the tree and saves the protected memory while it
/// runs (see [`background`]). Returns each process's LZ4 block list.
fn background_pages(
    frozen: &mut Frozen,
    w: &mut ImageWriter,
    procs: &mut [Collected],
    opts: &WriteOptions<'_>,
    total: u64,
    stats: &mut DumpStats,
    saved: &dyn Fn(i32) -> i32,
) -> Result<Vec<Vec<ckpt_image::mm::PageChunk>>> {
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
    frozen.thaw_early()?;
    log::info!(
        "background: tree running again after {:.3} ms frozen",
        ms(frozen.frozen_for())
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

/// The pids an image records for host pids: the same in ckpt's namespace,
/// the tree namespace's with a [`pidns::PidMap`].
struct SavedPids<'a>(Option<&'a pidns::PidMap>);

impl SavedPids<'_> {
    /// A process of the tree.
    fn pid(&self, host: i32) -> i32 {
        self.0.map_or(host, |m| m.get(host).unwrap_or(host))
    }

    /// A parent: the root's is outside its namespace, where getppid()
    /// says 0.
    fn ppid(&self, host: i32) -> i32 {
        self.0.map_or(host, |m| m.get(host).unwrap_or(0))
    }
}

/// Rewrites every pid the collected state holds into the tree namespace's
/// (see [`pidns`]): a pid outside the namespace cannot be restored in it.
fn translate_pids(
    map: &pidns::PidMap,
    procs: &mut [Collected],
    files: &mut fd::TreeFiles,
    ipc: &mut ckpt_image::ipc::Ipc,
) -> Result<()> {
    for c in procs.iter_mut() {
        let pid = c.pid;
        let core = &mut c.core;
        core.pid = map.of_tree(pid, core.pid, "pid")?;
        core.pgid = map.of_tree(pid, core.pgid, "process group")?;
        core.sid = map.of_tree(pid, core.sid, "session")?;
        for t in core.threads.iter_mut() {
            t.tid = map.of_tree(pid, t.tid, "thread")?;
        }
        for t in core.posix_timers.iter_mut().filter(|t| t.target != 0) {
            t.target = map.of_tree(pid, t.target, "timer target")?;
        }
    }
    for (pid, _) in files.tables.iter_mut() {
        *pid = map.of_tree(*pid, *pid, "pid")?;
    }
    for f in files.files.files.iter_mut() {
        if let Some(ckpt_image::fd::file::Kind::Pidfd(p)) = &mut f.kind {
            p.pid = map.of_tree(p.pid, p.pid, "pidfd target")?;
        }
    }
    // Informational (the kernel rewrites them on every operation): a pid
    // outside the namespace reads as 0 there, as the kernel shows it.
    for s in ipc.sem.iter_mut() {
        for p in s.sempids.iter_mut() {
            *p = map.get(*p).unwrap_or(0);
        }
    }
    Ok(())
}

/// The SysV IPC objects of the tree (see `ipc.rs` for which).
fn collect_ipc(root: i32, procs: &[Collected]) -> Result<ckpt_image::ipc::Ipc> {
    let mut uids = Vec::new();
    let mut gids = Vec::new();
    for c in procs {
        let o = owner(c.pid)?;
        uids.extend(o.uids);
        gids.extend(o.gids);
        gids.extend(c.core.creds.iter().flat_map(|cr| cr.groups.iter().copied()));
    }
    ipc::collect(&ipc::Tree {
        root,
        procs: procs.iter().map(|c| (c.pid, &c.vmas[..])).collect(),
        uids,
        gids,
    })
}

/// Whose a process is: its ids as the kernel reports them in
/// /proc/PID/status, independent of how the core image collects creds.
struct Owner {
    /// Real, effective, saved and filesystem uid.
    uids: Vec<u32>,
    /// Real, effective, saved and filesystem gid.
    gids: Vec<u32>,
}

fn owner(pid: i32) -> Result<Owner> {
    let status = procfile::read(pid, "status")?;
    let ids = |key: &str| -> Result<Vec<u32>> {
        let parsed: Option<Vec<u32>> = procfile::status_field(&status, key).and_then(|v| {
            v.split_whitespace()
                .map(|n| n.parse().ok())
                .collect::<Option<Vec<u32>>>()
        });
        parsed
            .filter(|ids| ids.len() == 4)
            .ok_or_else(|| DumpError::Parse {
                pid,
                path: format!("/proc/{pid}/status"),
                what: format!("no real, effective, saved and fs ids in {key}"),
            })
    };
    Ok(Owner {
        uids: ids("Uid")?,
        gids: ids("Gid")?,
    })
}

/// How many 10 ms polls [`Frozen::explain`] gives a killed task to show as
/// dead.
const DEATH_SETTLE_POLLS: u32 = 50;

/// `PF_KTHREAD` in the flags field of `/proc/PID/stat`.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Refuses what this version cannot dump, before touching the process.
fn precheck(pid: i32, ns: pidns::TreeNs) -> Result<()> {
    if pid <= 0 {
        return Err(DumpError::NoProcess { pid });
    }
    if pid == std::process::id() as i32 {
        return Err(DumpError::Unsupported {
            pid,
            what: "dumping ckpt itself".into(),
        });
    }
    let status = procfile::read(pid, "status")?;
    // Kernel threads have no user memory to save; ptrace refuses them with
    // a bare EPERM, so say what they are first.
    let flags = procfile::stat_fields(pid)?
        .get(procfile::stat_index(9))
        .copied()
        .unwrap_or(0);
    if procfile::status_field(&status, "Kthread") == Some("1") || flags & PF_KTHREAD != 0 {
        return Err(DumpError::Unsupported {
            pid,
            what: "kernel thread".into(),
        });
    }
    pidns::check_member(pid, &status, ns)?;
    if let Some(state) = procfile::status_field(&status, "State")
        && (state.starts_with('Z') || state.starts_with('X'))
    {
        return Err(DumpError::Unsupported {
            pid,
            what: "zombie process (its parent has not reaped it)".into(),
        });
    }
    stopped::check_tracer(pid, &status)?;
    if procfile::status_field(&status, "Tgid") != Some(&pid.to_string()) {
        return Err(DumpError::Unsupported {
            pid,
            what: "dumping a single thread of a process (give the process id)".into(),
        });
    }
    Ok(())
}

fn seize_error(pid: i32, e: ParasiteError) -> DumpError {
    match e {
        ParasiteError::Ptrace {
            op: "seize",
            source: Errno::ESRCH,
            ..
        } => DumpError::NoProcess { pid },
        ParasiteError::Ptrace {
            op: "seize",
            source: Errno::EPERM,
            ..
        } => DumpError::Permission {
            pid,
            what: "ptrace attach refused".into(),
        },
        other => other.into(),
    }
}

fn manifest(
    root: i32,
    processes: Vec<ProcessEntry>,
    root_core: &ckpt_image::task::Core,
) -> Result<Manifest> {
    let pid = root;
    let uts = nix::sys::utsname::uname().map_err(|e| DumpError::Proc {
        pid,
        path: "uname".into(),
        source: e.into(),
    })?;
    Ok(Manifest {
        tool_version: env!("CARGO_PKG_VERSION").into(),
        kernel: format!(
            "{} {}",
            uts.release().to_string_lossy(),
            uts.version().to_string_lossy()
        ),
        arch: std::env::consts::ARCH.into(),
        cpu: Some(features::cpu_info(&root_core.xstate)),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        root_pid: root,
        processes,
        files: Vec::new(),
        hostname: uts.nodename().to_string_lossy().into_owned(),
        pid_namespace: None,
        pre_dump: false,
        namespaces: None,
    })
}
