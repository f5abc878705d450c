//! Tree shapes the restorer rebuilds with helper processes: sessions and
//! process groups whose leader exited (a daemon that double-forked, a
//! `setsid` whose leader died) or is a zombie of the tree. What it cannot
//! rebuild is refused here, by name, before anything is written.

use std::collections::BTreeMap;

use ckpt_image::manifest::ZombieIds;

use crate::error::{DumpError, Result};
use crate::procfile;
use crate::tree::FrozenProcess;

/// The session and group of a zombie, read from /proc/PID/stat while its
/// parent is frozen; `saved` turns a host pid into the image's.
pub fn zombie_ids(pid: i32, saved: impl Fn(i32) -> i32) -> Result<ZombieIds> {
    let stat = procfile::stat_fields(pid)?;
    let field = |n: usize| stat.get(procfile::stat_index(n)).copied().unwrap_or(0) as i32;
    Ok(ZombieIds {
        sid: saved(field(6)),
        pgid: saved(field(5)),
    })
}

/// A live process of the tree, as far as its shape is concerned.
#[derive(Debug, Clone, Copy)]
pub struct Member {
    /// Its pid.
    pub pid: i32,
    /// Its parent's.
    pub ppid: i32,
    /// Its session.
    pub sid: i32,
    /// Its process group.
    pub pgid: i32,
}

/// Refuses sessions the restorer cannot rebuild: a member forked into a
/// session its parent is not in can only get there through a helper with
/// the session's pid forked by its parent (or the zombie leader itself,
/// when it is a child of the same parent), so the leader may not be a
/// live process of the tree, and all such members of one session must
/// share a parent. `members` lists the live processes, root first, in
/// tree order.
pub fn check(members: &[Member], frozen: &[FrozenProcess]) -> Result<()> {
    let zombies: BTreeMap<i32, Zombie> = frozen
        .iter()
        .filter(|p| p.zombie_status.is_some())
        .map(|p| {
            let stat = procfile::stat_fields(p.pid)?;
            let pgid = stat.get(procfile::stat_index(5)).copied().unwrap_or(0) as i32;
            Ok((p.pid, Zombie { ppid: p.ppid, pgid }))
        })
        .collect::<Result<_>>()?;
    check_shapes(members, &zombies)
}

/// A zombie of the tree: its parent and group.
#[derive(Debug, Clone, Copy)]
struct Zombie {
    ppid: i32,
    pgid: i32,
}

fn check_shapes(members: &[Member], zombies: &BTreeMap<i32, Zombie>) -> Result<()> {
    let index: BTreeMap<i32, usize> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.pid, i))
        .collect();
    // Processes are forked in tree order; a zombie that leads a group is
    // forked first among its parent's children.
    for (i, m) in members.iter().enumerate().skip(1) {
        let g = m.pgid;
        if g == m.pid {
            continue;
        }
        let refuse = |what: String| {
            Err(DumpError::Unsupported {
                pid: m.pid,
                what: format!("process group {g}: {what}"),
            })
        };
        if let Some(&j) = index.get(&g) {
            if members[j].pgid != g {
                return refuse(format!("pid {g} of the tree no longer leads it"));
            }
            if j > i {
                return refuse(format!("its leader pid {g} is restored after this process"));
            }
        } else if let Some(z) = zombies.get(&g) {
            let parent_first = match (index.get(&z.ppid), index.get(&m.ppid)) {
                (Some(zp), Some(mp)) => zp <= mp,
                _ => false,
            };
            if z.pgid != g {
                return refuse(format!("pid {g} is a zombie no longer leading it"));
            }
            if !parent_first {
                return refuse(format!(
                    "its leader is a zombie of pid {}, restored after this process's parent",
                    z.ppid
                ));
            }
        }
    }
    let by_pid: BTreeMap<i32, Member> = members.iter().map(|m| (m.pid, *m)).collect();
    // Session -> the parent of its first member forked from outside it.
    let mut top: BTreeMap<i32, (i32, i32)> = BTreeMap::new();
    for m in members.iter().skip(1) {
        let Some(parent) = by_pid.get(&m.ppid) else {
            continue;
        };
        if m.sid == parent.sid || m.sid == m.pid {
            continue;
        }
        let refuse = |what: String| {
            Err(DumpError::Unsupported {
                pid: m.pid,
                what: format!("session {}: {what}", m.sid),
            })
        };
        if by_pid.contains_key(&m.sid) {
            return refuse(format!(
                "its leader pid {} is in the tree but not an ancestor of this process",
                m.sid
            ));
        }
        if let Some(zppid) = zombies.get(&m.sid).map(|z| z.ppid)
            && zppid != m.ppid
        {
            return refuse(format!(
                "its leader is a zombie of pid {zppid}, not of this process's parent {}",
                m.ppid
            ));
        }
        match top.get(&m.sid) {
            Some(&(other, ppid)) if ppid != m.ppid => {
                return refuse(format!(
                    "its leader exited and its members have different parents (pid {other} under {ppid}, this one under {})",
                    m.ppid
                ));
            }
            Some(_) => {}
            None => {
                top.insert(m.sid, (m.pid, m.ppid));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pid: i32, ppid: i32, sid: i32, pgid: i32) -> Member {
        Member {
            pid,
            ppid,
            sid,
            pgid,
        }
    }

    #[test]
    fn exited_leaders_pass_and_live_non_ancestors_are_refused() {
        let root = m(10, 1, 10, 10);
        // Session 20 and group 30 lost their leaders; 11 sits under 10.
        let ok = [
            root,
            m(11, 10, 20, 20),
            m(12, 10, 20, 20),
            m(13, 10, 10, 30),
        ];
        assert!(check(&ok, &[]).is_ok());
        // Group 12 is led by a process restored after its member 11.
        let late = [root, m(11, 10, 10, 12), m(12, 10, 10, 12)];
        let err = check(&late, &[]).unwrap_err().to_string();
        assert!(
            err.contains("pid 11: process group 12: its leader pid 12 is restored after"),
            "{err}"
        );
        // Group 11 lives on, its pid 11 moved to another group.
        let moved = [root, m(11, 10, 10, 10), m(12, 10, 10, 11)];
        let err = check(&moved, &[]).unwrap_err().to_string();
        assert!(err.contains("no longer leads it"), "{err}");
        // A zombie group leader whose parent comes after the member's.
        let zombies = BTreeMap::from([(20, Zombie { ppid: 11, pgid: 20 })]);
        let zl = [root, m(11, 10, 10, 11), m(12, 10, 10, 20)];
        let err = check_shapes(&zl, &zombies).unwrap_err().to_string();
        assert!(
            err.contains("pid 12: process group 20: its leader is a zombie of pid 11"),
            "{err}"
        );
        // Session 11's leader is alive, but not 12's ancestor.
        let live = [root, m(11, 10, 11, 11), m(12, 10, 11, 11)];
        let err = check(&live, &[]).unwrap_err().to_string();
        assert!(
            err.contains("pid 12: session 11: its leader pid 11"),
            "{err}"
        );
        // Members of session 20 under two parents.
        let split = [
            root,
            m(11, 10, 10, 10),
            m(12, 10, 20, 20),
            m(13, 11, 20, 20),
        ];
        let err = check(&split, &[]).unwrap_err().to_string();
        assert!(err.contains("pid 13: session 20"), "{err}");
    }
}
