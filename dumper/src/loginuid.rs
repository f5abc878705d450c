//! The audit login uid of a process (`/proc/PID/loginuid`): who logged in
//! for the session it descends from, which audit records name.

use crate::error::{DumpError, Result};
use crate::procfile;

/// The kernel's "never set" login uid (`AUDIT_UID_UNSET`).
const UNSET: u32 = u32::MAX;

/// The process's login uid, `None` when it was never set.
pub fn collect(pid: i32) -> Result<Option<u32>> {
    let text = procfile::read(pid, "loginuid")?;
    let uid: u32 = text
        .trim()
        .parse()
        .map_err(|e: std::num::ParseIntError| DumpError::Parse {
            pid,
            path: "loginuid".into(),
            what: e.to_string(),
        })?;
    Ok((uid != UNSET).then_some(uid))
}
