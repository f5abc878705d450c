//! Slurm integration: what `ckpt slurm` (the job wrapper a batch script
//! `exec`s) and the site's hooks around it need besides the command line:
//! Slurm's clients and the job's registration ([`client`]), the
//! checkpoint directory of a single-node job ([`checkpoints`]), the
//! dump-time budget against the lead Slurm gives ([`budget`]), the
//! application of a single-node job ([`tree`]), the parts of a job
//! spanning several nodes ([`nodes`]), an MPI launcher's daemons as those
//! parts ([`daemons`]) and the site's hooks ([`site`]).

pub mod budget;
pub mod checkpoints;
pub mod client;
pub mod daemons;
pub mod nodes;
pub mod site;
pub mod tree;

use std::path::Path;

use nix::sys::signal::Signal;

/// Name of the file naming the committed checkpoint, relative to `DIR`.
pub const LATEST: &str = "LATEST";
/// Name of the file that marks a checkpoint in progress, relative to `DIR`.
pub const ATTEMPT: &str = "ATTEMPT";
/// Prefix of a checkpoint directory's name, followed by its number.
pub const CKPT_PREFIX: &str = "ckpt-";

/// Where the wrapper's warnings go (the job's stderr and ckpt's log file,
/// as the caller arranges): one line each, without the `ckpt slurm: `
/// prefix.
pub type Warn<'a> = &'a dyn Fn(&str);

/// How `ckpt slurm` takes a checkpoint (its options).
#[derive(Debug, Clone, Copy)]
pub struct Checkpointing<'a> {
    /// How many committed checkpoints to keep.
    pub keep: u32,
    /// The checkpoint signal (blocked in the dump, as another warning).
    pub signal: Signal,
    /// The site's image key file, if given.
    pub image_key: Option<&'a Path>,
    /// What the checkpoint leaves of the application.
    pub then: Then,
    /// A checkpoint that lets the application run on is taken in the
    /// background (`--background`): frozen only for what cannot be
    /// written while it runs.
    pub background: bool,
    /// Checkpoints after the first read only what changed since the last
    /// committed one (`--incremental`).
    pub incremental: bool,
}

/// What a checkpoint leaves of the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Then {
    /// Killed once committed: the warning's checkpoint, before the requeue.
    Kill,
    /// Running on: a periodic checkpoint (`--every`).
    Resume,
}

/// The regular files this process has as fds 0-2, as /proc names them:
/// the job's output, which grows after a checkpoint and is reopened at its
/// end at the restart.
pub fn stdio_files() -> Vec<std::path::PathBuf> {
    [0, 1, 2]
        .iter()
        .filter_map(|fd| std::fs::read_link(format!("/proc/self/fd/{fd}")).ok())
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
        .collect()
}
