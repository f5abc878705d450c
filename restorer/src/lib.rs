//! Rebuild a process from a checkpoint image and resume it.
//!
//! Data flows one way: **read** (the manifest's seal is checked with the
//! site's key and the whole image against the manifest's checksums, and
//! every process's credentials against the owner the manifest recorded,
//! before anything is created) → **rebuild** → **resume**.
//!
//! How the address space is rebuilt: the restorer clones a child with the
//! original pid (clone3 `set_tid`), which stops itself under
//! `PTRACE_TRACEME` before running any code. Everything else is driven from
//! outside with the parasite crate's remote syscalls, from a small scratch
//! area placed where neither the child's inherited mappings nor the dumped
//! ones lie: the inherited mappings are unmapped, the kernel's vDSO/vvar are
//! moved to the dumped addresses when the kernel provides the same vDSO
//! (else the dumped vDSO is mapped there as a proxy to this kernel's, as
//! CRIU does: `vdso.rs`), every VMA is recreated and filled from the pages file through
//! `/proc/PID/mem`, then fds, signals, credentials and registers follow. The
//! scratch area is unmapped by the very last syscall, which stops at its exit
//! so the final registers can be set: no trace of ckpt is left in the map.
//!
//! Any error kills and reaps the child (and ptrace's EXITKILL kills it if
//! the restorer itself dies), so no half-restored process is ever left.

#![warn(missing_docs)]

pub mod error;

mod creds;
mod fd;
mod held;
mod ib;
mod inherit;
mod ipc;
pub mod lazy;
mod mm;
pub mod ns;
mod pages;
mod pid;
mod prctl;
pub mod run;
mod sched;
mod seccomp;
mod shapes;
mod shmem;
mod stopped;

mod sys;
mod task;
mod thread;
mod timer;
mod tree;
mod vdso;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ckpt_image::fd::{FdTable, Files};
use ckpt_image::manifest::ProcessEntry;
use ckpt_image::mm::{Mm, VmaKind};
use ckpt_image::task::Core;
use ckpt_image::{ImageDir, ImageError, ImageKey, ImageKind};
use ckpt_parasite::Tracee;
use held::{ChildrenFirst, Held};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

pub use error::{FileUse, RestoreError, Result};
pub use fd::{AddressConflict, AddressMap, FilePolicy, InheritFd};

/// Options of one restore.
pub struct RestoreOptions<'a> {
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// The site's key: the manifest must be sealed with it.
    pub key: &'a ImageKey,
    /// How long to wait for a zombie holding the pid.
    pub pid_wait: Duration,
    /// Receives one-line notices (waiting for a pid, capped limits).
    pub notice: &'a dyn Fn(&str),
    /// Called with (bytes of page data copied, total) while pages are copied.
    pub progress: Option<&'a (dyn Fn(u64, u64) + Sync)>,
    /// Which of the restorer's fds may reach the processes, and which files
    /// may have changed since the dump.
    pub files: FilePolicy,
    /// Serve private anonymous memory on demand ([`lazy`]): the tree runs
    /// before its pages are all back.
    pub lazy: bool,
    /// The network namespace to restore the tree into (`--netns`); `None`:
    /// the restorer's, which a tree dumped in one of its own refuses.
    pub netns: Option<ns::NetTarget>,
    /// The mount namespace to restore the tree into (`--mntns`); `None`:
    /// the restorer's, which a tree dumped in one of its own refuses.
    pub mntns: Option<ns::MntTarget>,
}

/// A restored, running process tree (its root is a child of the caller).
#[derive(Debug)]
pub struct Restored {
    /// The root's pid (the original one).
    pub pid: i32,
    /// The figures of the restore.
    pub stats: RestoreStats,
    /// With [`RestoreOptions::lazy`]: the page server, filling the rest in
    /// the background. Wait for it or detach it; dropping it stops the
    /// service, and the pages not yet filled would read as zeros.
    pub lazy: Option<lazy::PageServer>,
}

/// How long each phase of a restore took, in milliseconds.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct RestorePhaseTimes {
    /// Checking the seal and every file's checksums, decoding the images.
    pub read_ms: f64,
    /// Creating every process and rebuilding it (memory, fds, threads...).
    pub rebuild_ms: f64,
    /// Letting the tree run.
    pub resume_ms: f64,
}

/// The figures of one restore (`ckpt restore --stats-file`, `--json`).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct RestoreStats {
    /// Time per phase.
    pub phases: RestorePhaseTimes,
    /// Processes of the tree (zombies included).
    pub processes: usize,
    /// Threads of the live processes (each leader counts as one).
    pub threads: usize,
    /// VMAs recreated.
    pub vmas: usize,
    /// Fds restored.
    pub fds: usize,
    /// Bytes of page data restored.
    pub pages_bytes: u64,
    /// How the pages were served, for a lazy restore.
    pub lazy: Option<lazy::LazyStats>,
}

/// Milliseconds since `t`, to the microsecond.
fn ms_since(t: Instant) -> f64 {
    (t.elapsed().as_secs_f64() * 1e6).round() / 1e3
}

/// Something of the restored tree that was bound to the restoring command
/// instead of restored as dumped (what CRIU calls a shell job). `ckpt
/// restore` reports each unless the user opted in with `--shell-job`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rebound {
    /// These terminal fds of `pid` are now the restorer's own fds of the
    /// same numbers (the terminal rule).
    Terminal {
        /// The process.
        pid: i32,
        /// Its fd numbers, ascending.
        fds: Vec<i32>,
    },
    /// These fds of `pid` were a pipe to a launcher outside the tree and are
    /// now the restorer's own fds of the same numbers (the terminal rule).
    StdioPipe {
        /// The process.
        pid: i32,
        /// Its fd numbers, ascending.
        fds: Vec<i32>,
    },
    /// `pid` (the root) was in a session it did not lead, which was outside
    /// the tree: it is in the restorer's session (and group, unless it led
    /// its own) instead.
    Session {
        /// The process.
        pid: i32,
    },
    /// These stdio fds of `pid` would have been the restorer's own, but
    /// those are files of someone else's (`owner`; `None`: not readable)
    /// that only the restorer's rights reach: they are `/dev/null`.
    Withheld {
        /// The process.
        pid: i32,
        /// Its fd numbers, ascending.
        fds: Vec<i32>,
        /// The owner of the restorer's files.
        owner: Option<u32>,
    },
}

/// A zombie of the tree: only its manifest entry exists.
struct Zombie {
    pid: i32,
    ppid: i32,
    /// Its wait status.
    status: i32,
    comm: String,
    /// Its session and group, when recorded.
    ids: Option<ckpt_image::manifest::ZombieIds>,
}

/// Everything read from the images for one process.
struct ProcessImages {
    pid: i32,
    ppid: i32,
    core: Core,
    mm: Mm,
    fds: FdTable,
}

fn load(images: &ImageDir, files: &Files, entry: &ProcessEntry) -> Result<ProcessImages> {
    let pid = entry.pid;
    let p = ProcessImages {
        pid,
        ppid: entry.ppid,
        core: images.read_meta(&ckpt_image::core_name(pid), ImageKind::Core)?,
        mm: images.read_meta(&ckpt_image::mm_name(pid), ImageKind::Mm)?,
        fds: images.read_meta(&ckpt_image::fds_name(pid), ImageKind::FdTable)?,
    };
    validate(images, pid, &p)?;
    check_owner(images, entry, &p.core)?;
    creds::check_threads(&p.core)?;
    fd::validate(images, pid, &p.fds, files)?;
    Ok(p)
}

/// Restores the checkpoint in `opts.dir` (a process tree, root first) and
/// lets it run. The root becomes a child of the caller. The phases
/// [`rebuild`] → [`Stopped::resume`] in one call.
pub fn restore(opts: &RestoreOptions<'_>) -> Result<Restored> {
    rebuild(opts)?.resume()
}

/// A restored tree, every process rebuilt and still stopped under ptrace
/// (phase 1 of a restore). Between this and [`Stopped::resume`] a
/// coordinator publishes what changed (new addresses, new ids) and waits
/// for its peers; nothing of the tree runs meanwhile. Dropping it kills
/// the whole tree: a process that was never resumed never ran.
pub struct Stopped {
    root: i32,
    /// Tree order (parents first), dropped children first.
    tracees: ChildrenFirst<Held>,
    child: ChildGuard,
    rebound: Vec<Rebound>,
    stats: RestoreStats,
    /// The SysV IPC objects created for the tree, removed if it never runs.
    ipc: ipc::Created,
    /// TCP connections to peers outside the tree, in repair mode until the
    /// tree resumes (closed silently if it never does).
    tcp: fd::OutsidePeers,
    /// The page server of a lazy restore.
    lazy: Option<lazy::PageServer>,
    /// When the restore began (time-to-running counts from it).
    started: Instant,
    /// Verbs layers that recreated their resources and wait to connect.
    ib: ib::Pending,
}

impl Stopped {
    /// This tree's InfiniBand restart blobs (empty if no process ran the
    /// verbs layer): what a coordinated restart publishes for the other
    /// nodes.
    pub fn ib_blobs(&self) -> &[u8] {
        self.ib.blobs()
    }

    /// Connects the verbs layers' queue pairs with every node's restart
    /// blobs (this tree's included). Without it, [`Stopped::resume`]
    /// connects with this tree's alone.
    pub fn ib_connect(&mut self, all: &[u8]) -> Result<()> {
        self.ib.connect(&self.tracees, all)
    }

    /// Pids of the rebuilt processes, parents first (zombies not included).
    pub fn pids(&self) -> Vec<i32> {
        self.tracees.iter().map(|t| t.pid()).collect()
    }

    /// What was bound to the restoring command instead of restored.
    pub fn rebound(&self) -> &[Rebound] {
        &self.rebound
    }

    /// Lets the tree run.
    pub fn resume(mut self) -> Result<Restored> {
        let own = self.ib.blobs().to_vec();
        self.ib.connect(&self.tracees, &own)?;
        let started = Instant::now();
        // Every peer's end exists by now (in a coordinated restart, on
        // every node): connections may talk again.
        let tcp = std::mem::take(&mut self.tcp);
        if !tcp.is_empty() {
            log::info!("resume: {} TCP connections leave repair mode", tcp.len());
        }
        tcp.release()?;
        // Children first, so no parent runs while a child is held.
        let mut let_go = LetGo::default();
        while let Some(t) = self.tracees.pop() {
            let pid = t.pid();
            log::debug!("resume pid {pid}");
            let pidfd = sys::pidfd_open(pid)
                .inspect_err(|e| log::debug!("pid {pid}: pidfd_open: {e}"))
                .ok();
            t.release()?;
            let_go.running.push((pid, pidfd));
        }
        let_go.running.clear();
        self.child.disarm();
        self.ipc.disarm();
        let mut stats = self.stats;
        stats.phases.resume_ms = ms_since(started);
        let lazy = self.lazy.take();
        if let Some(server) = &lazy {
            server.fill();
            stats.lazy = Some(lazy::LazyStats {
                running_ms: ms_since(self.started),
                ..Default::default()
            });
        }
        log::info!(
            "resume: {} processes running ({:.3} ms)",
            stats.processes,
            stats.phases.resume_ms
        );
        Ok(Restored {
            pid: self.root,
            stats,
            lazy,
        })
    }
}

/// The processes of a tree being resumed that run already. Dropped with
/// some left (a process died before it could be let go: the resume fails
/// part way), they are killed: a tree runs whole or not at all, and a
/// failed restore leaves no process behind. Through pidfds, so a process
/// that ended meanwhile is never mistaken for a later holder of its pid.
#[derive(Default)]
struct LetGo {
    /// Each process's pid and pidfd (none if the restorer is out of fds:
    /// a tree of thousands of processes must not fail for want of them).
    running: Vec<(i32, Option<std::os::fd::OwnedFd>)>,
}

impl Drop for LetGo {
    fn drop(&mut self) {
        use std::os::fd::AsFd;
        for (pid, fd) in &self.running {
            match fd {
                Some(fd) => {
                    let _ = sys::pidfd_kill(fd.as_fd());
                }
                // Let go an instant ago and a child of a process of the
                // tree: its pid is most likely still its own.
                None => {
                    let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
                }
            }
        }
    }
}

/// The addresses the checkpoint at `dir` was reachable at on its node:
/// the inet sockets' bound addresses, without loopback and link-local
/// ones. A restart on another node maps them to that node's address
/// ([`FilePolicy::addresses`]).
pub fn node_addresses(dir: &Path, key: &ImageKey) -> Result<BTreeSet<IpAddr>> {
    // Only the open files are read: the page data is verified once, by the
    // restore that uses it, not hashed here a first time.
    let images = ImageDir::open_deferring_pages(dir, key)?;
    let files: Files = images.read_meta(ckpt_image::FILES_NAME, ImageKind::Files)?;
    Ok(fd::node_addresses(&files))
}

/// Reads and verifies the whole checkpoint, then creates every process of
/// the tree and rebuilds it, leaving all of them stopped.
pub fn rebuild(opts: &RestoreOptions<'_>) -> Result<Stopped> {
    let read_started = Instant::now();
    log::info!("read: {}", opts.dir.display());
    // Page data is verified as it is copied into place (`pages`), before
    // anything runs; everything else now.
    let images = ImageDir::open_deferring_pages(&opts.dir, opts.key)?;
    check_compatible(&images)?;
    let m = images.manifest();
    let root = m.root_pid;
    images.check_tree()?;
    let files: Files = images.read_meta(ckpt_image::FILES_NAME, ImageKind::Files)?;
    check_files(&images, &files)?;
    let procs = m
        .processes
        .iter()
        .filter(|e| e.zombie_status.is_none())
        .map(|e| load(&images, &files, e))
        .collect::<Result<Vec<_>>>()?;
    let objects = shmem::load(&images)?;
    for p in &procs {
        for v in
            p.mm.vmas
                .iter()
                .filter(|v| VmaKind::try_from(v.kind).is_ok_and(VmaKind::maps_shmem))
        {
            objects.check_vma(&images, p.pid, v)?;
        }
    }
    for f in &files.files {
        if let Some(ckpt_image::fd::file::Kind::Memfd(m)) = &f.kind
            && !objects.has(m.shmem_id)
        {
            return Err(RestoreError::Image(ImageError::Invalid {
                path: images.path().join(ckpt_image::FILES_NAME),
                what: format!(
                    "memfd file {}: no shared memory object {}",
                    f.id, m.shmem_id
                ),
            }));
        }
    }
    for p in &procs {
        let parent = procs.iter().find(|q| q.pid == p.ppid).map(|q| &q.mm);
        inherit::check(p.pid, &p.mm, parent)?;
    }
    let zombies: Vec<Zombie> = m
        .processes
        .iter()
        .filter_map(|e| {
            Some(Zombie {
                pid: e.pid,
                ppid: e.ppid,
                status: e.zombie_status?,
                comm: e.comm.clone(),
                ids: e.zombie_ids,
            })
        })
        .collect();
    let owners = ipc::Owners {
        uids: m
            .processes
            .iter()
            .flat_map(|e| e.uids.iter().copied())
            .collect(),
        gids: m
            .processes
            .iter()
            .flat_map(|e| e.gids.iter().copied())
            .chain(
                procs
                    .iter()
                    .flat_map(|p| p.core.creds.iter().flat_map(|c| c.groups.iter().copied())),
            )
            .collect(),
    };
    let sysv = ipc::load(
        &images,
        &owners,
        &procs
            .iter()
            .map(|p| (p.pid, &p.mm.vmas[..]))
            .collect::<Vec<_>>(),
    )?;
    let pages = procs
        .iter()
        .map(|p| {
            let name = ckpt_image::pages_name(p.pid);
            let f = images.open_pages(&name)?;
            sys::map_readonly(&f).map(Arc::new).map_err(|e| {
                RestoreError::from(ImageError::io(images.path().join(&name), "mmap", e))
            })
        })
        .collect::<Result<Vec<_>>>()?;
    // A process whose memory its children inherit at fork must be whole
    // before they are forked: only the others are served lazily.
    let lazy: Vec<bool> = procs
        .iter()
        .map(|p| opts.lazy && !m.processes.iter().any(|e| e.ppid == p.pid))
        .collect();
    for ((p, map), _) in procs.iter().zip(&pages).zip(&lazy).filter(|(_, l)| **l) {
        lazy::read_ahead_eager(p.pid, &p.mm, map);
    }
    let mut stats = RestoreStats {
        processes: m.processes.len(),
        threads: procs.iter().map(|p| 1 + p.core.threads.len()).sum(),
        vmas: procs.iter().map(|p| p.mm.vmas.len()).sum(),
        fds: procs.iter().map(|p| p.fds.fds.len()).sum(),
        pages_bytes: procs.iter().map(|p| p.mm.pages_bytes).sum(),
        ..RestoreStats::default()
    };
    stats.phases.read_ms = ms_since(read_started);
    log::info!(
        "read: {} files verified, {} processes ({:.3} ms)",
        m.files.len(),
        stats.processes,
        stats.phases.read_ms
    );
    let rebuild_started = Instant::now();

    // Pids of a PID namespace's own come back in a fresh namespace, where
    // every one is free.
    let new_ns = m.pid_namespace.is_some();
    if new_ns {
        log::info!("rebuild: the tree's pids are a PID namespace's own: restoring into a new one");
    }
    // Every pid and thread id must be free (they share the pid space).
    for z in zombies.iter().filter(|_| !new_ns) {
        pid::wait_free(z.pid, opts.pid_wait, opts.notice)?;
    }
    for p in procs.iter().filter(|_| !new_ns) {
        if p.pid != root {
            pid::wait_free(p.pid, opts.pid_wait, opts.notice)?;
        }
        for tc in &p.core.threads {
            pid::wait_free(tc.tid, opts.pid_wait, opts.notice)?;
        }
    }
    let namespaces = m.namespaces.as_ref();
    ns::check(root, namespaces)?;
    ns::check_net(root, namespaces, opts.netns.as_ref())?;
    ns::check_mnt(root, namespaces, opts.mntns.as_ref())?;
    let own_ipc = namespaces.is_some_and(|n| n.ipc);
    // IPC objects before any process: a collision fails the restore with
    // nothing created, and the processes attach what is already there.
    // Those of an IPC namespace of the tree's own are created in the new
    // one, right after the root (see `ns.rs`).
    let created = if own_ipc {
        None
    } else {
        ipc::check_free(&sysv)?;
        Some(ipc::create(&images, &sysv, ipc::Cleanup::Restorer)?)
    };
    let _pidfd = if new_ns {
        Some(RestorerPidfd::new(&procs)?)
    } else {
        None
    };
    // From forking the root until every process is rebuilt, the paths the
    // restorer opens for the processes are those of the tree's mount
    // namespace; an early return goes back too (dropping it).
    let own_mnt = match &opts.mntns {
        Some(target) => Some(ns::enter_mnt(root, target)?),
        None => None,
    };
    let own_time = match namespaces.and_then(|n| n.time.as_ref()) {
        Some(time) => Some(ns::enter_time(root, time)?),
        None => None,
    };
    let own_net = match &opts.netns {
        Some(target) => Some(ns::enter_net(root, target)?),
        None => None,
    };
    let ns_flags = ns::clone_flags(namespaces);
    let child = if new_ns {
        spawn_in_new_pidns(root, ns_flags)
    } else {
        spawn(root, ns_flags, opts)
    };
    if let Some(own) = own_time {
        own.restore();
    }
    if let Some(own) = own_net {
        own.restore(root)?;
    }
    let child = child?;
    let host_root = child.pid;
    if let Some(uts) = namespaces.and_then(|n| n.uts.as_ref()) {
        ns::set_uts(host_root, uts)?;
    }
    let created = match created {
        Some(c) => c,
        None => {
            // The namespace, and with it every object, ends with the
            // tree's last process: nothing to remove on failure, and
            // nothing of ckpt's namespace may be removed by these ids.
            let mut c = ns::in_ipc(host_root, own_ipc, || {
                ipc::create(&images, &sysv, ipc::Cleanup::Namespace)
            })?;
            c.disarm();
            c
        }
    };
    let mut fds = fd::Context::new(&images, &files, &opts.files);
    *fds.state::<shmem::Objects>() = objects;
    let mut server = if lazy.contains(&true) {
        Some(lazy::PageServer::start(read_started)?)
    } else {
        None
    };
    // Lazily served pages are not copied now, so their files are verified
    // beside the rebuild, whole, before anything runs.
    // Lazily served pages are checked block by block as they are served
    // when the manifest lists the blocks' checksums; otherwise (older
    // images) their files are verified beside the rebuild, whole, before
    // anything runs.
    let blocks = procs
        .iter()
        .zip(&lazy)
        .map(|(p, &l)| {
            if l {
                images.block_checks(&ckpt_image::pages_name(p.pid))
            } else {
                Ok(None)
            }
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let verify_lazy = || -> Result<()> {
        for (i, p) in procs.iter().enumerate() {
            if lazy[i] && blocks[i].is_none() {
                images.verify_bytes(&ckpt_image::pages_name(p.pid), &pages[i])?;
            }
        }
        Ok(())
    };
    let built = std::thread::scope(|sc| {
        let verifying = sc.spawn(verify_lazy);
        let built = build_tree(
            host_root,
            &procs,
            &zombies,
            &pages,
            &lazy,
            &blocks,
            server.as_mut(),
            &mut fds,
            opts,
        );
        let verified = verifying
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        built.and_then(|b| verified.map(|()| b))
    });
    match built
        .and_then(|built| {
            ns::in_ipc(host_root, own_ipc, || ipc::remove_marked(&sysv)).map(|()| built)
        })
        .and_then(|built| {
            images
                .verify_remaining()
                .map(|()| built)
                .map_err(Into::into)
        })
        .and_then(|(tracees, session)| {
            // Every process is whole (memory, fds, final credentials) and
            // still stopped: the verbs layers recreate their resources. A
            // failure drops the held processes, which kills them.
            let ib = ib::restart_local(&tracees, &procs)?;
            Ok((tracees, session, ib))
        }) {
        Ok((tracees, session, ib)) => {
            stats.phases.rebuild_ms = ms_since(rebuild_started);
            log::info!(
                "rebuild: {} processes rebuilt, stopped ({:.3} ms)",
                tracees.len(),
                stats.phases.rebuild_ms
            );
            let mut rebound = Vec::new();
            if session == task::SessionOrigin::Adopted {
                rebound.push(Rebound::Session { pid: root });
            }
            for b in fds.bound() {
                // Consecutive fds of one process and kind make one notice.
                match (rebound.last_mut(), b.kind) {
                    (Some(Rebound::Terminal { pid, fds }), fd::BoundKind::Terminal)
                    | (Some(Rebound::StdioPipe { pid, fds }), fd::BoundKind::StdioPipe)
                        if *pid == b.pid =>
                    {
                        fds.push(b.fd)
                    }
                    (_, fd::BoundKind::Terminal) => rebound.push(Rebound::Terminal {
                        pid: b.pid,
                        fds: vec![b.fd],
                    }),
                    (_, fd::BoundKind::StdioPipe) => rebound.push(Rebound::StdioPipe {
                        pid: b.pid,
                        fds: vec![b.fd],
                    }),
                }
            }
            for w in fds.withheld() {
                match rebound.last_mut() {
                    Some(Rebound::Withheld { pid, fds, owner })
                        if *pid == w.pid && *owner == w.owner =>
                    {
                        fds.push(w.fd)
                    }
                    _ => rebound.push(Rebound::Withheld {
                        pid: w.pid,
                        fds: vec![w.fd],
                        owner: w.owner,
                    }),
                }
            }
            let stopped = Stopped {
                root: host_root,
                tracees,
                child,
                rebound,
                stats,
                ipc: created,
                tcp: fds.take_state::<fd::OutsidePeers>(),
                lazy: server,
                started: read_started,
                ib,
            };
            // Back before the caller writes or runs anything of its own
            // (pid file, stats, action scripts). A tree the restorer
            // cannot go back from is dropped, which kills it.
            if let Some(own) = own_mnt {
                own.restore()?;
            }
            Ok(stopped)
        }
        Err(e) => {
            // Kill while still stopped: a half-built process must never run.
            // In a new namespace the image's pids are not the host's: the
            // child guard kills its init, which ends every process in it.
            // The root is the guard's too: a held root's drop collected it
            // already, and its pid may be anyone's by now.
            for p in procs.iter().rev().filter(|p| !new_ns && p.pid != root) {
                let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
            }
            Err(e)
        }
    }
}

/// Creates every process of the tree (each forked by its restored parent,
/// so parenthood, sessions and groups come out right), then rebuilds each.
#[allow(clippy::too_many_arguments)]
fn build_tree(
    host_root: i32,
    procs: &[ProcessImages],
    zombies: &[Zombie],
    pages: &[Arc<memmap2::Mmap>],
    lazy: &[bool],
    blocks: &[Option<ckpt_image::BlockChecks>],
    mut server: Option<&mut lazy::PageServer>,
    fds: &mut fd::Context<'_>,
    opts: &RestoreOptions<'_>,
) -> Result<(ChildrenFirst<Held>, task::SessionOrigin)> {
    let images = fds.images;
    let root = Tracee::adopt_stopped_child(host_root)?;
    // Nothing may be delivered until the very end; children inherit this.
    root.set_sigmask(!0)?;
    let child_maps = mm::read_maps(root.pid())?;
    let mut busy: Vec<(u64, u64)> = child_maps.iter().map(|m| (m.start, m.end)).collect();
    busy.extend(
        procs
            .iter()
            .flat_map(|p| p.mm.vmas.iter().map(|v| (v.start, v.end))),
    );
    let no_room = |what: &str| RestoreError::Incompatible {
        dir: images.path().into(),
        what: what.into(),
    };
    let at = mm::find_gap(&busy, ckpt_parasite::remote::SCRATCH_LEN)
        .ok_or_else(|| no_room("no free address range for the restorer's scratch area"))?;
    let code = child_maps
        .iter()
        .find(|m| m.exec && !m.path.starts_with('['))
        .map(|m| m.start)
        .ok_or_else(|| no_room("restorer has no executable mapping"))?;
    // Forked children inherit the scratch area at the same address.
    let base = ckpt_parasite::remote::Remote::map(&root, code, at)?.base;
    let session = task::restore_session(
        &ckpt_parasite::remote::Remote { t: &root, base },
        &procs[0].core,
        true,
    )?;
    // Tree order: a parent's memory is back before its children are forked
    // from it, so private pages they still shared at the dump are shared
    // again (one copy, as after the original fork). Everything else is
    // restored afterwards, in tree order.
    // The root's session from outside the tree, if it had one.
    let adopted = (session == task::SessionOrigin::Adopted).then_some(procs[0].core.sid);
    let mut slots: ChildrenFirst<Option<Held>> =
        ChildrenFirst(procs.iter().map(|_| None).collect());
    slots[0] = Some(Held::new(root));
    for (i, p) in procs.iter().enumerate() {
        let t = slots[i]
            .as_ref()
            .expect("parents come before their children");
        let started = Instant::now();
        let served = server
            .as_deref_mut()
            .filter(|_| lazy[i])
            .map(|s| (s, blocks[i].clone()));
        rebuild_memory(t, base, p, &pages[i], served, fds, opts)?;
        log::debug!(
            "pid {}: memory rebuilt ({:.3} ms)",
            p.pid,
            ms_since(started)
        );
        let r = ckpt_parasite::remote::Remote { t, base };
        // Held at once: a step failing below kills them unrun.
        let mut forked = Vec::new();
        let mut leaders = shapes::Leaders::default();
        leaders.fork_zombie_leaders(&r, zombies.iter().filter(|z| z.ppid == p.pid))?;
        for (j, c) in procs.iter().enumerate().filter(|(_, c)| c.ppid == p.pid) {
            let child = Held::new(leaders.fork_member(&r, &p.core, c.pid, &c.core)?);
            shapes::ensure_group(
                &ckpt_parasite::remote::Remote { t: &child, base },
                &c.core,
                adopted,
            )?;
            task::restore_session(
                &ckpt_parasite::remote::Remote { t: &child, base },
                &c.core,
                false,
            )?;
            forked.push((j, child));
        }
        let mut early = leaders.finish(&r)?;
        for z in zombies.iter().filter(|z| z.ppid == p.pid) {
            let child = match early.remove(&z.pid) {
                Some(t) => t,
                None => tree::fork_child(&r, z.pid)?,
            };
            let zr = ckpt_parasite::remote::Remote { t: &child, base };
            shapes::join_zombie_group(&zr, z, adopted)?;
            log::debug!("pid {}: zombie (status {:#x})", z.pid, z.status);
            task::set_name(&zr, &z.comm)?;
            tree::make_zombie(&zr, z.status)?;
        }
        for (j, child) in forked {
            slots[j] = Some(child);
        }
    }
    let mut tracees = ChildrenFirst(
        std::mem::take(&mut slots.0)
            .into_iter()
            .map(|t| t.expect("check_tree: every process has a parent in the tree"))
            .collect::<Vec<Held>>(),
    );
    for (t, p) in tracees.iter_mut().zip(procs) {
        let started = Instant::now();
        let threads = rebuild_process(t, base, p, fds, opts).map_err(|e| e.of_process(t.pid()))?;
        t.hold_threads(threads);
        log::info!(
            "rebuild pid {} ({}): {} threads, {} VMAs, {} bytes of pages, {} fds ({:.3} ms)",
            p.pid,
            p.core.comm,
            1 + p.core.threads.len(),
            p.mm.vmas.len(),
            p.mm.pages_bytes,
            p.fds.fds.len(),
            ms_since(started)
        );
    }
    fds.state::<shmem::Objects>().seal_all()?;
    Ok((tracees, session))
}

/// File ids must be unique and sorted (lookups are binary searches).
fn check_files(images: &ImageDir, files: &Files) -> Result<()> {
    if files.files.windows(2).any(|w| w[0].id >= w[1].id) {
        return Err(RestoreError::Image(ImageError::Invalid {
            path: images.path().join(ckpt_image::FILES_NAME),
            what: "file ids are not unique and sorted".into(),
        }));
    }
    Ok(())
}

fn check_compatible(images: &ImageDir) -> Result<()> {
    let m = images.manifest();
    let incompatible = |what: String| RestoreError::Incompatible {
        dir: images.path().into(),
        what,
    };
    if m.pre_dump {
        return Err(incompatible(
            "a pre-dump (memory only, taken while the tree ran): restore the dump made with --prev after it".into(),
        ));
    }
    if m.arch != std::env::consts::ARCH {
        return Err(incompatible(format!(
            "dumped on {}, this is {}",
            m.arch,
            std::env::consts::ARCH
        )));
    }
    if let Some(cpu) = &m.cpu {
        let here = ckpt_parasite::xcr0();
        if cpu.xcr0 & !here != 0 {
            return Err(incompatible(format!(
                "the dumping CPU had register state this CPU lacks (XCR0 {:#x}, here {:#x})",
                cpu.xcr0, here
            )));
        }
        if cpu.xsave_size as usize != ckpt_parasite::xsave_size() {
            return Err(incompatible(format!(
                "XSAVE area is {} bytes here, {} in the image",
                ckpt_parasite::xsave_size(),
                cpu.xsave_size
            )));
        }
    }
    Ok(())
}

fn validate(images: &ImageDir, pid: i32, p: &ProcessImages) -> Result<()> {
    let invalid = |name: String, what: &str| {
        RestoreError::Image(ImageError::Invalid {
            path: images.path().join(name),
            what: what.into(),
        })
    };
    let core_name = ckpt_image::core_name(pid);
    if p.core.pid != pid {
        return Err(invalid(core_name, "pid does not match the manifest"));
    }
    if p.core.regs.is_none() || p.core.mm.is_none() {
        return Err(invalid(core_name, "registers or mm fields missing"));
    }
    if p.core.xstate.len() < 576 {
        return Err(invalid(core_name, "XSAVE area too short"));
    }
    ckpt_image::seccomp::validate(&p.core)?;
    mm::validate_vdso(&p.mm).map_err(|what| invalid(ckpt_image::mm_name(pid), what.as_str()))?;
    let pages_len = images.digest(&ckpt_image::pages_name(pid))?.size;
    pages::plan(pid, &p.mm, pages_len)?;
    Ok(())
}

/// The core image may only ask for the ids the process had: its uids and
/// gids must be the ones the dumper read from /proc/PID/status into the
/// sealed manifest. (The core is sealed too, through its SHA-256 in the
/// manifest; this keeps a process's owner out of any single image's hands.)
fn check_owner(images: &ImageDir, entry: &ProcessEntry, core: &Core) -> Result<()> {
    let pid = entry.pid;
    let invalid = |path: std::path::PathBuf, what: String| {
        RestoreError::Image(ImageError::Invalid { path, what })
    };
    if entry.uids.len() != 4 || entry.gids.len() != 4 {
        return Err(invalid(
            images.path().join(ckpt_image::MANIFEST_NAME),
            format!("pid {pid} has no recorded owner (real, effective, saved and fs ids)"),
        ));
    }
    let core_path = images.path().join(ckpt_image::core_name(pid));
    let Some(creds) = &core.creds else {
        return Err(invalid(core_path, "no credentials".into()));
    };
    if creds.uids != entry.uids || creds.gids != entry.gids {
        return Err(invalid(
            core_path,
            format!(
                "credentials (uids {:?}, gids {:?}) are not those pid {pid} had when dumped (uids {:?}, gids {:?})",
                creds.uids, creds.gids, entry.uids, entry.gids
            ),
        ));
    }
    Ok(())
}

/// Kills and reaps the half-built child unless disarmed.
struct ChildGuard {
    pid: i32,
    armed: std::cell::Cell<bool>,
}

impl ChildGuard {
    fn disarm(&self) {
        self.armed.set(false);
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if !self.armed.get() {
            return;
        }
        let p = Pid::from_raw(self.pid);
        // Bounded: a PID namespace's init dies only after every task of
        // its namespace is collected, and one that is not (still exiting,
        // or never held) must not keep a failed restore from ending. The
        // restorer's exit lets go of what it still traces.
        let until = Instant::now() + held::DEATH_WAIT;
        let mut killed = false;
        loop {
            let status = waitpid(p, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG));
            // Collected, now or before (a held root's drop does): its pid
            // may be anyone's by now, and is not signalled.
            if matches!(
                status,
                Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) | Err(_)
            ) {
                return;
            }
            if !killed {
                let _ = kill(p, Signal::SIGKILL);
                killed = true;
            }
            // A stop on the way out: let it go on dying (the kill is
            // pending, so it runs nothing).
            if matches!(
                status,
                Ok(WaitStatus::PtraceEvent(..) | WaitStatus::Stopped(..))
            ) {
                let _ = nix::sys::ptrace::cont(p, None);
            }
            if Instant::now() >= until {
                log::warn!(
                    "pid {}: the restored root has not died after {:?}",
                    self.pid,
                    held::DEATH_WAIT
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// The restorer's pidfd, inherited by the processes of a tree restored into
/// a new PID namespace (see [`fd::RESTORER_PIDFD`]), while it lives.
struct RestorerPidfd {
    _fd: std::os::fd::OwnedFd,
}

impl RestorerPidfd {
    /// Above every fd number of the tree, so no fd restored replaces it
    /// before the last process has taken what it needs.
    fn new(procs: &[ProcessImages]) -> Result<RestorerPidfd> {
        use std::os::fd::AsRawFd;
        let above = procs
            .iter()
            .flat_map(|p| p.fds.fds.iter().map(|f| f.fd))
            .max()
            .map_or(0, |m| m.saturating_add(1));
        let fd = sys::own_pidfd_at_least(above)
            .map_err(|e| RestoreError::os(std::process::id() as i32, "pidfd of the restorer", e))?;
        fd::RESTORER_PIDFD.store(fd.as_raw_fd(), std::sync::atomic::Ordering::Relaxed);
        Ok(RestorerPidfd { _fd: fd })
    }
}

impl Drop for RestorerPidfd {
    fn drop(&mut self) {
        fd::RESTORER_PIDFD.store(fd::NO_PIDFD, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Creates the root as PID 1 of a new PID namespace (`root` is its pid in
/// the image, which must be 1), stopped and traced by us.
fn spawn_in_new_pidns(root: i32, ns_flags: u64) -> Result<ChildGuard> {
    const NS_INIT_PID: i32 = 1;
    if root != NS_INIT_PID {
        return Err(RestoreError::Host {
            pid: root,
            what: "the image's PID namespace root is not pid 1".into(),
        });
    }
    let got = sys::fork_stopped_in_new_pidns(ns_flags)
        .map_err(|e| RestoreError::os(root, "clone3 with CLONE_NEWPID", e))?;
    let guard = ChildGuard {
        pid: got,
        armed: true.into(),
    };
    match waitpid(Pid::from_raw(got), Some(WaitPidFlag::__WALL)) {
        Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) => Ok(guard),
        other => Err(RestoreError::os(
            root,
            format!("new PID namespace's init did not stop as expected: {other:?}"),
            std::io::Error::other("unexpected child state"),
        )),
    }
}

/// Creates the child with the original pid, stopped and traced by us.
fn spawn(pid: i32, ns_flags: u64, opts: &RestoreOptions<'_>) -> Result<ChildGuard> {
    let deadline = Instant::now() + opts.pid_wait;
    loop {
        pid::wait_free(
            pid,
            deadline.saturating_duration_since(Instant::now()),
            opts.notice,
        )?;
        match sys::fork_stopped_with_pid(pid, ns_flags) {
            Ok(got) => {
                let guard = ChildGuard {
                    pid: got,
                    armed: true.into(),
                };
                match waitpid(Pid::from_raw(got), Some(WaitPidFlag::__WALL)) {
                    Ok(WaitStatus::Stopped(_, Signal::SIGSTOP)) => return Ok(guard),
                    other => {
                        return Err(RestoreError::os(
                            pid,
                            format!("new process did not stop as expected: {other:?}"),
                            std::io::Error::other("unexpected child state"),
                        ));
                    }
                }
            }
            // Taken between our check and clone3 (or a zombie not yet
            // visible as one): check again.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(RestoreError::os(pid, "clone3 with set_tid", e)),
        }
    }
}

/// The address space of one process: everything before it forks its
/// children.
fn rebuild_memory(
    t: &Tracee,
    base: u64,
    p: &ProcessImages,
    pages: &Arc<memmap2::Mmap>,
    server: Option<(&mut lazy::PageServer, Option<ckpt_image::BlockChecks>)>,
    fds: &mut fd::Context<'_>,
    opts: &RestoreOptions<'_>,
) -> Result<()> {
    let pid = t.pid();
    let core = &p.core;
    let child_maps = mm::read_maps(pid)?;
    let r = ckpt_parasite::remote::Remote { t, base };

    // The child inherited the restorer's rseq registration, which points
    // into memory about to be replaced.
    let rs = t.rseq()?;
    if rs.rseq_abi_pointer != 0 {
        r.call(
            "rseq (unregister)",
            libc::SYS_rseq,
            [
                rs.rseq_abi_pointer,
                rs.rseq_abi_size as u64,
                1,
                rs.signature as u64,
                0,
                0,
            ],
        )?;
    }
    let vdso = match &p.mm.vdso {
        Some(v) => mm::vdso_plan(pid, &r, &child_maps, v)?,
        None => mm::VdsoPlan::Same,
    };
    match vdso {
        mm::VdsoPlan::Same => mm::clear_and_move_specials(&r, &child_maps, &p.mm)?,
        mm::VdsoPlan::Proxy { here } => {
            let here_base = mm::clear_and_park_specials(&r, &child_maps, &p.mm)?;
            mm::map_vdso_proxy(&r, &p.mm, core, &here, here_base)?;
        }
    }
    for v in &p.mm.vmas {
        log::debug!(
            "pid {pid}: VMA {:#x}-{:#x} prot {:#x} {}{}",
            v.start,
            v.end,
            v.prot,
            if v.path.is_empty() { "-" } else { &v.path },
            if v.inherited { " (inherited)" } else { "" }
        );
    }
    // The objects live in the context's state, next to the checks both use.
    let images = fds.images;
    let mut objects = std::mem::take(fds.state::<shmem::Objects>());
    let mapped = mm::map_vmas(
        &r,
        &p.mm,
        fds.checks(),
        images,
        &mut objects,
        core.creds.as_ref(),
    );
    *fds.state::<shmem::Objects>() = objects;
    mapped?;
    ckpt_parasite::fault::inject(ckpt_parasite::fault::FaultPoint::MidRebuild);
    inherit::drop_pages(&r, &p.mm)?;
    let name = ckpt_image::pages_name(p.pid);
    match server {
        None => pages::fill_pages(&r, &p.mm, images, &name, pages, opts.progress)?,
        Some((server, checks)) => {
            let mut split =
                pages::layout::split(&p.mm, pages::plan(pid, &p.mm, pages.len() as u64)?);
            log::debug!(
                "pid {pid}: {} pieces copied now, {} served on demand in {} VMAs",
                split.eager.len(),
                split.lazy.len(),
                split.ranges.len()
            );
            let eager = std::mem::take(&mut split.eager);
            // What is copied now is checked now, block by block.
            let blocks = checks.map(lazy::Blocks::new);
            if let Some(b) = &blocks {
                for c in &eager {
                    b.check(pages, c.file_offset, c.file_len)?;
                }
            }
            pages::copy_listed(&r, eager, pages, p.mm.pages_bytes, opts.progress)?;
            // Nothing to serve: no userfaultfd either.
            if !split.lazy.is_empty() {
                let path = images.path().join(&name).display().to_string();
                server.add(lazy::prepare(&r, path, Arc::clone(pages), split, blocks)?);
            }
        }
    }
    let mm_fields = core.mm.as_ref().expect("validated");
    let exe = mm::Exe {
        path: &core.exe,
        mm: &p.mm,
        creds: core.creds.as_ref(),
    };
    mm::set_mm_fields(&r, mm_fields, &exe, fds.checks())?;
    Ok(())
}

/// Everything after the address space: files, signals, threads,
/// credentials, and the registers last. Returns the other threads, stopped
/// like the leader until the tree resumes.
fn rebuild_process(
    t: &Tracee,
    base: u64,
    p: &ProcessImages,
    fds: &mut fd::Context<'_>,
    opts: &RestoreOptions<'_>,
) -> Result<held::NewThreads> {
    let pid = t.pid();
    let core = &p.core;
    let r = ckpt_parasite::remote::Remote { t, base };

    // After the children are forked: a limit the parent had (RLIMIT_AS,
    // RLIMIT_NPROC) must not stop them from being rebuilt.
    task::restore_rlimits(pid, core, opts.notice)?;
    for f in &p.fds.fds {
        let kind = fds
            .files
            .get(f.file_id)
            .map_or("missing", |x| x.kind_name());
        log::debug!("pid {pid}: fd {}: {kind} (open file {})", f.fd, f.file_id);
    }
    fd::restore(fds, &r, &p.fds, core.creds.as_ref())?;
    task::restore_misc(&r, core)?;
    task::restore_sigactions(&r, core)?;
    task::queue_pending(&r, pid, &core.pending)?;
    // Threads are created while the leader still has the privileges clone3
    // with set_tid needs; credentials are per thread in the kernel.
    let shared_filters = seccomp::install_shared(&r, core)?;
    let threads = thread::spawn(&r, core)?;
    for th in threads.iter() {
        log::debug!("pid {pid}: thread {}", th.pid());
    }
    if !threads.is_empty() {
        ckpt_parasite::fault::inject(ckpt_parasite::fault::FaultPoint::RestoreThreadsCreated);
    }
    // After the threads: a timer may signal one of them.
    timer::create(&r, &core.posix_timers)?;
    sched::restore(&r, &threads, core, opts.notice)?;
    prctl::restore_before_creds(&r, core)?;
    seccomp::install_own(&r, &threads, core, shared_filters)?;
    creds::restore(&r, pid, core.creds.as_ref())?;
    for (th, tc) in threads.iter().zip(&core.threads) {
        let own = tc.creds.as_ref().or(core.creds.as_ref());
        creds::restore(&ckpt_parasite::remote::Remote { t: th, base }, pid, own)?;
    }
    timer::arm(&r, &core.posix_timers)?;
    prctl::restore_after_creds(&r, &threads, core)?;
    thread::finish(&threads, core)?;

    // Last syscall: unmap the scratch area, stopping at its exit because
    // the instruction after it is gone; then the process's own registers.
    let regs = ckpt_parasite::restart_regs(
        &task::regs_from_image(core.regs.as_ref().expect("validated")),
        false,
    );
    let ret = t.syscall_stop_at_exit(
        r.base,
        libc::SYS_munmap,
        [r.base, ckpt_parasite::remote::SCRATCH_LEN, 0, 0, 0, 0],
    )?;
    ckpt_parasite::check_ret(pid, "munmap (scratch)", ret)?;
    // Only now: a signal that became pending meanwhile (a timer firing)
    // must not stop the munmap; it is delivered once the process runs.
    t.set_sigmask(core.sigmask)?;
    t.set_regs(&regs)?;
    t.set_xstate(&core.xstate)?;
    stopped::stop(pid, core.pid, core.job_stop.as_ref())?;
    Ok(threads)
}
