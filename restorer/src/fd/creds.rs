//! Reopening a process's files with its own filesystem credentials.
//!
//! When fds are restored the new process still runs as root (its dumped
//! credentials are set last, since rebuilding needs privileges). Opening
//! its files as root would let a path swapped since the dump (a symbolic
//! link to `/etc/shadow`) hand the process a file its user may not open.
//! So for the fd restore the process takes the dumped fsuid, fsgid and
//! supplementary groups: these only drive permission checks on the file
//! system (and while fsuid is not 0 the kernel drops the file capabilities
//! such as CAP_DAC_OVERRIDE), while the process keeps the real and
//! effective root it needs for the rest. Afterwards fsuid and fsgid go back;
//! the groups stay the dumped ones, which the credential restore sets
//! anyway.

use ckpt_image::task::Creds;
use ckpt_parasite::batch::Call;
use ckpt_parasite::remote::Remote;

use crate::error::{RestoreError, Result};

/// The filesystem identity a process's files are reopened with.
pub struct FsIdentity {
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

/// Position of the filesystem id in `Creds.uids` / `Creds.gids` (real,
/// effective, saved, filesystem).
const FS_ID: usize = 3;
/// `setfsuid(-1)`: changes nothing and returns the current value.
const QUERY: u64 = u32::MAX as u64;

/// The fsuid and fsgid a process had before [`FsIdentity::assume`].
pub struct Previous {
    uid: u32,
    gid: u32,
}

impl FsIdentity {
    /// The dumped process's filesystem identity, if the image has its
    /// credentials.
    pub fn of(creds: Option<&Creds>) -> Option<Self> {
        let c = creds?;
        Some(FsIdentity {
            uid: *c.uids.get(FS_ID)?,
            gid: *c.gids.get(FS_ID)?,
            groups: c.groups.clone(),
        })
    }

    /// The filesystem uid.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Whether a file this identity recreates may be given owner `uid` and
    /// group `gid`: only its own user and one of its groups, as the user
    /// could have done with `chown` (root may give any). A file of another
    /// user that the job used (a 0666 POSIX shm file, deleted since by its
    /// owner) must not come back in that user's name holding the job's
    /// data.
    pub fn may_own(&self, uid: u32, gid: u32) -> bool {
        self.uid == 0 || (uid == self.uid && (gid == self.gid || self.groups.contains(&gid)))
    }

    /// Whether this identity may open a file of owner `uid`, group `gid`
    /// and mode `mode` for `access` (`O_RDONLY`, `O_WRONLY` or `O_RDWR`),
    /// by the permission bits alone, as the kernel checks them (root may).
    pub fn may_open(&self, uid: u32, gid: u32, mode: u32, access: i32) -> bool {
        if self.uid == 0 {
            return true;
        }
        let bits = if uid == self.uid {
            mode >> 6
        } else if gid == self.gid || self.groups.contains(&gid) {
            mode >> 3
        } else {
            mode
        } & 0o7;
        let want = match access & libc::O_ACCMODE {
            libc::O_RDONLY => 0o4,
            libc::O_WRONLY => 0o2,
            _ => 0o6,
        };
        bits & want == want
    }

    /// Runs `f` while the process behind `r` checks file access as this
    /// identity, then gives it back its own fs ids, whatever `f` returned
    /// (its result comes back untouched for the caller to judge).
    pub fn while_assumed<T>(&self, r: &Remote<'_>, f: impl FnOnce() -> T) -> Result<T> {
        let previous = self.assume(r)?;
        let out = f();
        previous.restore(r)?;
        Ok(out)
    }

    /// Makes the process behind `r` check file access as this identity:
    /// the old ids read, the groups and ids set and read back, in one stop.
    pub fn assume(&self, r: &Remote<'_>) -> Result<Previous> {
        let bytes: Vec<u8> = self.groups.iter().flat_map(|g| g.to_ne_bytes()).collect();
        let groups_at = r.put(0, &bytes)?;
        let mut calls = vec![
            query("setfsuid (query)", libc::SYS_setfsuid),
            query("setfsgid (query)", libc::SYS_setfsgid),
            Call {
                name: "setgroups",
                nr: libc::SYS_setgroups,
                args: [self.groups.len() as u64, groups_at, 0, 0, 0, 0],
            },
        ];
        calls.extend(fs_id_calls(self.uid, self.gid));
        let got = r.call_many(&calls)?;
        check_fs_ids(r, self.uid, self.gid, &got[3..])?;
        Ok(Previous {
            uid: got[0] as u32,
            gid: got[1] as u32,
        })
    }
}

/// [`FsIdentity::while_assumed`] for a process that may have no dumped
/// identity (an image without credentials): then `f` runs as the process
/// is.
pub fn as_user<T>(
    identity: Option<&FsIdentity>,
    r: &Remote<'_>,
    f: impl FnOnce() -> T,
) -> Result<T> {
    match identity {
        Some(i) => i.while_assumed(r, f),
        None => Ok(f()),
    }
}

impl Previous {
    /// Gives the process back the fsuid and fsgid it had (and with an
    /// fsuid of 0, the file capabilities).
    pub fn restore(self, r: &Remote<'_>) -> Result<()> {
        set_fs_ids(r, self.uid, self.gid)
    }
}

/// setfsgid + setfsuid, checked: both return the old value whatever
/// happens, so the new one is read back (one stop for the four calls).
fn set_fs_ids(r: &Remote<'_>, uid: u32, gid: u32) -> Result<()> {
    let got = r.call_many(&fs_id_calls(uid, gid))?;
    check_fs_ids(r, uid, gid, &got)
}

/// setfsgid, setfsuid, then both read back.
fn fs_id_calls(uid: u32, gid: u32) -> [Call; 4] {
    [
        Call {
            name: "setfsgid",
            nr: libc::SYS_setfsgid,
            args: [gid as u64, 0, 0, 0, 0, 0],
        },
        Call {
            name: "setfsuid",
            nr: libc::SYS_setfsuid,
            args: [uid as u64, 0, 0, 0, 0, 0],
        },
        query("setfsgid (query)", libc::SYS_setfsgid),
        query("setfsuid (query)", libc::SYS_setfsuid),
    ]
}

/// `setfsuid(-1)` or `setfsgid(-1)`: the current value.
fn query(name: &'static str, nr: i64) -> Call {
    Call {
        name,
        nr,
        args: [QUERY, 0, 0, 0, 0, 0],
    }
}

/// The results of [`fs_id_calls`] say the ids were taken.
fn check_fs_ids(r: &Remote<'_>, uid: u32, gid: u32, results: &[u64]) -> Result<()> {
    let (got_gid, got_uid) = (results[2] as u32, results[3] as u32);
    if (got_uid, got_gid) != (uid, gid) {
        return Err(RestoreError::Host {
            pid: r.t.pid(),
            what: format!(
                "could not take filesystem ids {uid}:{gid} to reopen files (got {got_uid}:{got_gid})"
            ),
        });
    }
    Ok(())
}
