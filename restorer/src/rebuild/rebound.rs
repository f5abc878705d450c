//! What of the rebuilt tree was bound to the restoring command instead of
//! restored as dumped, one notice per process and kind.

use crate::fd;
use crate::outcome::Rebound;
use crate::task::SessionOrigin;

/// The notices for a tree whose root (`root`) got its session from
/// `session` and whose fds went as `fds` tells.
pub(super) fn collect(root: i32, session: SessionOrigin, fds: &fd::Tables) -> Vec<Rebound> {
    let mut rebound = Vec::new();
    if session == SessionOrigin::Adopted {
        rebound.push(Rebound::Session { pid: root });
    }
    for b in fds.bound() {
        // Consecutive fds of one process and kind make one notice.
        match (rebound.last_mut(), b.kind) {
            (Some(Rebound::Terminal { pid, fds }), fd::BoundKind::Terminal)
            | (Some(Rebound::StdioPipe { pid, fds }), fd::BoundKind::StdioPipe)
                if *pid == b.pid =>
            {
                fds.push(b.fd)
            }
            (_, fd::BoundKind::Terminal) => rebound.push(Rebound::Terminal {
                pid: b.pid,
                fds: vec![b.fd],
            }),
            (_, fd::BoundKind::StdioPipe) => rebound.push(Rebound::StdioPipe {
                pid: b.pid,
                fds: vec![b.fd],
            }),
        }
    }
    for w in fds.withheld() {
        match rebound.last_mut() {
            Some(Rebound::Withheld { pid, fds, owner }) if *pid == w.pid && *owner == w.owner => {
                fds.push(w.fd)
            }
            _ => rebound.push(Rebound::Withheld {
                pid: w.pid,
                fds: vec![w.fd],
                owner: w.owner,
            }),
        }
    }
    rebound
}
