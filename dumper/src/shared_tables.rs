//! Processes that share an fd table (`clone(CLONE_FILES)`) or their fs
//! info (`CLONE_FS`: cwd, root, umask) without being threads of one
//! process. A process sharing its parent's is marked so (restore creates
//! it sharing the restored parent's); any other sharing (between
//! siblings, with a process other than the parent) is refused before
//! anything is saved, naming both processes and what they share, since a
//! restore would give each its own and break the sharing silently.
//! Processes sharing one address space (`CLONE_VM` without
//! `CLONE_THREAD`, as `vfork` children and some runtimes make) are
//! refused whoever they are: each would come back with a copy of its own,
//! and a write of one would no longer show in the other.

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
    refuse_shared_memory(procs, blockers)?;
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

/// Refuses (into `blockers`) every live process of `procs` sharing its
/// address space with an earlier one, naming that one.
fn refuse_shared_memory(procs: &[FrozenProcess], blockers: &mut Blockers) -> Result<()> {
    let mut holders: Vec<i32> = Vec::new();
    for p in procs.iter().filter(|p| p.zombie_status.is_none()) {
        let mut holder = None;
        for &h in &holders {
            if same_memory(h, p.pid)? {
                holder = Some(h);
                break;
            }
        }
        let Some(holder) = holder else {
            holders.push(p.pid);
            continue;
        };
        blockers.absorb::<()>(Err(DumpError::Unsupported {
            pid: p.pid,
            what: format!("shares its memory with pid {holder} without being a thread (CLONE_VM)"),
        }))?;
    }
    Ok(())
}

/// Whether `holder` and `pid` have one address space.
fn same_memory(holder: i32, pid: i32) -> Result<bool> {
    sys::same_object_of(holder, pid, sys::KCMP_VM).map_err(|source| DumpError::Proc {
        pid,
        path: format!("kcmp VM with pid {holder}").into(),
        source,
    })
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

/// A live process as [`check_sessions`] reads it.
pub(crate) struct InSession {
    /// Its pid.
    pub pid: i32,
    /// Its parent's.
    pub ppid: i32,
    /// Its session.
    pub sid: i32,
    /// What it shares with its parent.
    pub shared: Option<SharedWithParent>,
}

/// Refuses (into `blockers`) a process sharing its parent's tables in a
/// session neither its parent's nor its own: restore forks such a process
/// through a helper of that session, whose tables are not the parent's.
pub(crate) fn check_sessions(procs: &[InSession], blockers: &mut Blockers) -> Result<()> {
    for p in procs.iter().filter(|p| p.shared.is_some()) {
        let parent_sid = procs.iter().find(|q| q.pid == p.ppid).map(|q| q.sid);
        if p.sid == p.pid || parent_sid == Some(p.sid) {
            continue;
        }
        blockers.absorb::<()>(Err(DumpError::Unsupported {
            pid: p.pid,
            what: format!(
                "fd table or cwd shared with its parent {} from session {}, neither the parent's nor its own",
                p.ppid, p.sid
            ),
        }))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILES: SharedWithParent = SharedWithParent {
        files: true,
        fs: false,
    };

    fn member(pid: i32, ppid: i32, sid: i32, shared: Option<SharedWithParent>) -> InSession {
        InSession {
            pid,
            ppid,
            sid,
            shared,
        }
    }

    #[test]
    fn a_sharer_in_its_parents_session_or_its_own_passes() {
        let mut b = Blockers::default();
        let procs = [
            member(10, 1, 10, None),
            member(11, 10, 10, Some(FILES)),
            member(12, 10, 12, Some(FILES)),
        ];
        check_sessions(&procs, &mut b).unwrap();
        assert!(b.into_result().is_ok());
    }

    #[test]
    fn a_sharer_in_another_session_is_refused_naming_its_parent() {
        let mut b = Blockers::default();
        let procs = [
            member(10, 1, 10, None),
            member(11, 10, 20, Some(FILES)),
            member(13, 10, 20, None),
        ];
        check_sessions(&procs, &mut b).unwrap();
        match b.into_result() {
            Err(DumpError::Unsupported { pid: 11, what }) => {
                assert!(what.contains("parent 10 from session 20"), "{what}")
            }
            other => panic!("{other:?}"),
        }
    }
}
