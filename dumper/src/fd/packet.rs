//! Packet (AF_PACKET) sockets: type, protocol, bound interface, options.
//!
//! getsockname gives the protocol and interface (`sockaddr_ll`),
//! getsockopt the options. What getsockopt does not tell, sock_diag does
//! (`PACKET_DIAG`, matched by inode): a socket with a ring mapped into the
//! process (PACKET_RX_RING, PACKET_TX_RING), in a fanout group or with
//! memberships (PACKET_ADD_MEMBERSHIP) is refused by name, as the state
//! behind those is not saved. Queued packets are dropped, like UDP
//! datagrams.

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::MetadataExt;

use super::{Blobs, FdParams, FileDumper, sockdiag};
use crate::error::{DumpError, Result};
use crate::{procfile, sys};
use ckpt_image::fd::file::Kind;
use ckpt_image::fd::packet::{PacketFile, PacketOptions};

/// `socket:[INO]` of an AF_PACKET socket.
pub struct Packet;

// uapi/linux/packet_diag.h, uapi/linux/if_packet.h.
/// `packet_diag_req`: family, protocol, pad, inode, show, cookie.
const REQ_LEN: usize = 20;
const PACKET_SHOW_MCLIST: u32 = 0x2;
const PACKET_SHOW_RING_CFG: u32 = 0x4;
const PACKET_SHOW_FANOUT: u32 = 0x8;
/// `packet_diag_msg`'s size and where its inode is.
const MSG_LEN: usize = 16;
const MSG_INODE: usize = 4;
const PACKET_DIAG_MCLIST: u16 = 1;
const PACKET_DIAG_RX_RING: u16 = 2;
const PACKET_DIAG_TX_RING: u16 = 3;
const PACKET_DIAG_FANOUT: u16 = 4;
const PACKET_AUXDATA: i32 = 8;
const PACKET_ORIGDEV: i32 = 9;
const PACKET_VERSION: i32 = 10;
const PACKET_RESERVE: i32 = 12;
const PACKET_LOSS: i32 = 14;
const PACKET_TIMESTAMP: i32 = 17;
const PACKET_QDISC_BYPASS: i32 = 20;
const PACKET_IGNORE_OUTGOING: i32 = 23;

/// What of a packet socket ckpt does not save, named for the refusal;
/// `None` when there is none (or the socket is not in the dump).
fn unsaved_state(ino: u64) -> std::io::Result<Option<&'static str>> {
    let mut req = [0u8; REQ_LEN];
    req[0] = libc::AF_PACKET as u8;
    let show = PACKET_SHOW_MCLIST | PACKET_SHOW_RING_CFG | PACKET_SHOW_FANOUT;
    req[8..12].copy_from_slice(&show.to_ne_bytes());
    req[12..20].copy_from_slice(&[0xff; 8]);
    for msg in sockdiag::dump(&req)? {
        if msg.len() < MSG_LEN {
            return Err(sockdiag::bad("short packet_diag_msg"));
        }
        if u64::from(sockdiag::u32_at(&msg, MSG_INODE)?) != ino {
            continue;
        }
        return Ok(
            sockdiag::attributes(&msg, MSG_LEN).find_map(|(kind, data)| match kind {
                PACKET_DIAG_RX_RING | PACKET_DIAG_TX_RING => {
                    Some("packet socket with a ring (PACKET_RX_RING or PACKET_TX_RING)")
                }
                PACKET_DIAG_FANOUT => Some("packet socket in a fanout group (PACKET_FANOUT)"),
                PACKET_DIAG_MCLIST if !data.is_empty() => {
                    Some("packet socket with memberships (PACKET_ADD_MEMBERSHIP)")
                }
                _ => None,
            }),
        );
    }
    Ok(None)
}

impl FileDumper for Packet {
    fn name(&self) -> &'static str {
        "packet"
    }

    fn description(&self) -> &'static str {
        "packet sockets (AF_PACKET, raw and datagram): protocol, bound interface, options such as PACKET_AUXDATA (queued packets dropped)"
    }

    fn claims(&self, p: &FdParams) -> bool {
        p.socket_domain() == Some(libc::AF_PACKET)
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        let os = |what: &str, e: std::io::Error| DumpError::Proc {
            pid: p.pid,
            path: format!("fd {}: {what}", p.fd).into(),
            source: e,
        };
        let copy = sys::take_fd(p.pid, p.fd).map_err(|e| os("pidfd_getfd", e))?;
        let sock = copy.as_fd();
        if let Some(what) = unsaved_state(p.meta.ino())
            .map_err(|e| os("sock_diag (NETLINK_SOCK_DIAG, packet)", e))?
        {
            return Err(p.unsupported(what));
        }
        let name = sys::packet_name(sock).map_err(|e| os("getsockname", e))?;
        let sock_type = sys::getsockopt_int(sock, libc::SOL_SOCKET, libc::SO_TYPE)
            .map_err(|e| os("getsockopt SO_TYPE", e))?;
        let options = read_options(sock).map_err(|e| os("getsockopt", e))?;
        let queued = sys::ioctl_int(sock, libc::FIONREAD).map_err(|e| os("SIOCINQ", e))?;
        if queued > 0 {
            log::warn!(
                "pid {} fd {}: packet socket: dropping the queued packets (the first one has {queued} bytes)",
                p.pid,
                p.fd
            );
        }
        Ok(Kind::Packet(PacketFile {
            sock_type: sock_type as u32,
            protocol: u32::from(name.protocol),
            ifindex: name.ifindex,
            options: Some(options),
            may_net_raw: procfile::has_effective_cap(p.pid, caps::Capability::CAP_NET_RAW)?,
        }))
    }
}

fn read_options(sock: BorrowedFd<'_>) -> std::io::Result<PacketOptions> {
    let int = |opt| sys::getsockopt_int(sock, libc::SOL_PACKET, opt);
    let uint = |level, opt| sys::getsockopt_int(sock, level, opt).map(|v| v.max(0) as u32);
    Ok(PacketOptions {
        auxdata: int(PACKET_AUXDATA)? != 0,
        origdev: int(PACKET_ORIGDEV)? != 0,
        version: uint(libc::SOL_PACKET, PACKET_VERSION)?,
        reserve: uint(libc::SOL_PACKET, PACKET_RESERVE)?,
        loss: int(PACKET_LOSS)? != 0,
        timestamp: uint(libc::SOL_PACKET, PACKET_TIMESTAMP)?,
        qdisc_bypass: int(PACKET_QDISC_BYPASS)? != 0,
        ignore_outgoing: int(PACKET_IGNORE_OUTGOING)? != 0,
        sndbuf: uint(libc::SOL_SOCKET, libc::SO_SNDBUF)?,
        rcvbuf: uint(libc::SOL_SOCKET, libc::SO_RCVBUF)?,
    })
}
