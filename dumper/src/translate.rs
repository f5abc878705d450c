//! Pids as the image records them: the host's in ckpt's PID namespace, the
//! tree namespace's for a tree that fills its own (see [`crate::pidns`]).

use crate::error::{DumpError, Result};
use crate::{fd, pidns};

/// The pids an image records for host pids: the same in ckpt's namespace,
/// the tree namespace's with a [`pidns::PidMap`].
pub(crate) struct SavedPids<'a>(pub Option<&'a pidns::PidMap>);

impl SavedPids<'_> {
    /// A process of the tree.
    pub fn pid(&self, host: i32) -> i32 {
        self.0.map_or(host, |m| m.get(host).unwrap_or(host))
    }

    /// A parent: the root's is outside its namespace, where getppid()
    /// says 0.
    pub fn ppid(&self, host: i32) -> i32 {
        self.0.map_or(host, |m| m.get(host).unwrap_or(0))
    }
}

/// The task state of one process of the tree, under its host pid.
pub(crate) struct HostCore<'c> {
    /// Its pid in ckpt's namespace.
    pub pid: i32,
    /// Its task state, rewritten.
    pub core: &'c mut ckpt_image::task::Core,
}

/// Rewrites every pid the collected state holds into the tree namespace's
/// (see [`pidns`]): a pid outside the namespace cannot be restored in it.
pub(crate) fn translate_pids<'c>(
    map: &pidns::PidMap,
    procs: impl IntoIterator<Item = HostCore<'c>>,
    files: &mut fd::TreeFiles,
    ipc: &mut ckpt_image::ipc::Ipc,
) -> Result<()> {
    // The restorer, outside a new namespace, could not name a sender by
    // the namespace's pid.
    let with_creds = files.files.files.iter().find(|f| {
        matches!(&f.kind, Some(ckpt_image::fd::file::Kind::Unix(u))
            if u.ancillary.iter().any(|a| a.creds.is_some()))
    });
    if let Some(f) = with_creds
        && let Some(h) = files.holders().find(|h| h.file_id == f.id)
    {
        return Err(DumpError::Unsupported {
            pid: h.pid,
            what: format!(
                "fd {}: unix socket with SO_PASSCRED and messages queued with their senders' credentials, in a tree with a PID namespace of its own",
                h.fd
            ),
        });
    }
    for HostCore { pid, core } in procs {
        core.pid = map.of_tree(pid, core.pid, "pid")?;
        core.pgid = map.of_tree(pid, core.pgid, "process group")?;
        core.sid = map.of_tree(pid, core.sid, "session")?;
        if let Some(ctty) = core.ctty.as_mut().filter(|c| c.foreground_pgid != 0) {
            ctty.foreground_pgid =
                map.of_tree(pid, ctty.foreground_pgid, "foreground process group")?;
        }
        for t in core.threads.iter_mut() {
            t.tid = map.of_tree(pid, t.tid, "thread")?;
        }
        for t in core.posix_timers.iter_mut().filter(|t| t.target != 0) {
            t.target = map.of_tree(pid, t.target, "timer target")?;
        }
    }
    for (pid, _) in files.tables.iter_mut() {
        *pid = map.of_tree(*pid, *pid, "pid")?;
    }
    for f in files.files.files.iter_mut() {
        match &mut f.kind {
            Some(ckpt_image::fd::file::Kind::Pidfd(p)) => {
                p.pid = map.of_tree(p.pid, p.pid, "pidfd target")?;
            }
            Some(ckpt_image::fd::file::Kind::Proc(p)) => {
                p.pid = map.of_tree(p.pid, p.pid, "/proc file's process")?;
            }
            _ => {}
        }
    }

    // Informational (the kernel rewrites them on every operation): a pid
    // outside the namespace reads as 0 there, as the kernel shows it.
    for s in ipc.sem.iter_mut() {
        for p in s.sempids.iter_mut() {
            *p = map.get(*p).unwrap_or(0);
        }
    }
    Ok(())
}
