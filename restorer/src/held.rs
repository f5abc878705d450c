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
//! never resumed) is killed before its tasks are detached, so it never
//! runs an instruction of its own.

use std::ops::Deref;

use ckpt_parasite::Tracee;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::Result;

/// One rebuilt process, every task of it stopped.
pub struct Held {
    /// `None` once released.
    leader: Option<Tracee>,
    /// The process's other threads.
    threads: Vec<Tracee>,
}

impl Held {
    /// Holds a process whose leader is stopped under `leader`.
    pub fn new(leader: Tracee) -> Held {
        Held {
            leader: Some(leader),
            threads: Vec::new(),
        }
    }

    /// Holds the process's other threads too (stopped, as the leader).
    pub fn hold_threads(&mut self, mut threads: NewThreads) {
        self.threads.append(&mut threads.threads);
    }

    /// Lets the process run: its threads first, then the leader. A
    /// failure leaves the rest to [`Drop`], which kills the process.
    pub fn release(mut self) -> Result<()> {
        while let Some(t) = self.threads.pop() {
            t.detach()?;
        }
        let leader = self.leader.take().expect("held until released");
        leader.detach()?;
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
        // The kill comes first: the tracees' own drops detach them, and a
        // detached task with SIGKILL pending dies before it runs.
        if let Some(leader) = &self.leader {
            let _ = kill(Pid::from_raw(leader.pid()), Signal::SIGKILL);
        }
    }
}

/// The other threads of a process being rebuilt, until they join its
/// [`Held`]. Dropped there (a step of the rebuild failed), the process is
/// killed before the threads' tracees are detached, so none of them runs.
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
        }
    }
}
