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
        let known: std::collections::HashSet<i32> = frozen.iter().map(Tracee::pid).collect();
        // Every new thread is asked to stop before any stop is waited
        // for: the stops overlap instead of taking a round trip each.
        let mut stopping = Vec::new();
        for tid in procfile::numbered_entries(pid, "task")? {
            if known.contains(&tid) {
                continue;
            }
            match gone(Tracee::seize_begin(tid))? {
                Some(s) => stopping.push(s),
                None => continue,
            }
        }
        for s in stopping {
            if let Some(t) = gone(s.wait())? {
                crate::seccomp::suspend(pid, &t)?;
                frozen.push(t);
                added = true;
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

/// `None` for a thread that exited between listing and freezing.
fn gone<T>(r: std::result::Result<T, ParasiteError>) -> Result<Option<T>> {
    match r {
        Ok(t) => Ok(Some(t)),
        Err(ParasiteError::Ptrace {
            source: Errno::ESRCH,
            ..
        })
        | Err(ParasiteError::Died { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}
