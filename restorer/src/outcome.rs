//! What a restore hands back: the running tree, its figures, and what was
//! bound to the restoring command instead of restored.

use std::time::Instant;

use crate::lazy;

/// A restored, running process tree (its root is a child of the caller).
#[derive(Debug)]
pub struct Restored {
    /// The root's pid (the original one).
    pub pid: i32,
    /// The figures of the restore.
    pub stats: RestoreStats,
    /// With [`crate::RestoreOptions::lazy`]: the page server, filling the rest in
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
pub(crate) fn ms_since(t: Instant) -> f64 {
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
