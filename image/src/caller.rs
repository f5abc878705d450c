//! The user a root ckpt acts for.
//!
//! An ordinary user cannot trace, freeze or recreate processes: the ckpt
//! service (`ckpt serve`, root) does it for them, one request at a time, in
//! a process that acts for the user who asked. That process runs as root
//! but everything it does for the user is bounded by the user's own ids:
//! the processes it dumps and restores must be theirs, the images it writes
//! are theirs (owned by them, sealed with a key of theirs), and it writes
//! only where they could create a file themselves.
//!
//! Whom a process acts for is set once, before any image work, and is a
//! property of the whole process, as its effective uid is: the image
//! library's ownership checks ("owned by ckpt's user") then mean the
//! caller, not root.

use std::sync::OnceLock;

/// The ids of the user ckpt acts for, as the kernel reported them for the
/// service's peer (`SO_PEERCRED`, `SO_PEERGROUPS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
}

/// Upper bound on supplementary groups (the kernel's `NGROUPS_MAX`).
pub const MAX_GROUPS: usize = 65536;

/// Why a caller's description did not parse.
#[derive(Debug, thiserror::Error)]
#[error("caller ids {text:?}: {what}")]
pub struct CallerParseError {
    text: String,
    what: &'static str,
}

impl Caller {
    /// Whether `gid` is one of the caller's groups (primary or
    /// supplementary).
    pub fn has_group(&self, gid: u32) -> bool {
        gid == self.gid || self.groups.contains(&gid)
    }

    /// Whether the caller may create an entry in a directory with this
    /// owner, group and mode, by its permission bits (write and search for
    /// the class the caller falls in, as the kernel checks without ACLs).
    pub fn may_create_in(&self, owner: u32, group: u32, mode: u32) -> bool {
        const WRITE_SEARCH: u32 = 0o3;
        let bits = if owner == self.uid {
            mode >> 6
        } else if self.has_group(group) {
            mode >> 3
        } else {
            mode
        };
        bits & WRITE_SEARCH == WRITE_SEARCH
    }

    /// `UID:GID:G1,G2,...` (the form the service hands its worker).
    pub fn encode(&self) -> String {
        let groups: Vec<String> = self.groups.iter().map(u32::to_string).collect();
        format!("{}:{}:{}", self.uid, self.gid, groups.join(","))
    }

    /// Parses [`Caller::encode`]'s form.
    pub fn decode(text: &str) -> Result<Caller, CallerParseError> {
        let fail = |what| CallerParseError {
            text: text.into(),
            what,
        };
        let mut parts = text.splitn(3, ':');
        let uid = parts.next().and_then(|s| s.parse().ok());
        let gid = parts.next().and_then(|s| s.parse().ok());
        let (Some(uid), Some(gid)) = (uid, gid) else {
            return Err(fail("no UID:GID"));
        };
        let groups = match parts.next() {
            None | Some("") => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|g| g.parse().ok())
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| fail("a group is not a number"))?,
        };
        if groups.len() > MAX_GROUPS {
            return Err(fail("more groups than the kernel allows"));
        }
        Ok(Caller { uid, gid, groups })
    }
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "uid {}", self.uid)
    }
}

static ACTING_FOR: OnceLock<Caller> = OnceLock::new();

/// Makes this process act for `caller` from now on. Set once, before any
/// image is read or written; a second call with another caller fails.
pub fn act_for(caller: Caller) -> Result<(), Caller> {
    let wanted = caller.clone();
    ACTING_FOR.set(caller)?;
    if ACTING_FOR.get() == Some(&wanted) {
        Ok(())
    } else {
        Err(wanted)
    }
}

/// The user this process acts for, if it is the service's worker.
pub fn acting_for() -> Option<&'static Caller> {
    ACTING_FOR.get()
}

/// The uid whose files and directories count as ckpt's own: the caller's
/// when acting for one, else the effective uid.
pub fn owner_uid() -> u32 {
    acting_for().map_or_else(crate::sys::euid, |c| c.uid)
}

/// The kernel would not let this thread take the caller's file access
/// rights.
#[derive(Debug, thiserror::Error)]
#[error("cannot take {caller}'s file access rights (setfsuid); refusing to act as root for it")]
pub struct RightsError {
    caller: String,
}

/// Runs `f` with the file access rights of the caller this process acts
/// for (its filesystem uid and gid; root's supplementary groups stay), so
/// that what root opens, creates, removes or connects to by a path the
/// caller named is only what the caller could reach themselves: a link or
/// directory of another user's then stops it as it would stop the caller.
/// Not acting for a caller, `f` runs as is. This thread only: `f` must not
/// hand the work to another thread.
pub fn with_caller_rights<T>(f: impl FnOnce() -> T) -> Result<T, RightsError> {
    let Some(c) = acting_for() else {
        return Ok(f());
    };
    let (uid, gid) = crate::sys::set_fs_ids(c.uid, c.gid);
    // A kernel that refused the switch would have `f` run as root: never.
    let out = (crate::sys::fs_uid() == c.uid).then(f);
    crate::sys::set_fs_ids(uid, gid);
    out.ok_or_else(|| RightsError {
        caller: c.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_round_trips_and_bad_forms_are_refused() {
        let c = Caller {
            uid: 1000,
            gid: 100,
            groups: vec![100, 27],
        };
        assert_eq!(Caller::decode(&c.encode()).unwrap(), c);
        let bare = Caller {
            uid: 5,
            gid: 6,
            groups: vec![],
        };
        assert_eq!(Caller::decode("5:6:").unwrap(), bare);
        assert_eq!(Caller::decode("5:6").unwrap(), bare);
        for bad in ["", "x:1:", "1", "1:2:a", "1:2:3,,4"] {
            assert!(Caller::decode(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn creation_rights_follow_the_class_the_caller_is_in() {
        let c = Caller {
            uid: 1000,
            gid: 100,
            groups: vec![27],
        };
        assert!(c.may_create_in(1000, 0, 0o700));
        assert!(!c.may_create_in(1000, 0, 0o500));
        // Owner bits decide for the owner, even if group bits would allow.
        assert!(!c.may_create_in(1000, 27, 0o570));
        assert!(c.may_create_in(0, 27, 0o770));
        assert!(!c.may_create_in(0, 5, 0o770));
        // /tmp: anyone may create.
        assert!(c.may_create_in(0, 0, 0o1777));
        assert!(!c.may_create_in(0, 0, 0o755));
    }
}
