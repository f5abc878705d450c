//! The kernel's view of every UNIX socket, from one `sock_diag` netlink
//! dump (`NETLINK_SOCK_DIAG`, `unix_diag_req`): peers by inode, which
//! /proc and getsockopt do not tell, and the shutdown state.

use std::collections::HashMap;

use super::super::sockdiag;

/// What sock_diag reports for one UNIX socket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnixDiag {
    /// Its inode.
    pub ino: u64,
    /// SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET.
    pub sock_type: u8,
    /// The kernel's state (`TCP_LISTEN` for a listening socket).
    pub state: u8,
    /// Inode of the socket it is connected to (0: none).
    pub peer: u64,
    /// `sk_shutdown` (1: receive, 2: send).
    pub shutdown: u8,
    /// Bound name (`sun_path` bytes; leading NUL when abstract).
    pub name: Vec<u8>,
    /// Connections waiting to be accepted (listening only).
    pub pending: usize,
    /// The inodes of their clients, in the order `accept` takes them (0
    /// for a client already closed).
    pub pending_clients: Vec<u64>,
    /// Listening: the backlog; otherwise bytes (truesize) it sent that
    /// its peer has not read.
    pub wqueue: u32,
}

// uapi/linux/unix_diag.h.
const UNIX_DIAG_REQ_LEN: usize = 24;
const UNIX_DIAG_MSG_LEN: usize = 16;
const UDIAG_SHOW_NAME: u32 = 0x1;
const UDIAG_SHOW_VFS: u32 = 0x2;
const UDIAG_SHOW_PEER: u32 = 0x4;
const UDIAG_SHOW_ICONS: u32 = 0x8;
const UDIAG_SHOW_RQLEN: u32 = 0x10;
const UDIAG_SHOW_UID: u32 = 0x40;
const UNIX_DIAG_NAME: u16 = 0;
const UNIX_DIAG_PEER: u16 = 2;
const UNIX_DIAG_ICONS: u16 = 3;
const UNIX_DIAG_RQLEN: u16 = 4;
const UNIX_DIAG_SHUTDOWN: u16 = 6;
/// `sk_state` of a connected (or pending) socket.
pub const TCP_ESTABLISHED: u8 = 1;
/// `sk_state` of a listening socket.
pub const TCP_LISTEN: u8 = 10;
/// Every socket state.
const ALL_STATES: u32 = u32::MAX;

/// Every UNIX socket of ckpt's network namespace, by inode.
pub fn all() -> std::io::Result<HashMap<u64, UnixDiag>> {
    let mut req = Vec::with_capacity(UNIX_DIAG_REQ_LEN);
    req.push(libc::AF_UNIX as u8);
    req.push(0); // protocol
    req.extend_from_slice(&0u16.to_ne_bytes()); // pad
    req.extend_from_slice(&ALL_STATES.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes()); // any inode
    let show = UDIAG_SHOW_NAME
        | UDIAG_SHOW_VFS
        | UDIAG_SHOW_PEER
        | UDIAG_SHOW_ICONS
        | UDIAG_SHOW_RQLEN
        | UDIAG_SHOW_UID;
    req.extend_from_slice(&show.to_ne_bytes());
    req.extend_from_slice(&[0xff; 8]); // no cookie
    let mut out = HashMap::new();
    for msg in sockdiag::dump(&req)? {
        let d = parse_socket(&msg)?;
        out.insert(d.ino, d);
    }
    Ok(out)
}

fn parse_socket(m: &[u8]) -> std::io::Result<UnixDiag> {
    if m.len() < UNIX_DIAG_MSG_LEN {
        return Err(sockdiag::bad("short unix_diag_msg"));
    }
    let mut d = UnixDiag {
        sock_type: m[1],
        state: m[2],
        ino: u64::from(sockdiag::u32_at(m, 4)?),
        ..Default::default()
    };
    for (kind, data) in sockdiag::attributes(m, UNIX_DIAG_MSG_LEN) {
        match kind {
            UNIX_DIAG_NAME => d.name = data.to_vec(),
            UNIX_DIAG_PEER => d.peer = u64::from(sockdiag::u32_at(data, 0)?),
            UNIX_DIAG_SHUTDOWN => {
                d.shutdown = *data.first().ok_or_else(|| sockdiag::bad("shutdown"))?;
            }
            UNIX_DIAG_ICONS => {
                d.pending_clients = data
                    .chunks_exact(4)
                    .map(|c| u64::from(u32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
                    .collect();
                d.pending = d.pending_clients.len();
            }
            UNIX_DIAG_RQLEN => d.wqueue = sockdiag::u32_at(data, 4)?,
            _ => {}
        }
    }
    Ok(d)
}
