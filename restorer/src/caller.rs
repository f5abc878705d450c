//! Acting for a caller (the ckpt service's worker): the checkpoint may ask
//! for nothing the caller does not have. Its seal already says it was
//! dumped for this caller (a key of theirs); this holds even so, so that
//! no dumper bug or older image can hand a user another id or a
//! capability through the service.

use ckpt_image::task::{Core, Creds};
use ckpt_image::{Caller, ImageDir};

use crate::error::{RestoreError, Result};

/// Every process of the manifest, zombies included, ran with the caller's
/// uid and groups only.
pub(crate) fn check_manifest(images: &ImageDir) -> Result<()> {
    let Some(caller) = ckpt_image::caller::acting_for() else {
        return Ok(());
    };
    for e in &images.manifest().processes {
        if let Some(u) = e.uids.iter().find(|&&u| u != caller.uid) {
            return Err(refuse(
                e.pid,
                None,
                format!("was dumped with uid {u}"),
                caller,
            ));
        }
        if let Some(g) = e.gids.iter().find(|&&g| !caller.has_group(g)) {
            return Err(refuse(
                e.pid,
                None,
                format!("was dumped with group {g}"),
                caller,
            ));
        }
    }
    Ok(())
}

/// Every thread of the process asks for the caller's ids and groups and
/// no capability in its effective, permitted or ambient set.
pub(crate) fn check_core(core: &Core) -> Result<()> {
    let Some(caller) = ckpt_image::caller::acting_for() else {
        return Ok(());
    };
    let threads = core.threads.iter().map(|t| (Some(t.tid), t.creds.as_ref()));
    for (tid, creds) in std::iter::once((None, core.creds.as_ref())).chain(threads) {
        let Some(c) = creds else { continue };
        if let Some(what) = beyond(c, caller) {
            return Err(refuse(core.pid, tid, what, caller));
        }
    }
    Ok(())
}

/// What in `c` the caller does not have, if anything.
fn beyond(c: &Creds, caller: &Caller) -> Option<String> {
    if let Some(u) = c.uids.iter().find(|&&u| u != caller.uid) {
        return Some(format!("asks for uid {u}"));
    }
    if let Some(g) = c
        .gids
        .iter()
        .chain(&c.groups)
        .find(|&&g| !caller.has_group(g))
    {
        return Some(format!("asks for group {g}"));
    }
    let caps = [
        ("effective", c.cap_eff),
        ("permitted", c.cap_prm),
        ("ambient", c.cap_amb),
    ];
    caps.iter()
        .find(|(_, bits)| *bits != 0)
        .map(|(set, bits)| format!("asks for capabilities ({set} set {bits:#x})"))
}

fn refuse(pid: i32, tid: Option<i32>, what: String, caller: &Caller) -> RestoreError {
    RestoreError::NotCallers {
        pid,
        what: match tid {
            Some(t) => format!("thread {t} {what}"),
            None => what,
        },
        caller: caller.to_string(),
    }
}
