//! Rebuilt processes held stopped until the whole tree resumes.
//!
//! Every task of a restored process (its leader and its other threads)
//! stays in a ptrace stop from its creation until [`Held::release`] at
//! resume. Nothing of the program runs while the rest of the tree is
//! built, the images' last bytes are verified, TCP connections are still
//! in repair mode or the verbs layers recreate their resources: a thread
//! let go early would see a half-restored world (the layer's old objects,
//! a peer not there yet) and act on it.
//!
//! A held process dropped unreleased (a failed restore, a tree that is
//! never resumed) is killed while its tasks are still stopped, so it
//! never runs an instruction of its own, and its tasks' deaths are
//! collected as their tracer: a killed task ckpt traces stays a zombie
//! for ckpt until then, which holds back its process's own death report
//! (a thread) and a PID namespace's init (any task of the namespace), and
//! with them whoever waits for either. The root, until the tree runs, is
//! also guarded by a [`ChildGuard`], which kills and reaps it even when it
//! was never held.

use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use ckpt_parasite::Tracee;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::error::{RestoreError, Result};

/// One rebuilt process, every task of it stopped.
pub struct Held {
    /// `None` once released.
    leader: Option<Tracee>,
    /// The process's other threads.
    threads: Vec<Tracee>,
    /// The signal of the job-control stop it is let go into, if any.
    job_stop: Option<nix::sys::signal::Signal>,
}

impl Held {
    /// Holds a process whose leader is stopped under `leader`.
    pub fn new(leader: Tracee) -> Held {
        Held {
            leader: Some(leader),
            threads: Vec::new(),
            job_stop: None,
        }
    }

    /// Holds the process's other threads too (stopped, as the leader).
    pub fn hold_threads(&mut self, mut threads: NewThreads) {
        self.threads.append(&mut threads.threads);
    }

    /// Lets the process go into a job-control stop by `signal` (already
    /// queued) rather than run.
    pub fn stop_on_release(&mut self, signal: Option<nix::sys::signal::Signal>) {
        self.job_stop = signal;
    }

    /// Lets the process run: its threads first, then the leader. A
    /// failure leaves the rest to [`Drop`], which kills the process; a
    /// task found dead (killed meanwhile) is collected and named.
    pub fn release(mut self) -> Result<()> {
        let until = Instant::now() + DEATH_WAIT;
        let pid = self.pid();
        if let Some(signal) = self.job_stop {
            crate::stopped::enter_group_stop(&self, signal).map_err(|e| e.of_process(pid))?;
        }
        while let Some(t) = self.threads.pop() {
            t.detach_or_collect(until)
                .map_err(|e| RestoreError::from(e).of_process(pid))?;
        }
        let leader = self.leader.take().expect("held until released");
        leader.detach_or_collect(until)?;
        Ok(())
    }
}

impl Deref for Held {
    type Target = Tracee;

    fn deref(&self) -> &Tracee {
        self.leader.as_ref().expect("held until released")
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(leader) = self.leader.take() else {
            return;
        };
        let until = Instant::now() + DEATH_WAIT;
        let pid = leader.pid();
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        // Threads first: the leader's death is reported after theirs.
        collect(pid, std::mem::take(&mut self.threads), until);
        collect_strays(pid, until);
        collect(pid, vec![leader], until);
    }
}

/// How long the restorer waits for a killed process's death before it
/// gives up collecting it (the kernel lets its tasks go when the restorer
/// exits).
pub const DEATH_WAIT: Duration = Duration::from_secs(10);

/// Collects the deaths of `tasks` of killed process `pid`, last first.
fn collect(pid: i32, mut tasks: Vec<Tracee>, until: Instant) {
    while let Some(t) = tasks.pop() {
        let tid = t.pid();
        if !t.reap_killed(until) {
            log::warn!("pid {pid}: task {tid} has not died after {DEATH_WAIT:?}");
        }
    }
}

/// Collects the deaths of the tasks of killed process `pid` that no
/// tracee stands for: a thread whose clone was under way when the
/// process died is traced from its birth, but was never handed back.
fn collect_strays(pid: i32, until: Instant) {
    loop {
        let mut ours = false;
        for tid in other_tasks(pid) {
            let t = Pid::from_raw(tid);
            match waitpid(t, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::PtraceEvent(..) | WaitStatus::Stopped(..)) => {
                    // On its way out from a stop: let it go on dying.
                    let _ = nix::sys::ptrace::cont(t, None);
                    ours = true;
                }
                Ok(WaitStatus::StillAlive) => ours = true,
                // Collected now, or not the restorer's to collect.
                Ok(_) | Err(_) => {}
            }
        }
        if !ours {
            return;
        }
        if Instant::now() >= until {
            log::warn!("pid {pid}: a thread has not died after {DEATH_WAIT:?}");
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The tids of process `pid` other than its leader's (none once it is
/// gone).
fn other_tasks(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|tid| *tid != pid)
        .collect()
}

/// Held processes in tree order, parents first, dropped children first: a
/// PID namespace's init dies only once every other task of its namespace
/// is collected, so it must come last.
pub struct ChildrenFirst<T>(pub Vec<T>);

impl<T> Deref for ChildrenFirst<T> {
    type Target = Vec<T>;

    fn deref(&self) -> &Vec<T> {
        &self.0
    }
}

impl<T> DerefMut for ChildrenFirst<T> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.0
    }
}

impl<T> Drop for ChildrenFirst<T> {
    fn drop(&mut self) {
        while let Some(last) = self.0.pop() {
            drop(last);
        }
    }
}

/// The other threads of a process being rebuilt, until they join its
/// [`Held`]. Dropped there (a step of the rebuild failed), the process is
/// killed while they are stopped, so none of them runs, and their deaths
/// are collected.
pub struct NewThreads {
    tgid: i32,
    threads: Vec<Tracee>,
}

impl NewThreads {
    /// None yet, for process `tgid`.
    pub fn new(tgid: i32) -> NewThreads {
        NewThreads {
            tgid,
            threads: Vec::new(),
        }
    }

    /// One more thread, stopped.
    pub fn push(&mut self, t: Tracee) {
        self.threads.push(t);
    }
}

impl Deref for NewThreads {
    type Target = [Tracee];

    fn deref(&self) -> &[Tracee] {
        &self.threads
    }
}

impl Drop for NewThreads {
    fn drop(&mut self) {
        if !self.threads.is_empty() {
            let _ = kill(Pid::from_raw(self.tgid), Signal::SIGKILL);
            let until = Instant::now() + DEATH_WAIT;
            collect(self.tgid, std::mem::take(&mut self.threads), until);
        }
    }
}

/// Kills and reaps the half-built child unless disarmed.
pub(crate) struct ChildGuard {
    /// The root's pid, as the restorer sees it.
    pub(crate) pid: i32,
    armed: std::cell::Cell<bool>,
}

impl ChildGuard {
    /// Guards the new root `pid`, stopped and traced by the restorer.
    pub(crate) fn new(pid: i32) -> ChildGuard {
        ChildGuard {
            pid,
            armed: true.into(),
        }
    }

    /// The root runs: it is the caller's now.
    pub(crate) fn disarm(&self) {
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
        let until = Instant::now() + DEATH_WAIT;
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
                    DEATH_WAIT
                );
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
