//! Netlink sockets: protocol, bound port id, multicast groups, connected
//! destination and options.
//!
//! What getsockname and NETLINK_LIST_MEMBERSHIPS tell is read from
//! sock_diag instead (`NETLINK_SOCK_DIAG`, `netlink_diag_req`, found by
//! inode), which gives the port id, the destination, every group and the
//! flags in one reply, and also whether a dump is in progress and how
//! much is queued. The dump lists only sockets bound or in a group: one
//! missing from it was never bound (getsockname says port id 0), never
//! connected (which binds) and holds nothing. Queued messages are dropped, as CRIU does: they are
//! answers and notifications the kernel would send again or that a
//! listener must expect to lose (ENOBUFS). A socket in the middle of a
//! dump (the kernel holds the rest of the answer for it) is refused.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::netlink::{MAX_GROUP_WORDS, NetlinkFile, NetlinkOptions, protocol_name};

use nix::sys::socket::{NetlinkAddr, getsockname};

use super::{Blobs, FdParams, FileDumper, sockdiag};
use crate::error::{DumpError, Result};
use crate::{procfile, sys};

/// `socket:[INO]` of an AF_NETLINK socket.
pub struct Netlink;

// uapi/linux/netlink_diag.h, uapi/linux/netlink.h.
/// `netlink_diag_req`: family, protocol, pad, inode, show, cookie.
const REQ_LEN: usize = 20;
const NDIAG_PROTO_ALL: u8 = u8::MAX;
const NDIAG_SHOW_MEMINFO: u32 = 0x1;
const NDIAG_SHOW_GROUPS: u32 = 0x2;
const NDIAG_SHOW_FLAGS: u32 = 0x8;
/// `netlink_diag_msg`'s size and its fields' places.
const MSG_LEN: usize = 28;
const MSG_PROTOCOL: usize = 2;
const MSG_PORTID: usize = 4;
const MSG_DST_PORTID: usize = 8;
const MSG_DST_GROUP: usize = 12;
const MSG_INODE: usize = 16;
const NETLINK_DIAG_MEMINFO: u16 = 0;
const NETLINK_DIAG_GROUPS: u16 = 1;
const NETLINK_DIAG_FLAGS: u16 = 4;
const NDIAG_FLAG_CB_RUNNING: u32 = 0x1;
const SOL_NETLINK: i32 = 270;
const NETLINK_PKTINFO: i32 = 3;
const NETLINK_BROADCAST_ERROR: i32 = 4;
const NETLINK_NO_ENOBUFS: i32 = 5;
const NETLINK_LISTEN_ALL_NSID: i32 = 8;
const NETLINK_CAP_ACK: i32 = 10;
const NETLINK_EXT_ACK: i32 = 11;
const NETLINK_GET_STRICT_CHK: i32 = 12;

/// What sock_diag reports for one netlink socket (its flags are read with
/// getsockopt, which answers for an unlisted socket too).
#[derive(Debug, Default, PartialEq, Eq)]
struct NetlinkDiag {
    protocol: u32,
    portid: u32,
    dst_portid: u32,
    dst_group: u32,
    groups: Vec<u32>,
    flags: u32,
    /// Bytes of messages queued to be read (`SK_MEMINFO_RMEM_ALLOC`).
    queued: u32,
}

/// The netlink socket with inode `ino` in the calling thread's network
/// namespace, or `None`.
fn diag_of(ino: u64) -> std::io::Result<Option<NetlinkDiag>> {
    let mut req = [0u8; REQ_LEN];
    req[0] = libc::AF_NETLINK as u8;
    req[1] = NDIAG_PROTO_ALL;
    // The kernel does not filter a dump by inode: every socket comes.
    let show = NDIAG_SHOW_MEMINFO | NDIAG_SHOW_GROUPS | NDIAG_SHOW_FLAGS;
    req[8..12].copy_from_slice(&show.to_ne_bytes());
    req[12..20].copy_from_slice(&[0xff; 8]);
    for msg in sockdiag::dump(&req)? {
        if let Some(d) = parse(&msg, ino)? {
            return Ok(Some(d));
        }
    }
    Ok(None)
}

/// The socket of reply `msg` if its inode is `ino`.
fn parse(msg: &[u8], ino: u64) -> std::io::Result<Option<NetlinkDiag>> {
    if msg.len() < MSG_LEN {
        return Err(sockdiag::bad("short netlink_diag_msg"));
    }
    if u64::from(sockdiag::u32_at(msg, MSG_INODE)?) != ino {
        return Ok(None);
    }
    let mut d = NetlinkDiag {
        protocol: u32::from(msg[MSG_PROTOCOL]),
        portid: sockdiag::u32_at(msg, MSG_PORTID)?,
        dst_portid: sockdiag::u32_at(msg, MSG_DST_PORTID)?,
        dst_group: sockdiag::u32_at(msg, MSG_DST_GROUP)?,
        ..NetlinkDiag::default()
    };
    for (kind, data) in sockdiag::attributes(msg, MSG_LEN) {
        match kind {
            NETLINK_DIAG_GROUPS => {
                d.groups = data
                    .chunks_exact(4)
                    .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
                    .collect();
            }
            NETLINK_DIAG_FLAGS => d.flags = sockdiag::u32_at(data, 0)?,
            NETLINK_DIAG_MEMINFO => d.queued = sockdiag::u32_at(data, 0)?,
            _ => {}
        }
    }
    // Words past the last group joined say nothing.
    while d.groups.last() == Some(&0) {
        d.groups.pop();
    }
    Ok(Some(d))
}

impl FileDumper for Netlink {
    fn name(&self) -> &'static str {
        "netlink"
    }

    fn description(&self) -> &'static str {
        "netlink sockets (route, sock_diag, kobject_uevent, generic, ...): protocol, bound port id, multicast groups, connected destination, options (queued messages dropped)"
    }

    fn claims(&self, p: &FdParams) -> bool {
        p.socket_domain() == Some(libc::AF_NETLINK)
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        let os = |what: &str, e: std::io::Error| DumpError::Proc {
            pid: p.pid,
            path: format!("fd {}: {what}", p.fd).into(),
            source: e,
        };
        let copy = sys::take_fd(p.pid, p.fd).map_err(|e| os("pidfd_getfd", e))?;
        let sock = copy.as_fd();
        let protocol = sys::getsockopt_int(sock, libc::SOL_SOCKET, libc::SO_PROTOCOL)
            .map_err(|e| os("getsockopt SO_PROTOCOL", e))?;
        let diag = match diag_of(p.meta.ino())
            .map_err(|e| os("sock_diag (NETLINK_SOCK_DIAG, netlink)", e))?
        {
            Some(d) => d,
            None => {
                let name: NetlinkAddr =
                    getsockname(sock.as_raw_fd()).map_err(|e| os("getsockname", e.into()))?;
                if name.pid() != 0 {
                    return Err(os(
                        "sock_diag (NETLINK_SOCK_DIAG, netlink)",
                        std::io::Error::other("a bound socket missing from the dump"),
                    ));
                }
                NetlinkDiag {
                    protocol: protocol as u32,
                    ..NetlinkDiag::default()
                }
            }
        };
        let proto = protocol_name(diag.protocol);
        if diag.flags & NDIAG_FLAG_CB_RUNNING != 0 {
            return Err(p.unsupported(&format!(
                "dump in progress (the kernel holds the rest of its answer) on a {proto} netlink socket"
            )));
        }
        if diag.groups.len() > MAX_GROUP_WORDS {
            return Err(p.unsupported(&format!(
                "netlink {proto} socket in groups past {}",
                MAX_GROUP_WORDS * 32
            )));
        }
        if diag.queued > 0 {
            log::warn!(
                "pid {} fd {}: netlink {proto} socket: dropping {} bytes of queued messages (as CRIU does)",
                p.pid,
                p.fd,
                diag.queued
            );
        }
        let options = read_options(sock).map_err(|e| os("getsockopt", e))?;
        let sock_type = sys::getsockopt_int(sock, libc::SOL_SOCKET, libc::SO_TYPE)
            .map_err(|e| os("getsockopt SO_TYPE", e))?;
        Ok(Kind::Netlink(NetlinkFile {
            protocol: diag.protocol,
            sock_type: sock_type as u32,
            portid: diag.portid,
            groups: diag.groups,
            dst_portid: diag.dst_portid,
            dst_group: diag.dst_group,
            options: Some(options),
            may_admin: procfile::has_effective_cap(p.pid, caps::Capability::CAP_NET_ADMIN)?,
        }))
    }
}

fn read_options(sock: BorrowedFd<'_>) -> std::io::Result<NetlinkOptions> {
    let flag = |opt| sys::getsockopt_int(sock, SOL_NETLINK, opt).map(|v| v != 0);
    let uint = |opt| sys::getsockopt_int(sock, libc::SOL_SOCKET, opt).map(|v| v.max(0) as u32);
    Ok(NetlinkOptions {
        pktinfo: flag(NETLINK_PKTINFO)?,
        broadcast_error: flag(NETLINK_BROADCAST_ERROR)?,
        no_enobufs: flag(NETLINK_NO_ENOBUFS)?,
        listen_all_nsid: flag(NETLINK_LISTEN_ALL_NSID)?,
        cap_ack: flag(NETLINK_CAP_ACK)?,
        ext_ack: flag(NETLINK_EXT_ACK)?,
        get_strict_chk: flag(NETLINK_GET_STRICT_CHK)?,
        sndbuf: uint(libc::SO_SNDBUF)?,
        rcvbuf: uint(libc::SO_RCVBUF)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_gives_ids_groups_and_flags_and_other_inodes_none() {
        let mut m = vec![0u8; MSG_LEN];
        m[MSG_PROTOCOL] = 15;
        m[MSG_PORTID..MSG_PORTID + 4].copy_from_slice(&77u32.to_ne_bytes());
        m[MSG_INODE..MSG_INODE + 4].copy_from_slice(&9u32.to_ne_bytes());
        let attr = |m: &mut Vec<u8>, kind: u16, data: &[u8]| {
            m.extend_from_slice(&(4 + data.len() as u16).to_ne_bytes());
            m.extend_from_slice(&kind.to_ne_bytes());
            m.extend_from_slice(data);
        };
        attr(&mut m, NETLINK_DIAG_GROUPS, &[1, 0, 0, 0, 0, 0, 0, 0]);
        attr(
            &mut m,
            NETLINK_DIAG_FLAGS,
            &NDIAG_FLAG_CB_RUNNING.to_ne_bytes(),
        );
        let d = parse(&m, 9).unwrap().unwrap();
        assert_eq!(
            d,
            NetlinkDiag {
                protocol: 15,
                portid: 77,
                groups: vec![1],
                flags: NDIAG_FLAG_CB_RUNNING,
                ..NetlinkDiag::default()
            }
        );
        assert_eq!(parse(&m, 10).unwrap(), None);
    }
}
