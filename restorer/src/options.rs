//! What the caller of a restore chooses.

use std::path::PathBuf;
use std::time::Duration;

use ckpt_image::ImageKey;

use crate::addresses::AddressMap;
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
    /// Serve private anonymous memory on demand ([`crate::lazy`]): the tree runs
    /// before its pages are all back.
    pub lazy: bool,
    /// The network namespace to restore the tree into (`--netns`); `None`:
    /// the restorer's, which a tree dumped in one of its own refuses.
    pub netns: Option<ns::NetTarget>,
    /// The mount namespace to restore the tree into (`--mntns`); `None`:
    /// the restorer's, which a tree dumped in one of its own refuses.
    pub mntns: Option<ns::MntTarget>,
    /// The PMIx server of the job step the restore runs in, for ranks of
    /// `srun --mpi=pmix` whose link to their old server is made anew.
    pub pmix_step: crate::pmix::StepEnv,
}

/// What the user running the restore allows to reach the restored
/// processes beyond their images.
#[derive(Debug, Clone, Default)]
pub struct FilePolicy {
    /// Fds of the restorer, besides 0, 1 and 2, that a terminal fd of the
    /// same number may receive (`ckpt restore --inherit-fd N`). Any other
    /// terminal fd gets `/dev/null`: whatever else the restorer has open
    /// must never reach a process of another user.
    pub inherit_fds: Vec<InheritFd>,
    /// Files whose contents may have changed since the dump
    /// (`ckpt restore --allow-changed PATH`, as the dump recorded the path):
    /// reopened at their end instead of the dumped offset, as an
    /// append-only log continues. Owner, mode, type and (on the dumping
    /// host) inode must still match.
    pub allow_changed: Vec<PathBuf>,
    /// Where the processes' network addresses moved since the dump
    /// (`ckpt restore --map-address`, or a coordinated restart's address
    /// exchange): inet sockets come back on the new addresses.
    pub addresses: AddressMap,
}

/// A restorer fd the user hands to the restored processes
/// (`ckpt restore --inherit-fd`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InheritFd {
    /// `N`: a terminal fd N of the process may receive the restorer's fd N.
    Terminal(i32),
    /// `fd[N]:KEY`: the restorer's fd N stands in for the open file
    /// declared external with KEY at dump time.
    External {
        /// The restorer's fd.
        fd: i32,
        /// The key given to `ckpt dump --external`.
        key: String,
    },
}

impl std::str::FromStr for InheritFd {
    type Err = String;

    /// `N` or `fd[N]:KEY` (CRIU's form).
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let number = |n: &str| {
            n.parse::<i32>()
                .ok()
                .filter(|n| *n >= 0)
                .ok_or_else(|| format!("{s}: not an fd number"))
        };
        match s.strip_prefix("fd[") {
            None => number(s).map(InheritFd::Terminal),
            Some(rest) => {
                let (n, key) = rest
                    .split_once("]:")
                    .ok_or_else(|| format!("{s}: expected fd[N]:KEY"))?;
                if key.is_empty() {
                    return Err(format!("{s}: empty KEY"));
                }
                Ok(InheritFd::External {
                    fd: number(n)?,
                    key: key.into(),
                })
            }
        }
    }
}
