//! What the caller of a restore chooses.

use std::path::PathBuf;
use std::time::Duration;

use ckpt_image::ImageKey;

use crate::fd::FilePolicy;
use crate::ns;

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
