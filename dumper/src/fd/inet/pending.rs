//! Connections a listening socket of the tree has not accepted yet.
//!
//! Such a connection's server end has no fd: it waits in the listener's
//! accept queue, and the kernel shows its bytes only to accept(2), which
//! would take it from the program. Repair mode cannot put a socket into
//! an accept queue either. It shows in the network namespace's table
//! (`/proc/PID/net/tcp`) with inode 0: no file holds it yet. What can be saved is the client end, when the
//! tree holds it and the server end holds none of its bytes (TCP_INFO's
//! bytes_acked counts only the SYN, and the FIN when acknowledged): the
//! restore then connects the client anew to the restored listener (a real
//! handshake, which puts a new server end in its accept queue) and sends
//! what the client had queued, then its FIN. Sequence numbers differ, the
//! program sees the same stream. A connection holding bytes at the server
//! end, or whose client is outside the tree, is refused by name.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::AsFd;

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::inet::{InetFile, InetState};

use super::{TreeFiles, tcp_state};
use crate::error::{DumpError, Result};
use crate::procfile;
use crate::sys;

/// Sequence numbers a client's peer acknowledges for a connection it
/// holds no byte of: the SYN.
const SYN: u64 = 1;

/// Whether a listener bound to `listener` takes connections to `peer`.
pub(super) fn accepts(listener: SocketAddr, peer: SocketAddr) -> bool {
    listener.port() == peer.port() && (listener.ip() == peer.ip() || listener.ip().is_unspecified())
}

/// An IPv4-mapped IPv6 address as the IPv4 one (a dual-stack listener's
/// connections from IPv4 clients).
fn plain(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}

/// The connections waiting in an accept queue of the network namespace of
/// process `pid` (sockets no file holds yet), each as (server end's local
/// address, client's address).
pub(super) fn unaccepted(pid: i32) -> Result<Vec<(SocketAddr, SocketAddr)>> {
    let mut found = Vec::new();
    for table in ["net/tcp", "net/tcp6"] {
        found.extend(
            super::connecting::entries(pid, table)?
                .into_iter()
                .filter(|e| e.inode == 0 && e.remote.port() != 0)
                .map(|e| (plain(e.local), plain(e.remote))),
        );
    }
    Ok(found)
}

/// The local addresses of the TCP listeners of the processes `pids` with
/// connections in their accept queue.
pub(super) fn listeners(pids: &[i32]) -> Result<Vec<SocketAddr>> {
    let mut found = Vec::new();
    for &pid in pids {
        for fd in procfile::numbered_entries(pid, "fd")? {
            let Ok(sock) = sys::take_fd(pid, fd) else {
                continue;
            };
            let Ok(info) = super::tcp_info(sock.as_fd()) else {
                continue;
            };
            if info.state == tcp_state::LISTEN
                && info.unacked > 0
                && let Ok(Some(local)) = sys::sock_addr(sock.as_fd(), sys::SockEnd::Local)
            {
                found.push(local);
            }
        }
    }
    Ok(found)
}

/// A listener of the tree with connections not accepted yet.
struct Listener {
    file_id: u64,
    local: SocketAddr,
    pending: u32,
}

/// Names the listener of every client of the tree whose server end waits
/// in a listener's accept queue (`unaccepted_by`), once the ends of the
/// tree's connections are matched; refuses a client whose server end
/// holds bytes of it, and a listener with connections whose clients the
/// tree does not hold.
pub(super) fn link(tree: &mut TreeFiles) -> Result<()> {
    let listeners: Vec<Listener> = tree
        .files
        .files
        .iter()
        .filter_map(|f| match &f.kind {
            Some(Kind::Inet(i)) if i.state == InetState::Listen as i32 && i.pending > 0 => {
                Some(Listener {
                    file_id: f.id,
                    local: i.local.as_ref()?.to_socket_addr()?,
                    pending: i.pending,
                })
            }
            _ => None,
        })
        .collect();
    if listeners.is_empty() {
        return Ok(());
    }
    let holders: HashMap<u64, (i32, i32)> =
        tree.holders().map(|h| (h.file_id, (h.pid, h.fd))).collect();
    let mut clients: HashMap<u64, u32> = HashMap::new();
    for f in &mut tree.files.files {
        let Some(Kind::Inet(InetFile {
            local: Some(local),
            peer: Some(peer),
            tcp: Some(conn),
            ..
        })) = &mut f.kind
        else {
            continue;
        };
        if conn.peer_file_id != 0 {
            continue;
        }
        let (Some(local), Some(peer)) = (local.to_socket_addr(), peer.to_socket_addr()) else {
            continue;
        };
        let Some(listener) = listeners.iter().find(|l| accepts(l.local, peer)) else {
            continue;
        };
        let &(pid, fd) = holders
            .get(&f.id)
            .expect("every collected file has a holder");
        // A client of a server outside the tree on the listener's port is
        // not one (`chosen` took it for what it is too).
        if !unaccepted(pid)?.contains(&(plain(peer), plain(local))) {
            continue;
        }
        let refuse = |what: String| DumpError::Unsupported {
            pid,
            what: format!(
                "fd {fd}: TCP connection {local} -> {peer} not accepted yet by its listener in the tree: {what}"
            ),
        };
        let copy = sys::take_fd(pid, fd).map_err(|e| DumpError::Proc {
            pid,
            path: format!("fd {fd}: pidfd_getfd").into(),
            source: e,
        })?;
        let (info, len) =
            sys::getsockopt_raw::<sys::TcpInfo>(copy.as_fd(), libc::IPPROTO_TCP, libc::TCP_INFO)
                .map_err(|e| DumpError::Proc {
                    pid,
                    path: format!("fd {fd}: TCP_INFO").into(),
                    source: e,
                })?;
        if len < sys::TCP_INFO_WITH_BYTES {
            return Err(refuse(
                "this kernel's TCP_INFO has no byte counters to tell whether the listener holds bytes of it".into(),
            ));
        }
        let fin_acked = u64::from(info.state == tcp_state::FIN_WAIT2);
        let held = info.bytes_acked.saturating_sub(SYN + fin_acked);
        if held > 0 || conn.recv_len > 0 || conn.fin_received {
            return Err(refuse(format!(
                "the listener holds {held} bytes of it, which the kernel shows only by accepting"
            )));
        }
        conn.unaccepted_by = listener.file_id;
        *clients.entry(listener.file_id).or_default() += 1;
        log::debug!("pid {pid} fd {fd}: TCP {local} -> {peer}: not accepted yet, connects anew");
    }
    for l in &listeners {
        let from_tree = clients.get(&l.file_id).copied().unwrap_or(0);
        if from_tree < l.pending {
            let &(pid, fd) = holders
                .get(&l.file_id)
                .expect("every collected file has a holder");
            return Err(DumpError::Unsupported {
                pid,
                what: format!(
                    "fd {fd}: listening TCP socket {} with {} connection(s) not accepted yet, {} of them from outside the tree",
                    l.local,
                    l.pending,
                    l.pending - from_tree
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_listener_takes_its_port_on_any_address() {
        let peer: SocketAddr = "127.0.0.1:80".parse().unwrap();
        assert!(accepts("0.0.0.0:80".parse().unwrap(), peer));
        assert!(accepts("127.0.0.1:80".parse().unwrap(), peer));
        assert!(!accepts("127.0.0.2:80".parse().unwrap(), peer));
        assert!(!accepts("0.0.0.0:81".parse().unwrap(), peer));
    }
}
