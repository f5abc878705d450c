//! Rebuild, the second phase of a restore: every process of the tree is created
//! and rebuilt, and left stopped. A sequence of named steps, in an order
//! that matters (each step says why it comes where it does); any failure
//! kills what was created, so no half-built process ever runs.

mod build;
mod process;
mod rebound;
mod spawn;

use std::time::Instant;

use ckpt_image::BlockChecks;
use ckpt_image::manifest::Namespaces;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::context::RestoreContext;
use crate::error::Result;
use crate::held::ChildGuard;
use crate::options::RestoreOptions;
use crate::outcome::ms_since;
use crate::read::{Checkpoint, Read};
use crate::resume::Stopped;
use crate::{fd, ib, ipc, lazy, ns, pid};
use build::{Build, Built};
use spawn::RestorerPidfd;

/// Creates every process of the checkpoint read and rebuilds it, leaving
/// all of them stopped.
pub(crate) fn run(read: Read, opts: &RestoreOptions<'_>) -> Result<Stopped> {
    let Read {
        checkpoint: ck,
        shmem,
        mut stats,
        started,
    } = read;
    let rebuild_started = Instant::now();
    let steps = Steps::new(&ck, opts);
    steps.check_pids_free()?;
    steps.check_namespaces()?;
    let created = steps.create_ipc_before_root()?;
    let _pidfd = steps.restorer_pidfd()?;
    // From forking the root until every process is rebuilt, the paths the
    // restorer opens for the processes are those of the tree's mount
    // namespace; an early return goes back too (dropping it).
    let own_mnt = match &opts.mntns {
        Some(target) => Some(ns::enter_mnt(steps.root, target)?),
        None => None,
    };
    let child = steps.create_root()?;
    let host_root = child.pid;
    steps.set_uts(host_root)?;
    let created = steps.create_ipc_in_namespace(host_root, created)?;
    let cx = RestoreContext::new(&ck.images, &ck.files, opts, shmem);
    let server = steps.start_page_server(started)?;
    let mut build = Build {
        server,
        cx,
        fds: fd::Tables::default(),
    };
    let blocks = steps.block_checks()?;
    let built = steps
        .build_and_verify(host_root, &blocks, &mut build)
        .and_then(|built| steps.finish(host_root, built));
    let (built, ib) = match built {
        Ok(done) => done,
        Err(e) => {
            steps.kill_half_built();
            return Err(e);
        }
    };
    stats.phases.rebuild_ms = ms_since(rebuild_started);
    log::info!(
        "rebuild: {} processes rebuilt, stopped ({:.3} ms)",
        built.tracees.len(),
        stats.phases.rebuild_ms
    );
    let stopped = Stopped {
        root: host_root,
        rebound: rebound::collect(steps.root, built.session, &build.fds),
        tracees: built.tracees,
        child,
        stats,
        ipc: created,
        tcp: std::mem::take(&mut build.cx.outside_peers),
        lazy: build.server.take(),
        started,
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

/// What the steps of one rebuild read: the checkpoint, the options, and
/// what follows from them.
struct Steps<'r, 'o> {
    ck: &'r Checkpoint,
    opts: &'r RestoreOptions<'o>,
    /// The root's pid in the image.
    root: i32,
    /// The tree's pids are a PID namespace's own: it is restored into a
    /// new one, where every one is free.
    new_pidns: bool,
    /// The namespaces the tree had of its own.
    namespaces: Option<&'r Namespaces>,
    /// The tree had an IPC namespace of its own.
    own_ipc: bool,
}

impl<'r, 'o> Steps<'r, 'o> {
    fn new(ck: &'r Checkpoint, opts: &'r RestoreOptions<'o>) -> Self {
        let m = ck.images.manifest();
        // Pids of a PID namespace's own come back in a fresh namespace, where
        // every one is free.
        let new_pidns = m.pid_namespace.is_some();
        if new_pidns {
            log::info!(
                "rebuild: the tree's pids are a PID namespace's own: restoring into a new one"
            );
        }
        let namespaces = m.namespaces.as_ref();
        Steps {
            ck,
            opts,
            root: m.root_pid,
            new_pidns,
            namespaces,
            own_ipc: namespaces.is_some_and(|n| n.ipc),
        }
    }

    /// Every pid and thread id must be free (they share the pid space).
    fn check_pids_free(&self) -> Result<()> {
        if self.new_pidns {
            return Ok(());
        }
        let opts = self.opts;
        for z in &self.ck.zombies {
            pid::wait_free(z.pid, opts.pid_wait, opts.notice)?;
        }
        for p in &self.ck.procs {
            if p.pid != self.root {
                pid::wait_free(p.pid, opts.pid_wait, opts.notice)?;
            }
            for tc in &p.core.threads {
                pid::wait_free(tc.tid, opts.pid_wait, opts.notice)?;
            }
        }
        Ok(())
    }

    /// The tree's namespaces can be restored here, into those asked for.
    fn check_namespaces(&self) -> Result<()> {
        ns::check(self.root, self.namespaces)?;
        ns::check_net(self.root, self.namespaces, self.opts.netns.as_ref())?;
        ns::check_mnt(self.root, self.namespaces, self.opts.mntns.as_ref())
    }

    /// IPC objects before any process: a collision fails the restore with
    /// nothing created, and the processes attach what is already there.
    /// Those of an IPC namespace of the tree's own are created in the new
    /// one, right after the root (see `ns.rs`): `None` then.
    fn create_ipc_before_root(&self) -> Result<Option<ipc::Created>> {
        if self.own_ipc {
            return Ok(None);
        }
        ipc::check_free(&self.ck.sysv)?;
        Ok(Some(ipc::create(
            &self.ck.images,
            &self.ck.sysv,
            ipc::Cleanup::Restorer,
        )?))
    }

    /// The restorer's pidfd the processes inherit: every file the
    /// restorer opens for a process is taken with one `pidfd_getfd` on it,
    /// instead of a `pidfd_open` and a `close` around each (in a new PID
    /// namespace, where the restorer has no pid, it is the only way).
    fn restorer_pidfd(&self) -> Result<RestorerPidfd> {
        RestorerPidfd::new(&self.ck.procs)
    }

    /// Creates the root, stopped and traced, in the tree's time and
    /// network namespaces (the restorer goes back to its own at once).
    fn create_root(&self) -> Result<ChildGuard> {
        let root = self.root;
        let own_time = match self.namespaces.and_then(|n| n.time.as_ref()) {
            Some(time) => Some(ns::enter_time(root, time)?),
            None => None,
        };
        let own_net = match &self.opts.netns {
            Some(target) => Some(ns::enter_net(root, target)?),
            None => None,
        };
        let ns_flags = ns::clone_flags(self.namespaces);
        let child = if self.new_pidns {
            spawn::spawn_in_new_pidns(root, ns_flags)
        } else {
            spawn::spawn(root, ns_flags, self.opts)
        };
        if let Some(own) = own_time {
            own.restore();
        }
        if let Some(own) = own_net {
            own.restore(root)?;
        }
        child
    }

    /// The tree's host and domain names, in its new UTS namespace.
    fn set_uts(&self, host_root: i32) -> Result<()> {
        if let Some(uts) = self.namespaces.and_then(|n| n.uts.as_ref()) {
            ns::set_uts(host_root, uts)?;
        }
        Ok(())
    }

    /// The IPC objects, created now in the root's new IPC namespace unless
    /// they were before the root (`created`).
    fn create_ipc_in_namespace(
        &self,
        host_root: i32,
        created: Option<ipc::Created>,
    ) -> Result<ipc::Created> {
        if let Some(c) = created {
            return Ok(c);
        }
        // The namespace, and with it every object, ends with the
        // tree's last process: nothing to remove on failure, and
        // nothing of ckpt's namespace may be removed by these ids.
        let mut c = ns::in_ipc(host_root, self.own_ipc, || {
            ipc::create(&self.ck.images, &self.ck.sysv, ipc::Cleanup::Namespace)
        })?;
        c.disarm();
        Ok(c)
    }

    /// The page server, when any process is served lazily.
    fn start_page_server(&self, started: Instant) -> Result<Option<lazy::PageServer>> {
        if self.ck.lazy.contains(&true) {
            Ok(Some(lazy::PageServer::start(started)?))
        } else {
            Ok(None)
        }
    }

    /// Per process: the block checksums its lazily served pages are
    /// checked with as they are served, when the manifest lists them.
    fn block_checks(&self) -> Result<Vec<Option<BlockChecks>>> {
        let ck = self.ck;
        Ok(ck
            .procs
            .iter()
            .zip(&ck.lazy)
            .map(|(p, &l)| {
                if l {
                    ck.images.block_checks(&ckpt_image::pages_name(p.pid))
                } else {
                    Ok(None)
                }
            })
            .collect::<std::result::Result<Vec<_>, _>>()?)
    }

    /// Builds the tree while, beside it, the pages files of lazily served
    /// processes without block checksums (older images) are verified
    /// whole, before anything runs: their pages are not copied now.
    fn build_and_verify(
        &self,
        host_root: i32,
        blocks: &[Option<BlockChecks>],
        build: &mut Build<'_>,
    ) -> Result<Built> {
        let ck = self.ck;
        std::thread::scope(|sc| {
            let verifying = sc.spawn(|| verify_unchecked_lazy(ck, blocks));
            let built = build::build_tree(host_root, ck, blocks, build, self.opts);
            let verified = verifying
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            built.and_then(|b| verified.map(|()| b))
        })
    }

    /// Once every process is built: the IPC objects marked for removal
    /// go, the rest of the checkpoint is verified, and the verbs layers
    /// recreate their resources. A failure drops the held processes,
    /// which kills them.
    fn finish(&self, host_root: i32, built: Built) -> Result<(Built, ib::Pending)> {
        ns::in_ipc(host_root, self.own_ipc, || {
            ipc::remove_marked(&self.ck.sysv)
        })?;
        self.ck.images.verify_remaining()?;
        // Every process is whole (memory, fds, final credentials) and
        // still stopped: the verbs layers recreate their resources.
        let ib = ib::restart_local(&built.tracees, &self.ck.procs)?;
        Ok((built, ib))
    }

    /// After a failure: every process of the tree is killed while still
    /// stopped.
    fn kill_half_built(&self) {
        // Kill while still stopped: a half-built process must never run.
        // In a new namespace the image's pids are not the host's: the
        // child guard kills its init, which ends every process in it.
        // The root is the guard's too: a held root's drop collected it
        // already, and its pid may be anyone's by now.
        for p in self
            .ck
            .procs
            .iter()
            .rev()
            .filter(|p| !self.new_pidns && p.pid != self.root)
        {
            let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
        }
    }
}

/// Verifies whole the pages files of lazily served processes that have no
/// block checksums.
fn verify_unchecked_lazy(ck: &Checkpoint, blocks: &[Option<BlockChecks>]) -> Result<()> {
    for (i, p) in ck.procs.iter().enumerate() {
        if ck.lazy[i] && blocks[i].is_none() {
            ck.images
                .verify_bytes(&ckpt_image::pages_name(p.pid), &ck.pages[i])?;
        }
    }
    Ok(())
}
