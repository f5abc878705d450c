//! PID namespaces. A tree in ckpt's own namespace is saved with its pids as
//! they are. A tree whose root is PID 1 of a namespace of its own (`ckpt
//! run --pidns`) is saved with that namespace's pids: the last NSpid entry
//! of each process and thread, which a restore into a fresh namespace can
//! give back whatever the host's pids are by then. Any other shape (a
//! process in a namespace that is neither ckpt's nor the root's, a root
//! inside a namespace it is not the init of) is refused.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;

use crate::error::{DumpError, Result};
use crate::procfile;
use crate::tree::FrozenProcess;

/// The pid a namespace's init has inside it.
const NS_INIT_PID: i32 = 1;
/// NSpid entries of a process one namespace below ckpt's: its pid in
/// ckpt's namespace and in its own.
const ONE_LEVEL_DOWN: usize = 2;

/// Which PID namespace the tree fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TreeNs {
    /// ckpt's own: pids are saved as they are.
    Ckpt,
    /// The root's own, one level below ckpt's, whose init the root is.
    RootInit {
        /// Inode of the namespace (`/proc/PID/ns/pid`).
        ns: u64,
    },
}

/// The pid of `pid` (a process, or a thread as `PID/task/TID`) in each PID
/// namespace from the reader's down (the NSpid line of its status).
fn nspid(pid: i32, status: &str) -> Result<Vec<i32>> {
    let field = procfile::status_field(status, "NSpid").ok_or_else(|| DumpError::Parse {
        pid,
        path: format!("/proc/{pid}/status"),
        what: "no NSpid line".into(),
    })?;
    field
        .split_whitespace()
        .map(|n| n.parse::<i32>())
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| DumpError::Parse {
            pid,
            path: format!("/proc/{pid}/status"),
            what: format!("bad NSpid {field:?}"),
        })
}

fn show(nspid: &[i32]) -> String {
    nspid
        .iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Inode of the PID namespace of `pid`.
fn ns_inode(pid: i32) -> Result<u64> {
    let path = procfile::path(pid, "ns/pid");
    std::fs::metadata(&path)
        .map(|m| m.ino())
        .map_err(|e| procfile::proc_err(pid, path, e))
}

/// The namespace a tree rooted at `root` fills, or why it cannot be dumped.
pub fn of_root(root: i32) -> Result<TreeNs> {
    let status = procfile::read(root, "status")?;
    let ids = nspid(root, &status)?;
    match ids.as_slice() {
        [_] => Ok(TreeNs::Ckpt),
        [_, NS_INIT_PID] => Ok(TreeNs::RootInit {
            ns: ns_inode(root)?,
        }),
        [_, _] => Err(DumpError::Unsupported {
            pid: root,
            what: format!(
                "process in a nested PID namespace (NSpid {}) whose init is not the dumped root: dump the namespace's init (PID 1 there, e.g. of ckpt run --pidns)",
                show(&ids)
            ),
        }),
        _ => Err(DumpError::Unsupported {
            pid: root,
            what: format!(
                "process in a PID namespace nested {} levels below ckpt's (NSpid {}); only a namespace one level down can be dumped",
                ids.len() - 1,
                show(&ids)
            ),
        }),
    }
}

/// Refuses a process of the tree outside the tree's namespace. `status` is
/// its /proc status.
pub fn check_member(pid: i32, status: &str, tree: TreeNs) -> Result<()> {
    let ids = nspid(pid, status)?;
    match tree {
        TreeNs::Ckpt if ids.len() > 1 => Err(DumpError::Unsupported {
            pid,
            what: format!(
                "process in a nested PID namespace (NSpid {}) below a root in ckpt's; PID namespaces are dumped from their init (ckpt run --pidns)",
                show(&ids)
            ),
        }),
        TreeNs::RootInit { ns } if ids.len() != ONE_LEVEL_DOWN || ns_inode(pid)? != ns => {
            Err(DumpError::Unsupported {
                pid,
                what: format!(
                    "process in a PID namespace nested in the tree's (NSpid {}); only the root's namespace can be dumped",
                    show(&ids)
                ),
            })
        }
        _ => Ok(()),
    }
}

/// Host pid → the tree namespace's pid, for every process and thread of a
/// tree whose root is its namespace's init.
#[derive(Debug, Default)]
pub struct PidMap {
    inner: BTreeMap<i32, i32>,
}

impl PidMap {
    /// Reads the namespace pid of every process and thread of `procs`.
    pub fn read(procs: &[FrozenProcess]) -> Result<PidMap> {
        let mut inner = BTreeMap::new();
        for p in procs {
            let status = procfile::read(p.pid, "status")?;
            inner.insert(p.pid, inner_pid(p.pid, &status)?);
            for t in p.tasks.iter().skip(1) {
                let tid = t.pid();
                let status = procfile::read(p.pid, &format!("task/{tid}/status"))?;
                inner.insert(tid, inner_pid(tid, &status)?);
            }
        }
        Ok(PidMap { inner })
    }

    /// The namespace's pid of host pid `host`, if it is of the tree.
    pub fn get(&self, host: i32) -> Option<i32> {
        self.inner.get(&host).copied()
    }

    /// Like [`PidMap::get`], for a pid the tree must hold (its processes,
    /// threads, pidfd targets).
    pub fn of_tree(&self, pid: i32, host: i32, what: &str) -> Result<i32> {
        self.get(host).ok_or_else(|| DumpError::Unsupported {
            pid,
            what: format!("{what} {host} is outside the tree's PID namespace"),
        })
    }
}

fn inner_pid(pid: i32, status: &str) -> Result<i32> {
    let ids = nspid(pid, status)?;
    match ids.as_slice() {
        [_, inner] => Ok(*inner),
        _ => Err(DumpError::Unsupported {
            pid,
            what: format!(
                "task outside the tree's PID namespace (NSpid {})",
                show(&ids)
            ),
        }),
    }
}
