//! Errors of a dump. Every variant names the pid (and fd or file) involved.

use std::path::PathBuf;

use ckpt_image::ImageError;
use ckpt_parasite::ParasiteError;

/// Why a dump failed. The target is left running as it was in every case.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// The network lock of the tree whose root is `pid` could not be put
    /// in place (nothing was dumped).
    #[error("pid {pid}: {source}")]
    NetworkLock {
        /// The tree's root.
        pid: i32,
        /// Why.
        source: ckpt_netlock::LockError,
    },
    /// No process with that pid.
    #[error("pid {pid}: no such process")]
    NoProcess {
        /// The pid.
        pid: i32,
    },
    /// Several things in the tree cannot be saved (each would be an
    /// [`DumpError::Unsupported`] on its own).
    #[error("{} things in the tree cannot be saved: {}", blockers.len(), blockers.iter().map(|b| format!("pid {}: {}", b.pid, b.what)).collect::<Vec<_>>().join("; "))]
    Blocked {
        /// Every one of them, in tree order.
        blockers: Vec<Blocker>,
    },
    /// A process of the tree died while it was frozen (killed by someone
    /// else); what failed because of it is in `detail`.
    #[error("pid {pid} exited during the dump ({detail})")]
    Exited {
        /// The pid.
        pid: i32,
        /// The error its death caused.
        detail: String,
    },
    /// ckpt may not trace or read the process.
    #[error("pid {pid}: permission denied ({what})")]
    Permission {
        /// The pid.
        pid: i32,
        /// What was refused.
        what: String,
    },
    /// The process uses something ckpt cannot save yet.
    #[error("pid {pid}: {what} not supported")]
    Unsupported {
        /// The pid.
        pid: i32,
        /// The resource, e.g. "fd 7: socket".
        what: String,
    },
    /// Reading a /proc file failed.
    #[error("pid {pid}: reading {path}: {source}")]
    Proc {
        /// The pid.
        pid: i32,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A /proc file had a format ckpt does not understand.
    #[error("pid {pid}: cannot parse {path}: {what}")]
    Parse {
        /// The pid.
        pid: i32,
        /// The file.
        path: String,
        /// What was wrong.
        what: String,
    },
    /// A background dump lost part of the freeze-time memory: the job gave
    /// up a range before it was saved.
    #[error(
        "pid {pid}: memory {start:#x}-{end:#x} was {how} before the background dump saved it; dump again (without --background for a job that frees memory this much)"
    )]
    BackgroundLost {
        /// The process.
        pid: i32,
        /// First byte lost.
        start: u64,
        /// One past the last.
        end: u64,
        /// What the job did.
        how: &'static str,
    },
    /// The caller's [`WriteOptions::before_thaw`](crate::WriteOptions::before_thaw)
    /// refused to let the tree thaw (another node of the job failed).
    #[error("pid {pid}: the background dump was stopped before the thaw: {reason}")]
    ThawRefused {
        /// The tree's root.
        pid: i32,
        /// What the caller said.
        reason: String,
    },
    /// The process's InfiniBand verbs state could not be checkpointed.
    #[error("pid {pid}: InfiniBand: {what}")]
    Ib {
        /// The pid.
        pid: i32,
        /// What went wrong.
        what: String,
    },
    /// A rank of `srun --mpi=pmix`: its PMIx server lives in slurmstepd,
    /// outside the tree, and PMIx clients cannot reconnect to another one.
    #[error(
        "pid {pid}: a rank of srun --mpi=pmix: its PMIx server is slurmstepd (pid {}, connected on fd {fd}), outside the job, and cannot be saved; launch the ranks with mpirun inside the allocation (ckpt slurm -- mpirun ...)",
        .server.map_or_else(|| "unknown".to_string(), |p| p.to_string())
    )]
    SrunPmixRank {
        /// The rank.
        pid: i32,
        /// The fd of its connection to the server.
        fd: i32,
        /// The server's pid, as its URI names it.
        server: Option<i32>,
    },
    /// Controlling the process failed.
    #[error(transparent)]
    Parasite(#[from] ParasiteError),
    /// Writing the images failed.
    #[error(transparent)]
    Image(#[from] ImageError),
}

/// One thing ckpt cannot save.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocker {
    /// The process holding it.
    pub pid: i32,
    /// What it is, e.g. "fd 7: socket".
    pub what: String,
}

/// Shorthand.
pub type Result<T> = std::result::Result<T, DumpError>;
