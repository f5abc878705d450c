//! Acting for a caller (the ckpt service's worker): the frozen tree must be
//! wholly the caller's, by the kernel's own measure of what a user may
//! trace, before anything is injected or read.
//!
//! Checked once every task is frozen: a stopped task cannot change its
//! credentials or exec, so what is checked is what is dumped. A refused
//! tree is thawed untouched, as after any failed freeze.

use ckpt_image::Caller;

use crate::error::{DumpError, Result};
use crate::tree::FrozenProcess;

/// Refuses the tree unless every task of it could be traced by `caller`
/// without privilege: all four uids the caller's, all four gids and every
/// supplementary group among the caller's groups, no capability in its
/// effective, permitted or ambient set, and dumpable (the kernel gives a
/// non-dumpable task's /proc files to root; a user's ptrace of it fails).
pub(crate) fn check(procs: &[FrozenProcess], caller: &Caller) -> Result<()> {
    for p in procs {
        let tids: Vec<i32> = if p.tasks.is_empty() {
            vec![p.pid]
        } else {
            p.tasks.iter().map(|t| t.pid()).collect()
        };
        for tid in tids {
            check_task(p.pid, tid, caller)?;
        }
    }
    Ok(())
}

/// Checks one task (see [`check`]).
pub(crate) fn check_task(pid: i32, tid: i32, caller: &Caller) -> Result<()> {
    let refuse = |what: String| DumpError::Permission {
        pid,
        what: format!(
            "{}{what}: the ckpt service dumps only processes of the user who asks ({caller})",
            if tid == pid {
                String::new()
            } else {
                format!("thread {tid}: ")
            }
        ),
    };
    let file = format!("task/{tid}/status");
    let text = crate::procfile::read_bytes(pid, &file)?;
    let st =
        <procfs::process::Status as procfs::FromRead>::from_read(text.as_slice()).map_err(|e| {
            DumpError::Parse {
                pid,
                path: file.clone(),
                what: e.to_string(),
            }
        })?;
    let uids = [st.ruid, st.euid, st.suid, st.fuid];
    if let Some(u) = uids.iter().find(|&&u| u != caller.uid) {
        return Err(refuse(format!("runs with uid {u}")));
    }
    let gids = [st.rgid, st.egid, st.sgid, st.fgid];
    if let Some(g) = gids
        .iter()
        .chain(&st.groups)
        .find(|&&g| !caller.has_group(g))
    {
        return Err(refuse(format!(
            "runs with group {g}, not one of the caller's"
        )));
    }
    let caps = [
        ("effective", st.capeff),
        ("permitted", st.capprm),
        ("ambient", st.capamb.unwrap_or(0)),
    ];
    if let Some((set, bits)) = caps.iter().find(|(_, bits)| *bits != 0) {
        return Err(refuse(format!("holds capabilities ({set} set {bits:#x})")));
    }
    let dir = crate::procfile::path(pid, &format!("task/{tid}"));
    let owner =
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&dir).map_err(|source| {
            DumpError::Proc {
                pid,
                path: dir.clone(),
                source,
            }
        })?);
    if owner != caller.uid {
        return Err(refuse(format!(
            "is not dumpable (it said so with prctl, or ran a setuid program): \
             its /proc entry is uid {owner}'s"
        )));
    }
    Ok(())
}
