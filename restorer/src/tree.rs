//! Recreating child processes: the restored parent forks each child itself
//! (`clone3` with `set_tid` from the scratch area, with fork tracing on), so
//! the child has the right parent, inherits the parent's session and group
//! and starts stopped before running any code. It is rebuilt afterwards like
//! any other process.

use ckpt_image::task::Core;
use ckpt_parasite::Tracee;

use crate::error::{RestoreError, Result};
use crate::thread::CLONE_ARGS_SIZE;
use ckpt_parasite::remote::Remote;

/// Forks a child with pid `pid` from the process behind `r`.
pub fn fork_child(r: &Remote<'_>, pid: i32) -> Result<Tracee> {
    fork_with(r, pid, 0, libc::SIGCHLD as u64)
}

/// Like [`fork_child`], the child sharing what `core` says it shared with
/// its parent without being its thread: the fd table (`CLONE_FILES`), the
/// cwd, root and umask (`CLONE_FS`).
pub fn fork_child_sharing(r: &Remote<'_>, pid: i32, core: &Core) -> Result<Tracee> {
    fork_with(r, pid, sharing_flags(core), libc::SIGCHLD as u64)
}

/// The clone flags of what `core` shared with its parent.
pub fn sharing_flags(core: &Core) -> u64 {
    let mut flags = 0;
    if let Some(shared) = &core.shared_with_parent {
        if shared.files {
            flags |= libc::CLONE_FILES as u64;
        }
        if shared.fs {
            flags |= libc::CLONE_FS as u64;
        }
    }
    flags
}

/// Forks a process with pid `pid` from the process behind `r` as a child
/// of `r`'s parent (`CLONE_PARENT`; it gets the caller's exit signal), so
/// it starts in the caller's session and group but has the caller's
/// parent.
pub fn fork_sibling(r: &Remote<'_>, pid: i32) -> Result<Tracee> {
    fork_with(r, pid, libc::CLONE_PARENT as u64, 0)
}

fn fork_with(r: &Remote<'_>, pid: i32, flags: u64, exit_signal: u64) -> Result<Tracee> {
    r.t.trace_clones()?;
    let set_tid = r.put(1, &pid.to_le_bytes())?;
    // flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size,
    // tls, set_tid, set_tid_size: a fork with the given pid.
    let args = r.put_u64s(0, &[flags, 0, 0, 0, exit_signal, 0, 0, 0, set_tid, 1])?;
    let child = r.t.clone_at(
        r.base,
        args,
        CLONE_ARGS_SIZE,
        ckpt_parasite::NewTask::Process,
    )?;
    // In a new PID namespace the host pid differs; set_tid set the inner one.
    if crate::pid::inner(child.pid())? != pid {
        return Err(RestoreError::Host {
            pid,
            what: format!("child came back as pid {}", child.pid()),
        });
    }
    Ok(child)
}

/// Turns a freshly forked child into the zombie it was: it exits with the
/// saved wait status (or dies of the saved signal) and stays unreaped for
/// its parent. The parent gets a SIGCHLD it already had before the dump;
/// it stays pending until the parent runs.
pub fn make_zombie(r: &Remote<'_>, status: i32) -> Result<()> {
    let pid = r.t.pid();
    let sig = status & 0x7f;
    if sig == 0 {
        let code = (status >> 8) & 0xff;
        return match r
            .t
            .syscall_at(r.base, libc::SYS_exit_group, [code as u64, 0, 0, 0, 0, 0])
        {
            Err(ckpt_parasite::ParasiteError::Died { .. }) => Ok(()),
            Err(e) => Err(e.into()),
            Ok(ret) => Err(RestoreError::Host {
                pid,
                what: format!("exit_group returned {ret}"),
            }),
        };
    }
    let signal = nix::sys::signal::Signal::try_from(sig).map_err(|_| RestoreError::Host {
        pid,
        what: format!("zombie killed by unknown signal {sig}"),
    })?;
    // The child inherited the restorer's dispositions; the default kills.
    // SIGKILL's cannot be changed (rt_sigaction refuses it) and always kills.
    if signal != nix::sys::signal::Signal::SIGKILL {
        let act = r.put_u64s(0, &[0, 0, 0, 0])?;
        r.call(
            "rt_sigaction",
            libc::SYS_rt_sigaction,
            [sig as u64, act, 0, 8, 0, 0],
        )?;
    }
    // The core-dump bit of the status is only set by a core dump that
    // was written: make one, small and thrown away, when the zombie had
    // it, and none otherwise.
    let core = if status & WCOREFLAG != 0 {
        CoreDump::prepare(r)?
    } else {
        r.call(
            "prctl",
            libc::SYS_prctl,
            [libc::PR_SET_DUMPABLE as u64, 0, 0, 0, 0, 0],
        )?;
        None
    };
    r.t.die_by(signal)?;
    drop(core);
    Ok(())
}

/// The core-dump bit of a wait status.
const WCOREFLAG: i32 = 0x80;

/// RLIMIT_CORE for the throw-away dump: ample for headers and notes, with
/// every mapping left out by `coredump_filter`.
const CORE_LIMIT: u64 = 64 << 20;

/// A private directory the dying zombie writes its throw-away core into,
/// removed with it.
struct CoreDump(std::path::PathBuf);

impl CoreDump {
    /// Readies the process behind `r` to dump a minimal core into a fresh
    /// root-only directory. A `core_pattern` piping to a program would hand
    /// it a bogus core: then no core is made and the bit is lost (logged).
    fn prepare(r: &Remote<'_>) -> Result<Option<CoreDump>> {
        let pid = r.t.pid();
        let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default();
        if pattern.starts_with('|') || pattern.starts_with('/') {
            log::warn!(
                "pid {pid}: zombie dumped core; core_pattern {:?} is not a plain file name, so its status loses the core-dump bit",
                pattern.trim_end()
            );
            r.call(
                "prctl",
                libc::SYS_prctl,
                [libc::PR_SET_DUMPABLE as u64, 0, 0, 0, 0, 0],
            )?;
            return Ok(None);
        }
        let dir = std::env::temp_dir().join(format!("ckpt-core-{pid}"));
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(|e| RestoreError::os(pid, format!("mkdir {}", dir.display()), e))?;
        }
        let guard = CoreDump(dir);
        let mut path = guard.0.as_os_str().as_encoded_bytes().to_vec();
        path.push(0);
        let at = r.put(0, &path)?;
        r.call("chdir", libc::SYS_chdir, [at, 0, 0, 0, 0, 0])?;
        std::fs::write(format!("/proc/{pid}/coredump_filter"), "0")
            .map_err(|e| RestoreError::os(pid, "write coredump_filter", e))?;
        crate::sys::set_rlimit(pid, libc::RLIMIT_CORE, CORE_LIMIT, CORE_LIMIT)
            .map_err(|e| RestoreError::os(pid, "set RLIMIT_CORE", e))?;
        r.call(
            "prctl",
            libc::SYS_prctl,
            [libc::PR_SET_DUMPABLE as u64, 1, 0, 0, 0, 0],
        )?;
        Ok(Some(guard))
    }
}

impl Drop for CoreDump {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
