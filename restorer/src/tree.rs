//! Recreating child processes: the restored parent forks each child itself
//! (`clone3` with `set_tid` from the scratch area, with fork tracing on), so
//! the child has the right parent, inherits the parent's session and group
//! and starts stopped before running any code. It is rebuilt afterwards like
//! any other process.

use ckpt_parasite::Tracee;

use crate::error::{RestoreError, Result};
use crate::remote::Remote;
use crate::threads::CLONE_ARGS_SIZE;

/// Forks a child with pid `pid` from the process behind `r`.
pub fn fork_child(r: &Remote<'_>, pid: i32) -> Result<Tracee> {
    r.t.trace_clones()?;
    let set_tid = r.put(1, &pid.to_le_bytes())?;
    // flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size,
    // tls, set_tid, set_tid_size: a plain fork with the given pid.
    let args = r.put_u64s(0, &[0, 0, 0, 0, libc::SIGCHLD as u64, 0, 0, 0, set_tid, 1])?;
    let child = r.t.clone_at(r.base, args, CLONE_ARGS_SIZE)?;
    if child.pid() != pid {
        return Err(RestoreError::Host {
            pid,
            what: format!("child came back as pid {}", child.pid()),
        });
    }
    Ok(child)
}
