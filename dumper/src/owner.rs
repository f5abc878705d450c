//! Whose a process is, as the manifest and the SysV IPC collection need
//! it.

use crate::error::{DumpError, Result};
use crate::procfile;

/// Whose a process is: its ids as the kernel reports them in
/// /proc/PID/status, independent of how the core image collects creds.
pub(crate) struct Owner {
    /// Real, effective, saved and filesystem uid.
    pub uids: Vec<u32>,
    /// Real, effective, saved and filesystem gid.
    pub gids: Vec<u32>,
}

/// The ids of process `pid`.
pub(crate) fn owner(pid: i32) -> Result<Owner> {
    let status = procfile::read(pid, "status")?;
    let ids = |key: &str| -> Result<Vec<u32>> {
        let parsed: Option<Vec<u32>> = procfile::status_field(&status, key).and_then(|v| {
            v.split_whitespace()
                .map(|n| n.parse().ok())
                .collect::<Option<Vec<u32>>>()
        });
        parsed
            .filter(|ids| ids.len() == 4)
            .ok_or_else(|| DumpError::Parse {
                pid,
                path: format!("/proc/{pid}/status"),
                what: format!("no real, effective, saved and fs ids in {key}"),
            })
    };
    Ok(Owner {
        uids: ids("Uid")?,
        gids: ids("Gid")?,
    })
}
