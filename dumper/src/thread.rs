//! Freezing every thread of a process. Threads may be created or exit
//! while ckpt seizes them one by one, so the task list is re-read until a
//! pass finds no thread that is not frozen yet.

use ckpt_parasite::{ParasiteError, Tracee};
use nix::errno::Errno;

use crate::error::{DumpError, Result};
use crate::procfile;

/// Bound on re-reads of the task list: a process cloning faster than ckpt
/// can seize is refused rather than chased forever.
const MAX_PASSES: usize = 100;

/// Seizes and stops every thread of `pid`; the leader comes first. `seize`
/// maps the leader's seize error (no such process, permission).
pub fn freeze(pid: i32, seize: impl Fn(ParasiteError) -> DumpError) -> Result<Vec<Tracee>> {
    let mut frozen = vec![Tracee::seize(pid).map_err(&seize)?];
    crate::seccomp::suspend(pid, &frozen[0])?;
    for _ in 0..MAX_PASSES {
        let mut added = false;
        for tid in procfile::numbered_entries(pid, "task")? {
            if frozen.iter().any(|t| t.pid() == tid) {
                continue;
            }
            match Tracee::seize(tid) {
                Ok(t) => {
                    crate::seccomp::suspend(pid, &t)?;
                    frozen.push(t);
                    added = true;
                }
                // The thread exited between listing and seizing.
                Err(ParasiteError::Ptrace {
                    source: Errno::ESRCH,
                    ..
                })
                | Err(ParasiteError::Died { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if !added {
            // Threads that exited after being seized are gone from the list.
            let live = procfile::numbered_entries(pid, "task")?;
            frozen.retain(|t| live.contains(&t.pid()));
            return Ok(frozen);
        }
    }
    Err(DumpError::Unsupported {
        pid,
        what: format!(
            "process creating threads faster than they can be frozen ({MAX_PASSES} passes)"
        ),
    })
}
