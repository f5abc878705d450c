//! Processes that share an fd table (`clone(CLONE_FILES)`) or their fs
//! info (`CLONE_FS`: cwd, root, umask) without being threads of one
//! process. A process sharing its parent's is marked so (restore creates
//! it sharing the restored parent's); any other sharing (between
//! siblings, with a process other than the parent) is refused before
//! anything is saved, naming both processes and what they share, since a
//! restore would give each its own and break the sharing silently.

use ckpt_image::task::SharedWithParent;

use crate::blockers::Blockers;
use crate::error::{DumpError, Result};
use crate::sys;
use crate::tree::FrozenProcess;

/// What two processes can share without being threads of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shared {
    /// The fd table.
    Files,
    /// The cwd, root and umask.
    Fs,
}

impl Shared {
    const ALL: [Shared; 2] = [Shared::Files, Shared::Fs];

    fn kcmp_kind(self) -> libc::c_int {
        match self {
            Shared::Files => sys::KCMP_FILES,
            Shared::Fs => sys::KCMP_FS,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Shared::Files => "fd table (CLONE_FILES)",
            Shared::Fs => "cwd, root and umask (CLONE_FS)",
        }
    }

    fn mark(self, on: &mut SharedWithParent) {
        match self {
            Shared::Files => on.files = true,
            Shared::Fs => on.fs = true,
        }
    }
}

/// Marks every live process of `procs` (parents first) that shares its
/// fd table or fs info with its parent; refuses (into `blockers`) one
/// that shares either with another process only, naming the first
/// process holding that table.
pub(crate) fn mark(procs: &mut [FrozenProcess], blockers: &mut Blockers) -> Result<()> {
    for shared in Shared::ALL {
        // The first process seen with each distinct table: a process is
        // compared with these only, not with every other.
        let mut holders: Vec<i32> = Vec::new();
        for i in 0..procs.len() {
            let p = &procs[i];
            if p.zombie_status.is_some() {
                continue;
            }
            let (pid, ppid) = (p.pid, p.ppid);
            let Some(holder) = holder_of(pid, &holders, shared)? else {
                holders.push(pid);
                continue;
            };
            let parent_live = procs
                .iter()
                .any(|q| q.pid == ppid && q.zombie_status.is_none());
            if parent_live && same(ppid, pid, shared)? {
                shared.mark(procs[i].shared_with_parent.get_or_insert_default());
                log::info!(
                    "freeze: pid {pid} shares its parent {ppid}'s {}",
                    shared.what()
                );
                continue;
            }
            blockers.absorb::<()>(Err(DumpError::Unsupported {
                pid,
                what: format!(
                    "{} shared with pid {holder}, not its parent, without being its thread",
                    shared.what()
                ),
            }))?;
        }
    }
    Ok(())
}

/// The process of `holders` whose table `pid` shares, if any.
fn holder_of(pid: i32, holders: &[i32], shared: Shared) -> Result<Option<i32>> {
    for &holder in holders {
        if same(holder, pid, shared)? {
            return Ok(Some(holder));
        }
    }
    Ok(None)
}

/// Whether `holder` and `pid` hold one table of `shared`'s kind.
fn same(holder: i32, pid: i32, shared: Shared) -> Result<bool> {
    sys::same_object_of(holder, pid, shared.kcmp_kind()).map_err(|source| DumpError::Proc {
        pid,
        path: format!("kcmp {shared:?} with pid {holder}").into(),
        source,
    })
}
