//! Processes that share an fd table (`clone(CLONE_FILES)`) or their fs
//! info (`CLONE_FS`: cwd, root, umask) without being threads of one
//! process. A restore creates every process with tables of its own, so
//! the sharing would come back silently broken (an fd one opens no longer
//! seen by the other): such trees are refused before anything is saved,
//! naming both processes and what they share.

use crate::blockers::Blockers;
use crate::error::{DumpError, Result};
use crate::sys;

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
}

/// Refuses (into `blockers`) every live process of `pids` that shares its
/// fd table or fs info with another process of the tree, naming the first
/// process holding that table.
pub(crate) fn check(pids: &[i32], blockers: &mut Blockers) -> Result<()> {
    for shared in Shared::ALL {
        // The first process seen with each distinct table: a process is
        // compared with these only, not with every other.
        let mut holders: Vec<i32> = Vec::new();
        for &pid in pids {
            match holder_of(pid, &holders, shared)? {
                Some(holder) => {
                    blockers.absorb::<()>(Err(DumpError::Unsupported {
                        pid,
                        what: format!(
                            "{} shared with pid {holder} without being its thread",
                            shared.what()
                        ),
                    }))?;
                }
                None => holders.push(pid),
            }
        }
    }
    Ok(())
}

/// The process of `holders` whose table `pid` shares, if any.
fn holder_of(pid: i32, holders: &[i32], shared: Shared) -> Result<Option<i32>> {
    for &holder in holders {
        let same = sys::same_object_of(holder, pid, shared.kcmp_kind()).map_err(|source| {
            DumpError::Proc {
                pid,
                path: format!("kcmp {:?} with pid {holder}", shared).into(),
                source,
            }
        })?;
        if same {
            return Ok(Some(holder));
        }
    }
    Ok(None)
}
