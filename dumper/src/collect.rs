//! Phase 2, collect: everything about the frozen tree, read through the
//! parasite (what only a task knows), ptrace and /proc, gathering what
//! cannot be saved instead of stopping at the first. Nothing is written
//! here; the result goes to the write phase whole.

use std::collections::HashMap;
use std::time::Instant;

use ckpt_image::ipc::Ipc;
use ckpt_image::mm::{Vma, WriteTracking};
use ckpt_parasite::uffd::Userfault;

use crate::blockers::Blockers;
use crate::error::Result;
use crate::ns::TreeNamespaces;
use crate::owner::owner;
use crate::stats::ms_since;
use crate::translate::{HostCore, SavedPids, translate_pids};
use crate::{
    DrainOptions, Frozen, WriteOptions, background, fd, ib, inherit, ipc, mm, pages, pidns,
    predump, seccomp, shapes, shared_tables, shmem, task, tree,
};

/// Everything collected about one frozen process, ready to be written.
pub(crate) struct Collected {
    pub pid: i32,
    /// Its pid as the image records it (see [`crate::translate`]): how a
    /// previous image ([`WriteOptions::prev`]) knows the process.
    pub saved_pid: i32,
    pub ppid: i32,
    pub core: ckpt_image::task::Core,
    pub vmas: Vec<ckpt_image::mm::Vma>,
    pub vdso: Option<ckpt_image::mm::VdsoInfo>,
    /// Its aio contexts' rings, saved apart from the VMAs.
    pub aio_rings: Vec<ckpt_image::aio::AioRing>,
    pub pages_bytes: u64,
    /// Bytes of dumpable VMAs the plan leaves out.
    pub untouched_bytes: u64,
    /// Its memory, readable after a thaw.
    pub mem: pages::Memory,
    /// With `--background`: the userfaultfd guarding its memory; with
    /// `--pre-dump` or `--track`: the one tracking its writes from now on.
    pub uffd: Option<ckpt_parasite::uffd::Userfault>,
    /// With `--pre-dump`: how its writes are tracked from now on.
    pub tracking: Option<ckpt_image::mm::WriteTracking>,
    /// With `--prev`: what it wrote since the pre-dump.
    pub written: Option<predump::Written>,
    /// With `--background`: its pages, write-protected or not.
    pub armed: Option<background::Split>,
    /// With `--prev`: the pre-dump's tracker, ended in the process; ckpt's
    /// copy is closed once the tree runs again.
    pub retired: Option<ckpt_parasite::uffd::Userfault>,
}

/// What a dump does with userfaultfds in the processes.
#[derive(Clone, Copy)]
pub(crate) enum Userfaults<'a> {
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
    pub(crate) fn of<'a>(opts: &'a WriteOptions<'a>) -> Userfaults<'a> {
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

    /// The earlier pre-dump's tracking of the process it saved as `pid`.
    fn before(&self, pid: i32) -> Option<&ckpt_image::mm::WriteTracking> {
        match self {
            Userfaults::Track(o) | Userfaults::Untrack(o) => {
                o.prev?.process(pid)?.tracking.as_ref()
            }
            _ => None,
        }
    }
}

/// Everything collected about a frozen tree, ready to be written: all of
/// it can be saved (or collecting failed with the whole list of what
/// cannot).
pub(crate) struct CollectedTree {
    /// The live processes, tree order.
    pub procs: Vec<Collected>,
    /// Threads of the live processes (each leader counts as one).
    pub threads: usize,
    /// Shared memory objects, each once.
    pub objects: shmem::Objects,
    /// The namespaces of the tree.
    pub namespaces: TreeNamespaces,
    /// The SysV IPC objects of the tree.
    pub ipc: Ipc,
    /// Every fd and open file description of the tree.
    pub files: fd::TreeFiles,
    /// The tree namespace's pids, when the tree fills its own.
    pub pids: Option<pidns::PidMap>,
    /// How many fds the tree has.
    pub fds: usize,
    /// How long collecting took.
    pub collect_ms: f64,
}

/// Collects the whole tree, live processes first, then what they share
/// (memory, files, namespaces, IPC), and checks the tree's shape. From
/// here on the collected state speaks the pids the image records (see
/// [`crate::translate`]); the host's stay in `frozen` for reading the
/// processes.
pub(crate) fn tree(frozen: &mut Frozen, opts: &WriteOptions<'_>) -> Result<CollectedTree> {
    let root = frozen.root;
    let collect_started = Instant::now();
    let live: Vec<&tree::FrozenProcess> = frozen
        .procs
        .iter()
        .filter(|p| p.zombie_status.is_none())
        .collect();
    let threads = live.iter().map(|p| p.tasks.len()).sum();
    let live_pids: Vec<i32> = live.iter().map(|p| p.pid).collect();
    // Read first: a previous image knows the processes by these pids.
    let pids = match frozen.ns {
        pidns::TreeNs::Ckpt => None,
        pidns::TreeNs::RootInit { .. } => Some(pidns::PidMap::read(&frozen.procs)?),
    };
    let saved = SavedPids(pids.as_ref());
    // Gathering what cannot be saved instead of stopping at the first:
    // the user gets the whole list in one run.
    let mut blockers = Blockers::default();
    let mut procs = Vec::new();
    for p in &live {
        if let Some(c) = blockers.absorb(collect_process(p, Userfaults::of(opts), &saved))? {
            procs.push(c);
        }
    }
    // Every parasite is gone: the connections may go into repair mode now,
    // with the tree held (their state is read with the files below).
    frozen.tcp = Some(repair_tcp(
        root,
        &frozen.procs,
        frozen.drain_opts.unwrap_or_default(),
    )?);
    frozen
        .retired
        .extend(procs.iter_mut().filter_map(|c| c.retired.take()));
    let mut objects = share_memory(&mut procs, &mut blockers)?;
    let namespaces = blockers
        .absorb(crate::ns::collect(root, &live_pids, frozen.ns))?
        .unwrap_or_default();
    let mut ipc = blockers
        .absorb(namespaces.in_ipc(root, || collect_ipc(root, &procs)))?
        .unwrap_or_default();
    let fds_started = Instant::now();
    let mut files = collect_files(root, &procs, &namespaces, opts, &mut blockers)?;
    if let Some(tcp) = &frozen.tcp {
        tcp.record_lock(&mut files);
    }
    blockers.absorb(objects.link_files(&mut files))?;
    blockers.absorb(check_shapes(&procs, &frozen.procs))?;
    let in_sessions: Vec<shared_tables::InSession> = procs
        .iter()
        .map(|c| shared_tables::InSession {
            pid: c.pid,
            ppid: c.ppid,
            sid: c.core.sid,
            shared: c.core.shared_with_parent,
        })
        .collect();
    shared_tables::check_sessions(&in_sessions, &mut blockers)?;
    fd::link_controlling_terminals(procs.iter_mut().map(|c| &mut c.core), &files);
    if let Some(map) = &pids {
        let cores = procs.iter_mut().map(|c| HostCore {
            pid: c.pid,
            core: &mut c.core,
        });
        blockers.absorb(translate_pids(map, cores, &mut files, &mut ipc))?;
    }
    let fds: usize = files.tables.iter().map(|(_, t)| t.fds.len()).sum();
    log::info!(
        "collect fds: {fds} fds, {} open files ({:.3} ms)",
        files.files.files.len(),
        ms_since(fds_started)
    );
    let mut all = frozen.blockers.clone();
    all.extend(blockers);
    all.into_result()?;
    // Only now, nothing refusing the dump: this cannot be given back.
    namespaces.in_net(root, || fd::take_unaccepted(&mut files))?;
    Ok(CollectedTree {
        procs,
        threads,
        objects,
        namespaces,
        ipc,
        files,
        pids,
        fds,
        collect_ms: ms_since(collect_started),
    })
}

/// Links each shared memory object to the VMAs that map it (each saved
/// once, whoever maps it), and leaves private memory still shared with a
/// parent since fork to the parent.
fn share_memory(procs: &mut [Collected], blockers: &mut Blockers) -> Result<shmem::Objects> {
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
    Ok(objects)
}

/// Every fd of the tree, in the network namespace of its root.
fn collect_files(
    root: i32,
    procs: &[Collected],
    namespaces: &TreeNamespaces,
    opts: &WriteOptions<'_>,
    blockers: &mut Blockers,
) -> Result<fd::TreeFiles> {
    // A tracking userfaultfd left in a process is ckpt's, not the job's.
    let kept: HashMap<i32, i32> = procs
        .iter()
        .filter_map(|c| Some((c.pid, c.tracking.as_ref()?.fd)))
        .collect();
    namespaces.in_net(root, || {
        fd::collect_tree(
            &procs.iter().map(|c| c.pid).collect::<Vec<_>>(),
            opts.externals,
            &|pid, fd| kept.get(&pid) == Some(&fd),
            opts.kill_after,
            blockers,
        )
    })
}

/// Refuses sessions and process groups a restore cannot rebuild.
fn check_shapes(procs: &[Collected], frozen: &[tree::FrozenProcess]) -> Result<()> {
    shapes::check(
        &procs
            .iter()
            .map(|c| shapes::Member {
                pid: c.pid,
                ppid: c.ppid,
                sid: c.core.sid,
                pgid: c.core.pgid,
            })
            .collect::<Vec<_>>(),
        frozen,
    )
}

/// What a dump leaves or ends inside one process through its parasite,
/// besides reading its task state.
#[derive(Default)]
struct InProcess {
    /// The verbs layer's state, drained.
    ib: Option<ckpt_image::ib::IbLayer>,
    /// The userfaultfd made in the process (see [`Userfaults`]).
    uffd: Option<Userfault>,
    /// The tracking the pre-dump's record names, ended in the process; its
    /// last record of written pages is read before a new tracker is armed.
    continued: Option<Userfault>,
    /// With `--pre-dump` or `--track`: how writes are tracked from now on.
    tracking: Option<WriteTracking>,
}

pub(crate) fn collect_process(
    p: &tree::FrozenProcess,
    mode: Userfaults<'_>,
    saved: &SavedPids<'_>,
) -> Result<Collected> {
    let pid = p.pid;
    let started = Instant::now();
    let leader = &p.tasks[0];
    log::debug!("pid {pid}: thread {pid} (leader)");
    for t in &p.tasks[1..] {
        log::debug!("pid {pid}: thread {}", t.pid());
    }
    let (core, mut inside) = collect_core(p, mode, saved.pid(p.pid), started)?;
    let (vmas, pages_bytes, armed) = plan_memory(pid, mode, inside.uffd.as_ref(), started)?;
    let vdso = mm::vdso_info(leader, &vmas)?;
    let aio_rings = crate::aio::collect(pid)?;
    // Only through a tracking userfaultfd that is still the pre-dump's:
    // without it the written bits would be nobody's (or the job's own
    // userfaultfd's), and everything is read from the process.
    let written = match inside.continued {
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
            drop(inside.continued.take());
            None
        }
        _ => inside.continued.take(),
    };
    if let (Userfaults::Track(_), Some(u)) = (mode, &inside.uffd) {
        predump::arm(u, &vmas)?;
    }
    let untouched_bytes = untouched_bytes(pid, &vmas);
    log::info!(
        "collect pid {pid} ({}): {} threads, {} VMAs, {pages_bytes} bytes of pages planned ({:.3} ms)",
        core.comm,
        p.tasks.len(),
        vmas.len(),
        ms_since(started)
    );
    Ok(Collected {
        pid,
        saved_pid: saved.pid(pid),
        ppid: p.ppid,
        core,
        vmas,
        vdso,
        aio_rings,
        pages_bytes,
        untouched_bytes,
        mem: pages::Memory::of(leader)?,
        uffd: inside.uffd,
        tracking: inside.tracking,
        written,
        armed,
        retired,
    })
}

/// The task state of every thread of `p`, and what `mode` does inside the
/// process while its parasite is there.
fn collect_core(
    p: &tree::FrozenProcess,
    mode: Userfaults<'_>,
    saved_pid: i32,
    started: Instant,
) -> Result<(ckpt_image::task::Core, InProcess)> {
    let pid = p.pid;
    let leader = &p.tasks[0];
    let before = mode.before(saved_pid);
    // A pre-dump only copies memory ahead: the verbs state is drained by
    // the dump that follows it.
    let predumping = matches!(mode, Userfaults::Track(_));
    let ib_layer = ib::find(pid)?.filter(|_| !predumping);
    if let Some(l) = &ib_layer {
        ib::quiesce(pid, &p.tasks, p.job_stop.is_some(), l)?;
    }
    let mut inside = InProcess::default();
    let mut with_parasite = |inf: &ckpt_parasite::Infection<'_>| -> Result<()> {
        // First: the drain changes the process's memory, which everything
        // after it saves.
        if let Some(l) = &ib_layer {
            inside.ib = Some(ib::drain(inf, pid, l)?);
        }
        inside.continued = predump::retire(inf, pid, before)?;
        userfaults_in(inf, pid, mode, &mut inside)
    };
    // Before the parasite: what the frozen tasks' status says, including
    // the signals each has pending, which the parasite must not take.
    let tids: Vec<i32> = p.tasks.iter().map(|t| t.pid()).collect();
    let texts = crate::procfile::task_texts(pid, &tids)?;
    let (misc, threads) = task::run_parasite(leader, &p.tasks[1..], &texts, &mut with_parasite)?;
    log::debug!("pid {pid}: parasite done ({:.3} ms)", ms_since(started));
    let mut core = task::collect(leader, &misc, &texts[0])?;
    core.job_stop = p.job_stop;
    core.shared_with_parent = p.shared_with_parent;
    core.ib = inside.ib.take();
    for ((t, state), x) in p.tasks[1..].iter().zip(threads).zip(&texts[1..]) {
        core.threads.push(task::collect_thread(t, pid, state, x)?);
    }
    seccomp::collect(pid, &p.tasks, &texts, &mut core)?;
    Ok((core, inside))
}

/// Makes the userfaultfd `mode` asks for inside process `pid`.
fn userfaults_in(
    inf: &ckpt_parasite::Infection<'_>,
    pid: i32,
    mode: Userfaults<'_>,
    inside: &mut InProcess,
) -> Result<()> {
    use ckpt_parasite::uffd;
    match mode {
        Userfaults::Untouched | Userfaults::Untrack(_) => {}
        Userfaults::Background => inside.uffd = Some(uffd::create_in(inf)?),
        Userfaults::Track(_) => {
            let (u, fd) = uffd::create_kept_in(inf, predump::kept_fd_floor(pid))?;
            let t = WriteTracking {
                fd,
                inode: u.inode()?,
                start_time: predump::start_time(pid)?,
            };
            predump::record(pid, &t);
            inside.tracking = Some(t);
            inside.uffd = Some(u);
        }
    }
    Ok(())
}

/// The VMAs of `pid` with their pages planned, how many bytes of pages
/// that is, and for a background dump its memory write-protected.
fn plan_memory(
    pid: i32,
    mode: Userfaults<'_>,
    uffd: Option<&Userfault>,
    started: Instant,
) -> Result<(Vec<Vma>, u64, Option<background::Split>)> {
    // smaps is read on another core while the pages are planned and, for
    // a background dump, write-protected: all three walk the page tables
    // of the whole address space, and only smaps' VmFlags are needed.
    std::thread::scope(|s| -> Result<_> {
        let flags = s.spawn(|| {
            let f = mm::read_vm_flags(pid);
            log::debug!("pid {pid}: smaps read ({:.3} ms)", ms_since(started));
            f
        });
        let planned = (|| -> Result<_> {
            let mut vmas = mm::collect_vmas_unflagged(pid)?;
            let pages_bytes = mm::plan_pages(pid, &mut vmas)?;
            log::debug!("pid {pid}: pages planned ({:.3} ms)", ms_since(started));
            let armed = match (mode, uffd) {
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
    })
}

/// Bytes of private and anonymous mappings of `pid` the plan leaves out
/// (logging each VMA's share).
fn untouched_bytes(pid: i32, vmas: &[Vma]) -> u64 {
    let mut untouched = 0;
    for v in vmas {
        let kind = ckpt_image::mm::VmaKind::try_from(v.kind);
        let saved: u64 = v.pages.iter().map(|r| r.len()).sum();
        if matches!(
            kind,
            Ok(ckpt_image::mm::VmaKind::Anon
                | ckpt_image::mm::VmaKind::FilePrivate
                | ckpt_image::mm::VmaKind::ShmemPrivate)
        ) {
            untouched += (v.end - v.start).saturating_sub(saved);
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
    untouched
}

/// Switches the established TCP connections of `procs` that `opts` chose
/// to repair mode. First every running process of the tree is held
/// (`TcpRepair::hold`), so none runs its own code while a connection is in
/// repair mode even if ckpt dies; nothing may run code in the tree from
/// here on (no parasite), which would take the hold.
fn repair_tcp(
    root: i32,
    procs: &[tree::FrozenProcess],
    opts: DrainOptions,
) -> Result<fd::inet::TcpRepair> {
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
        lock: opts.network_lock,
        root,
    };
    let hold = |tcp: &mut fd::inet::TcpRepair| -> Result<()> {
        for p in &running {
            tcp.hold(p.pid, &p.tasks)?;
        }
        Ok(())
    };
    fd::inet::TcpRepair::start(&live, &running_pids, policy, hold)
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
