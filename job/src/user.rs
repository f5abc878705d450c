//! Becoming a job's user for a root-run site hook (`--as-user UID:GID`).
//!
//! A hook runs as root but must touch a user's directory only with that
//! user's rights: root tidying it could be led elsewhere by a symlink the
//! user swapped in. What only root may read (the site's image key) is read
//! first; then ckpt drops to the user in-process, never exec'ing again, so
//! nothing of the user's can read what it holds: the process is made
//! non-dumpable before the drop, which keeps the user from ptrace and from
//! its /proc files (mem, fd) whatever `fs.suid_dumpable` says.

use std::str::FromStr;

use nix::unistd::{Gid, Uid, getresgid, getresuid};

use crate::JobError;

/// A job's user and group, as `--as-user UID:GID` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobUser {
    /// The user id.
    pub uid: u32,
    /// The primary group id (the only group kept).
    pub gid: u32,
}

impl FromStr for JobUser {
    type Err = String;

    fn from_str(s: &str) -> Result<JobUser, String> {
        let (uid, gid) = s
            .split_once(':')
            .ok_or_else(|| format!("{s}: expected UID:GID (numbers)"))?;
        let number = |n: &str| {
            n.parse::<u32>()
                .map_err(|_| format!("{s}: {n} is not a numeric id"))
        };
        Ok(JobUser {
            uid: number(uid)?,
            gid: number(gid)?,
        })
    }
}

impl std::fmt::Display for JobUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.uid, self.gid)
    }
}

impl JobUser {
    /// Makes this process run as the user, for good: real, effective and
    /// saved ids, no supplementary groups, not dumpable. Run as the user
    /// already, it changes nothing; run as anyone else, it fails.
    pub fn become_it(self) -> Result<(), JobError> {
        let me = nix::unistd::geteuid().as_raw();
        if me == self.uid {
            return Ok(());
        }
        if me != 0 {
            return Err(JobError::NotRoot { user: self, me });
        }
        if self.uid == 0 {
            // Root's own job: nothing to drop.
            return Ok(());
        }
        // Before the ids change: from the drop on, the user's processes
        // would otherwise be allowed to attach to this one and read the
        // key it holds.
        nix::sys::prctl::set_dumpable(false).map_err(self.step("prctl(PR_SET_DUMPABLE, 0)"))?;
        let (uid, gid) = (Uid::from_raw(self.uid), Gid::from_raw(self.gid));
        nix::unistd::setgroups(&[]).map_err(self.step("setgroups(none)"))?;
        nix::unistd::setresgid(gid, gid, gid)
            .map_err(self.step(&format!("setresgid({})", self.gid)))?;
        nix::unistd::setresuid(uid, uid, uid)
            .map_err(self.step(&format!("setresuid({})", self.uid)))?;
        // A drop that half-happened must not go on as root.
        let u = getresuid().map_err(|source| JobError::OwnIds {
            call: "getresuid",
            source,
        })?;
        let g = getresgid().map_err(|source| JobError::OwnIds {
            call: "getresgid",
            source,
        })?;
        if [u.real, u.effective, u.saved] != [uid; 3] || [g.real, g.effective, g.saved] != [gid; 3]
        {
            return Err(JobError::IdsUnchanged { user: self });
        }
        Ok(())
    }

    /// The error of one failed step of [`JobUser::become_it`].
    fn step(self, step: &str) -> impl FnOnce(nix::Error) -> JobError {
        let step = step.to_string();
        move |source| JobError::UserStep {
            user: self,
            step,
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_users_parse_as_numbers_only() {
        assert_eq!(
            "1000:100".parse::<JobUser>(),
            Ok(JobUser {
                uid: 1000,
                gid: 100
            })
        );
        for bad in ["1000", "alice:100", "1000:", ":1", "-1:2"] {
            assert!(bad.parse::<JobUser>().is_err(), "{bad}");
        }
    }
}
