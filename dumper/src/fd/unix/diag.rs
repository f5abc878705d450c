//! The kernel's view of every UNIX socket, from one `sock_diag` netlink
//! dump (`NETLINK_SOCK_DIAG`, `unix_diag_req`): peers by inode, which
//! /proc and getsockopt do not tell, and the shutdown state.

use std::collections::HashMap;

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto, socket,
};

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

// uapi/linux/sock_diag.h, uapi/linux/unix_diag.h, uapi/linux/netlink.h.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;
const UNIX_DIAG_MSG_LEN: usize = 16;
const RTA_HDRLEN: usize = 4;
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
/// Room for one batch of replies.
const RECV_BUF: usize = 64 << 10;

/// Every UNIX socket of ckpt's network namespace, by inode.
pub fn all() -> std::io::Result<HashMap<u64, UnixDiag>> {
    let sock = socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )?;
    let mut req = Vec::with_capacity(NLMSG_HDRLEN + 24);
    req.extend_from_slice(&((NLMSG_HDRLEN + 24) as u32).to_ne_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    req.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
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
    sendto(
        std::os::fd::AsRawFd::as_raw_fd(&sock),
        &req,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )?;
    let mut out = HashMap::new();
    let mut buf = vec![0u8; RECV_BUF];
    loop {
        let n = recv(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            &mut buf,
            MsgFlags::empty(),
        )?;
        if n == 0 {
            return Err(bad("netlink reply ended early"));
        }
        if parse_batch(&buf[..n], &mut out)? {
            return Ok(out);
        }
    }
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("sock_diag: {what}"),
    )
}

fn u16_at(b: &[u8], at: usize) -> std::io::Result<u16> {
    b.get(at..at + 2)
        .map(|s| u16::from_ne_bytes([s[0], s[1]]))
        .ok_or_else(|| bad("short message"))
}

fn u32_at(b: &[u8], at: usize) -> std::io::Result<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| bad("short message"))
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Parses one datagram of replies into `out`; true at the end of the dump.
fn parse_batch(mut b: &[u8], out: &mut HashMap<u64, UnixDiag>) -> std::io::Result<bool> {
    while b.len() >= NLMSG_HDRLEN {
        let len = u32_at(b, 0)? as usize;
        if len < NLMSG_HDRLEN || len > b.len() {
            return Err(bad("bad message length"));
        }
        match u16_at(b, 4)? {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = u32_at(b, NLMSG_HDRLEN)? as i32;
                return Err(std::io::Error::from_raw_os_error(-errno));
            }
            SOCK_DIAG_BY_FAMILY => {
                let d = parse_socket(&b[NLMSG_HDRLEN..len])?;
                out.insert(d.ino, d);
            }
            _ => {}
        }
        b = &b[align4(len).min(b.len())..];
    }
    Ok(false)
}

fn parse_socket(m: &[u8]) -> std::io::Result<UnixDiag> {
    if m.len() < UNIX_DIAG_MSG_LEN {
        return Err(bad("short unix_diag_msg"));
    }
    let mut d = UnixDiag {
        sock_type: m[1],
        state: m[2],
        ino: u64::from(u32_at(m, 4)?),
        ..Default::default()
    };
    let mut attrs = &m[UNIX_DIAG_MSG_LEN..];
    while attrs.len() >= RTA_HDRLEN {
        let len = usize::from(u16_at(attrs, 0)?);
        if len < RTA_HDRLEN || len > attrs.len() {
            return Err(bad("bad attribute length"));
        }
        let data = &attrs[RTA_HDRLEN..len];
        match u16_at(attrs, 2)? {
            UNIX_DIAG_NAME => d.name = data.to_vec(),
            UNIX_DIAG_PEER => d.peer = u64::from(u32_at(data, 0)?),
            UNIX_DIAG_SHUTDOWN => d.shutdown = *data.first().ok_or_else(|| bad("shutdown"))?,
            UNIX_DIAG_ICONS => {
                d.pending_clients = data
                    .chunks_exact(4)
                    .map(|c| u64::from(u32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
                    .collect();
                d.pending = d.pending_clients.len();
            }
            UNIX_DIAG_RQLEN => d.wqueue = u32_at(data, 4)?,
            _ => {}
        }
        attrs = &attrs[align4(len).min(attrs.len())..];
    }
    Ok(d)
}
