//! Creating every process of the tree (each forked by its restored
//! parent, so parenthood, sessions and groups come out right, zombies
//! included), then rebuilding each.

use std::time::Instant;

use ckpt_parasite::Tracee;
use ckpt_parasite::remote::Remote;

use super::process::{self, Served};
use crate::context::RestoreContext;
use crate::error::{RestoreError, Result};
use crate::held::{ChildrenFirst, Held};
use crate::options::RestoreOptions;
use crate::outcome::ms_since;
use crate::pages;
use crate::read::{Checkpoint, ProcessImages};
use crate::{fd, lazy, mm, shapes, task, tree};

/// What building the processes carries from one to the next.
pub(super) struct Build<'a> {
    /// With lazily served processes: the page server they are added to.
    pub server: Option<lazy::PageServer>,
    /// What the restore shares across resources.
    pub cx: RestoreContext<'a>,
    /// The fd restore's tables.
    pub fds: fd::Tables,
}

/// The tree, every process built and held stopped.
pub(super) struct Built {
    /// Tree order (parents first), dropped children first.
    pub tracees: ChildrenFirst<Held>,
    /// Where the root's session came from.
    pub session: task::SessionOrigin,
}

/// Creates every process of the tree, then rebuilds each (processes of
/// `ck`, `host_root` its root as the restorer sees it; `blocks`: per
/// process, the block checksums its lazily served pages are checked with).
pub(super) fn build_tree(
    host_root: i32,
    ck: &Checkpoint,
    blocks: &[Option<ckpt_image::BlockChecks>],
    b: &mut Build<'_>,
    opts: &RestoreOptions<'_>,
) -> Result<Built> {
    let procs = &ck.procs;
    let (root, base) = prepare_root(host_root, ck)?;
    let session = task::restore_session(&Remote { t: &root, base }, &procs[0].core, true)?;
    take_controlling_terminal(&Remote { t: &root, base }, &procs[0].core, b)?;
    // Tree order: a parent's memory is back before its children are forked
    // from it, so private pages they still shared at the dump are shared
    // again (one copy, as after the original fork). Everything else is
    // restored afterwards, in tree order.
    // The root's session from outside the tree, if it had one.
    let adopted = (session == task::SessionOrigin::Adopted).then_some(procs[0].core.sid);
    let mut slots: ChildrenFirst<Option<Held>> =
        ChildrenFirst(procs.iter().map(|_| None).collect());
    slots[0] = Some(Held::new(root));
    let buffers = pages::ReadBuffers::default();
    std::thread::scope(|s| {
        let mut filling = Filling::new(s);
        for (i, p) in procs.iter().enumerate() {
            let t = slots[i]
                .as_ref()
                .expect("parents come before their children");
            let r = Remote { t, base };
            let started = Instant::now();
            let served = b
                .server
                .as_mut()
                .filter(|_| ck.lazy[i])
                .map(|server| Served {
                    server,
                    checks: blocks[i].clone(),
                });
            let fill = process::rebuild_memory(&r, p, &ck.pages[i], &buffers, served, &mut b.cx)?;
            log::debug!(
                "pid {}: memory rebuilt ({:.3} ms)",
                p.pid,
                ms_since(started)
            );
            if let Some(fill) = fill {
                // What a child is forked with must be there before it is.
                if forks_any(p, ck) {
                    fill.run()?;
                } else {
                    filling.start(fill)?;
                }
            }
            for (j, child) in fork_children(&r, p, ck, adopted, b)? {
                slots[j] = Some(child);
            }
        }
        filling.finish()
    })?;
    let mut tracees = ChildrenFirst(
        std::mem::take(&mut slots.0)
            .into_iter()
            .map(|t| t.expect("check_tree: every process has a parent in the tree"))
            .collect::<Vec<Held>>(),
    );
    rebuild_each(&mut tracees, procs, base, b, opts)?;
    b.cx.shmem.seal_all()?;
    Ok(Built { tracees, session })
}

/// Whether `p` forks a process, live or zombie, when rebuilt.
fn forks_any(p: &ProcessImages, ck: &Checkpoint) -> bool {
    ck.procs.iter().any(|c| c.ppid == p.pid) || ck.zombies.iter().any(|z| z.ppid == p.pid)
}

/// The copies of pages running beside the rebuild of the next processes:
/// a copy is mostly waiting for the storage and faulting in new pages,
/// and the tracer's work on the next process (remote syscalls, ptrace
/// stops) overlaps it. Restoring a tree's processes one after another,
/// each read front to back, left the storage idle between them.
struct Filling<'scope, 'env> {
    scope: &'scope std::thread::Scope<'scope, 'env>,
    running: std::collections::VecDeque<std::thread::ScopedJoinHandle<'scope, Result<()>>>,
}

/// Copies running at once. Each spreads over the pool's threads already;
/// a second one fills the gap at the start and end of the first (its
/// first read, its last pieces), more would only hold more buffers.
const FILLS_AT_ONCE: usize = 2;

impl<'scope, 'env> Filling<'scope, 'env> {
    fn new(scope: &'scope std::thread::Scope<'scope, 'env>) -> Self {
        Filling {
            scope,
            running: std::collections::VecDeque::new(),
        }
    }

    /// Starts `fill` once fewer than [`FILLS_AT_ONCE`] run; the first
    /// error of the ones waited for.
    fn start(&mut self, fill: pages::PageFill<'env>) -> Result<()> {
        while self.running.len() >= FILLS_AT_ONCE {
            self.wait_oldest()?;
        }
        let pid = fill.pid();
        let handle = std::thread::Builder::new()
            .name(format!("fill {pid}"))
            .spawn_scoped(self.scope, move || fill.run())
            .map_err(|e| RestoreError::Host {
                pid,
                what: format!("cannot start the copy of its pages: {e}"),
            })?;
        self.running.push_back(handle);
        Ok(())
    }

    fn wait_oldest(&mut self) -> Result<()> {
        match self.running.pop_front() {
            Some(h) => h
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            None => Ok(()),
        }
    }

    /// Waits for every copy; the first error.
    fn finish(mut self) -> Result<()> {
        let mut first = Ok(());
        while !self.running.is_empty() {
            let r = self.wait_oldest();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// Takes the stopped root, blocks every signal for the whole tree and
/// maps the scratch area the rebuild runs from; returns the root and the
/// area's address.
fn prepare_root(host_root: i32, ck: &Checkpoint) -> Result<(Tracee, u64)> {
    let root = Tracee::adopt_stopped_child(host_root)?;
    // Nothing may be delivered until the very end; children inherit this.
    root.set_sigmask(!0)?;
    let child_maps = mm::read_maps(root.pid())?;
    let mut busy: Vec<(u64, u64)> = child_maps.iter().map(|m| (m.start, m.end)).collect();
    busy.extend(
        ck.procs
            .iter()
            .flat_map(|p| p.mm.vmas.iter().map(|v| (v.start, v.end))),
    );
    busy.extend(ck.procs.iter().flat_map(|p| crate::aio::spans(&p.mm)));
    let no_room = |what: &str| RestoreError::Incompatible {
        dir: ck.images.path().into(),
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
    let base = Remote::map(&root, code, at)?.base;
    Ok((root, base))
}

/// Forks the children of `p` (through `r`) with their groups and
/// sessions, and its zombies; returns the live children with their
/// places in the tree order, held at once: a step failing below kills
/// them unrun.
fn fork_children(
    r: &Remote<'_>,
    p: &ProcessImages,
    ck: &Checkpoint,
    adopted: Option<i32>,
    b: &mut Build<'_>,
) -> Result<Vec<(usize, Held)>> {
    let base = r.base;
    let zombies = || ck.zombies.iter().filter(|z| z.ppid == p.pid);
    let mut forked = Vec::new();
    let mut leaders = shapes::Leaders::default();
    leaders.fork_zombie_leaders(r, zombies())?;
    for (j, c) in ck.procs.iter().enumerate().filter(|(_, c)| c.ppid == p.pid) {
        let child = Held::new(leaders.fork_member(r, &p.core, c.pid, &c.core)?);
        shapes::ensure_group(&Remote { t: &child, base }, &c.core, adopted)?;
        task::restore_session(&Remote { t: &child, base }, &c.core, false)?;
        take_controlling_terminal(&Remote { t: &child, base }, &c.core, b)?;
        forked.push((j, child));
    }
    let mut early = leaders.finish(r)?;
    for z in zombies() {
        let child = match early.remove(&z.pid) {
            Some(t) => t,
            None => tree::fork_child(r, z.pid)?,
        };
        let zr = Remote { t: &child, base };
        shapes::join_zombie_group(&zr, z, adopted)?;
        log::debug!("pid {}: zombie (status {:#x})", z.pid, z.status);
        task::set_name(&zr, &z.comm)?;
        tree::make_zombie(&zr, z.status)?;
    }
    Ok(forked)
}

/// A session leader's controlling terminal, taken back as soon as it
/// leads its session: the processes it forks after inherit it.
fn take_controlling_terminal(
    r: &Remote<'_>,
    core: &ckpt_image::task::Core,
    b: &mut Build<'_>,
) -> Result<()> {
    match &core.ctty {
        Some(ctty) if core.sid == core.pid => {
            fd::take_controlling_terminal(&mut b.cx, &mut b.fds, r, ctty)
        }
        _ => Ok(()),
    }
}

/// Rebuilds every process past its memory, tree order.
fn rebuild_each(
    tracees: &mut ChildrenFirst<Held>,
    procs: &[ProcessImages],
    base: u64,
    b: &mut Build<'_>,
    opts: &RestoreOptions<'_>,
) -> Result<()> {
    for (t, p) in tracees.iter_mut().zip(procs) {
        let started = Instant::now();
        let r = Remote { t, base };
        let threads = process::rebuild_process(&r, p, &mut b.cx, &mut b.fds, opts)
            .map_err(|e| e.of_process(t.pid()))?;
        t.hold_threads(threads);
        t.stop_on_release(crate::stopped::signal_of(p.pid, p.core.job_stop.as_ref())?);
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
    fd::send_in_flight(&mut b.cx, &mut b.fds)
}
