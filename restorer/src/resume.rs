//! Resume, the last phase of a restore: the tree, rebuilt and held stopped,
//! runs. Children are let go first, so no parent runs while a child is
//! held; a process that dies before it is let go takes the whole tree
//! with it.

use std::time::Instant;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::Result;
use crate::held::{ChildGuard, ChildrenFirst, Held};
use crate::outcome::{Rebound, RestoreStats, Restored, ms_since};
use crate::{fd, ib, ipc, lazy, sys};

/// A restored tree, every process rebuilt and still stopped under ptrace
/// (phase 1 of a restore). Between this and [`Stopped::resume`] a
/// coordinator publishes what changed (new addresses, new ids) and waits
/// for its peers; nothing of the tree runs meanwhile. Dropping it kills
/// the whole tree: a process that was never resumed never ran.
pub struct Stopped {
    pub(crate) root: i32,
    /// Tree order (parents first), dropped children first.
    pub(crate) tracees: ChildrenFirst<Held>,
    pub(crate) child: ChildGuard,
    pub(crate) rebound: Vec<Rebound>,
    pub(crate) stats: RestoreStats,
    /// The SysV IPC objects created for the tree, removed if it never runs.
    pub(crate) ipc: ipc::Created,
    /// TCP connections to peers outside the tree, in repair mode until the
    /// tree resumes (closed silently if it never does).
    pub(crate) tcp: fd::OutsidePeers,
    /// The page server of a lazy restore.
    pub(crate) lazy: Option<lazy::PageServer>,
    /// When the restore began (time-to-running counts from it).
    pub(crate) started: Instant,
    /// Verbs layers that recreated their resources and wait to connect.
    pub(crate) ib: ib::Pending,
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
