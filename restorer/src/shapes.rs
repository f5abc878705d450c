//! Sessions and process groups whose leader is gone, restore side.
//!
//! A session is only inherited over fork, and a process can only join a
//! process group that exists in its own session. When a member's session
//! is not its parent's and the leader is not a process of the tree (it
//! exited, e.g. a daemon that double-forked, or it is a zombie child of
//! the same parent), the parent forks a helper with the session's pid
//! (`clone3` `set_tid`) that calls `setsid`, and the helper forks the
//! member with `CLONE_PARENT`: the member starts in the session but is
//! the parent's child, as it was. A group whose leader is gone is made
//! the same way, by a helper with the group's pid forked by the member
//! (which is in the right session by then) that calls `setpgid(0, 0)`
//! just long enough for the member to join. Temporary helpers then exit
//! and are reaped by their parent, with the SIGCHLD they sent it taken
//! back, before anything of the parent's own (pending signals, zombies)
//! is restored: nothing of them is left. A zombie leader plays its own
//! helper and then dies as it was.

use std::collections::BTreeMap;

use ckpt_image::task::Core;
use ckpt_parasite::remote::Remote;
use ckpt_parasite::{ParasiteError, Tracee};
use nix::errno::Errno;

use crate::error::{RestoreError, Result};
use crate::read::Zombie;
use crate::tree;

/// `__WALL` for wait4: the helpers are reaped whatever their exit signal.
const WAIT_ALL: u64 = 0x4000_0000;

/// A process holding a session or group id while members are forked.
struct Helper {
    pid: i32,
    t: Tracee,
    /// A zombie of the tree (dies as saved later) rather than a temporary.
    zombie: bool,
}

/// The helpers one parent forks its children through.
#[derive(Default)]
pub struct Leaders {
    helpers: Vec<Helper>,
}

impl Leaders {
    /// Forks, early, the zombie children of the parent behind `r` that led
    /// a session or a group, so members can be forked into it or join it.
    pub fn fork_zombie_leaders<'z>(
        &mut self,
        r: &Remote<'_>,
        zombies: impl Iterator<Item = &'z Zombie>,
    ) -> Result<()> {
        for z in zombies {
            let Some(ids) = &z.ids else { continue };
            let call = if ids.sid == z.pid {
                ("setsid", libc::SYS_setsid)
            } else if ids.pgid == z.pid {
                ("setpgid", libc::SYS_setpgid)
            } else {
                continue;
            };
            let t = tree::fork_child(r, z.pid)?;
            Remote {
                t: &t,
                base: r.base,
            }
            .call(call.0, call.1, [0; 6])?;
            log::debug!("pid {}: zombie leader forked early ({})", z.pid, call.0);
            self.helpers.push(Helper {
                pid: z.pid,
                t,
                zombie: true,
            });
        }
        Ok(())
    }

    /// Forks child `pid` (whose core is `core`) of the parent behind `r`
    /// (whose core is `parent`): directly, or through the helper holding
    /// its session when the parent is not in it.
    pub fn fork_member(
        &mut self,
        r: &Remote<'_>,
        parent: &Core,
        pid: i32,
        core: &Core,
    ) -> Result<Tracee> {
        let sid = core.sid;
        if sid == parent.sid || sid == pid {
            return tree::fork_child_sharing(r, pid, core);
        }
        // Forked through a helper below, it could share only the helper's.
        if tree::sharing_flags(core) != 0 {
            return Err(RestoreError::Host {
                pid,
                what: format!(
                    "shares its parent's fd table or cwd but is in session {sid}, \
                     neither its parent's nor its own"
                ),
            });
        }
        let i = match self.helpers.iter().position(|h| h.pid == sid) {
            Some(i) => i,
            None => {
                let t = tree::fork_child(r, sid).map_err(|e| RestoreError::Host {
                    pid,
                    what: format!("creating session {sid} (its leader is gone): {e}"),
                })?;
                Remote {
                    t: &t,
                    base: r.base,
                }
                .call("setsid", libc::SYS_setsid, [0; 6])?;
                log::debug!("pid {pid}: session helper {sid}");
                self.helpers.push(Helper {
                    pid: sid,
                    t,
                    zombie: false,
                });
                self.helpers.len() - 1
            }
        };
        tree::fork_sibling(
            &Remote {
                t: &self.helpers[i].t,
                base: r.base,
            },
            pid,
        )
    }

    /// Ends the temporary helpers (the parent behind `r` reaps them and
    /// takes back their SIGCHLD) and hands back the zombie leaders, still
    /// alive, by pid.
    pub fn finish(self, r: &Remote<'_>) -> Result<BTreeMap<i32, Tracee>> {
        let mut zombies = BTreeMap::new();
        let mut ended = false;
        for h in self.helpers {
            if h.zombie {
                zombies.insert(h.pid, h.t);
            } else {
                end_helper(r, h.t)?;
                ended = true;
            }
        }
        if ended {
            take_sigchld(r)?;
        }
        Ok(zombies)
    }
}

/// Makes sure the process group of the freshly forked member behind `r`
/// exists in its session, creating it with a helper when its leader is
/// gone; `task::restore_session` then moves the member into it. Groups of
/// `adopted`, the session from outside the tree the root had (it is in
/// the restorer's now), are not made.
pub fn ensure_group(r: &Remote<'_>, core: &Core, adopted: Option<i32>) -> Result<()> {
    make_group(r, core.pid, core.sid, core.pgid, adopted)
}

/// Moves the zombie-to-be behind `r` into the group it was in, when it is
/// not the one it inherited and it did not lead it (a leader was placed by
/// [`Leaders::fork_zombie_leaders`]). Its session is its parent's.
pub fn join_zombie_group(r: &Remote<'_>, z: &Zombie, adopted: Option<i32>) -> Result<()> {
    let Some(ids) = &z.ids else { return Ok(()) };
    if ids.pgid == z.pid || ids.sid == z.pid || adopted == Some(ids.sid) {
        return Ok(());
    }
    let host = r.t.pid();
    let now = std::fs::read_to_string(format!("/proc/{host}/stat"))
        .map_err(|e| RestoreError::os(host, "read stat", e))?;
    let field = |n: usize| -> i32 {
        now.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(n)?.parse().ok())
            .unwrap_or(0)
    };
    let (pgid_now, sid_now) = (field(2), field(3));
    if pgid_now == ids.pgid {
        return Ok(());
    }
    if sid_now != ids.sid {
        // A group of another session cannot be joined; a zombie keeps no
        // more than its status there.
        log::warn!(
            "pid {}: zombie of session {} comes back in its parent's session {sid_now}",
            z.pid,
            ids.sid
        );
        return Ok(());
    }
    make_group(r, z.pid, ids.sid, ids.pgid, adopted)?;
    r.call(
        "setpgid",
        libc::SYS_setpgid,
        [0, ids.pgid as u64, 0, 0, 0, 0],
    )?;
    Ok(())
}

fn make_group(r: &Remote<'_>, pid: i32, sid: i32, pgid: i32, adopted: Option<i32>) -> Result<()> {
    if pgid == pid || pgid == sid || adopted == Some(sid) {
        return Ok(());
    }
    // Signal 0 to the group: delivers nothing, fails if it has no member.
    match r.call("kill", libc::SYS_kill, [(-pgid) as u64, 0, 0, 0, 0, 0]) {
        Ok(_) => return Ok(()),
        Err(ParasiteError::RemoteSyscall {
            errno: Errno::ESRCH,
            ..
        }) => {}
        Err(e) => return Err(e.into()),
    }
    let h = tree::fork_child(r, pgid).map_err(|e| RestoreError::Host {
        pid,
        what: format!("creating process group {pgid} (its leader is gone): {e}"),
    })?;
    Remote {
        t: &h,
        base: r.base,
    }
    .call("setpgid", libc::SYS_setpgid, [0; 6])?;
    r.call("setpgid", libc::SYS_setpgid, [0, pgid as u64, 0, 0, 0, 0])?;
    log::debug!("pid {pid}: group helper {pgid}");
    end_helper(r, h)?;
    take_sigchld(r)
}

/// Makes helper `h` exit and has its parent (behind `r`) reap it.
fn end_helper(r: &Remote<'_>, h: Tracee) -> Result<()> {
    let pid = h.pid();
    let inner = crate::pid::inner(pid)?;
    match h.syscall_at(r.base, libc::SYS_exit_group, [0; 6]) {
        Err(ParasiteError::Died { .. }) => {}
        Err(e) => return Err(e.into()),
        Ok(ret) => {
            return Err(RestoreError::Host {
                pid,
                what: format!("helper's exit_group returned {ret}"),
            });
        }
    }
    r.call(
        "wait4",
        libc::SYS_wait4,
        [inner as u64, 0, WAIT_ALL, 0, 0, 0],
    )?;
    Ok(())
}

/// Takes the helpers' SIGCHLD back from the process behind `r` (which has
/// every signal blocked while it is rebuilt and nothing of its own
/// pending yet).
fn take_sigchld(r: &Remote<'_>) -> Result<()> {
    let set = r.put_u64s(0, &[1u64 << (libc::SIGCHLD - 1)])?;
    let zero = r.put_u64s(1, &[0, 0])?;
    match r.call(
        "rt_sigtimedwait",
        libc::SYS_rt_sigtimedwait,
        [set, 0, zero, 8, 0, 0],
    ) {
        Ok(_)
        | Err(ParasiteError::RemoteSyscall {
            errno: Errno::EAGAIN,
            ..
        }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
