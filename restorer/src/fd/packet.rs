//! Packet (AF_PACKET) sockets, created inside the process and set up
//! through the restorer's copy: options, then the bound interface and
//! protocol.
//!
//! A restore for a user (the service's) makes one again only if the
//! process had CAP_NET_RAW at dump time: the restorer's own capabilities
//! must not stand in for the process's.

use std::os::fd::AsFd;

use ckpt_image::fd::File;
use ckpt_image::fd::packet::{PacketFile, PacketOptions};
use ckpt_parasite::remote::Remote;

use super::{Context, FileRestorer, set_status_flags};
use crate::error::{RestoreError, Result};
use crate::sys;

/// Packet sockets.
pub struct Packet;

// uapi/linux/if_packet.h.
const PACKET_AUXDATA: i32 = 8;
const PACKET_ORIGDEV: i32 = 9;
const PACKET_VERSION: i32 = 10;
const PACKET_RESERVE: i32 = 12;
const PACKET_LOSS: i32 = 14;
const PACKET_TIMESTAMP: i32 = 17;
const PACKET_QDISC_BYPASS: i32 = 20;
const PACKET_IGNORE_OUTGOING: i32 = 23;

impl FileRestorer for Packet {
    type Image = PacketFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &PacketFile,
        fd: i32,
    ) -> Result<i32> {
        let pid = cx.pid();
        let ty = match image.sock_type as i32 {
            t @ (libc::SOCK_RAW | libc::SOCK_DGRAM) => t,
            _ => return Err(cx.invalid(fd, "packet socket: type neither raw nor datagram")),
        };
        let protocol = u16::try_from(image.protocol)
            .map_err(|_| cx.invalid(fd, "packet socket: protocol past 16 bits"))?;
        if !image.may_net_raw && ckpt_image::caller::acting_for().is_some() {
            return Err(RestoreError::File {
                pid,
                path: format!("fd {fd}"),
                what:
                    "packet socket: needs CAP_NET_RAW, which the process did not have at dump time"
                        .into(),
            });
        }
        let got = r.call(
            "socket (packet)",
            libc::SYS_socket,
            [
                libc::AF_PACKET as u64,
                (ty | libc::SOCK_CLOEXEC) as u64,
                u64::from(protocol.to_be()),
                0,
                0,
                0,
            ],
        )? as i32;
        let copy = sys::take_fd(pid, got)
            .map_err(|e| RestoreError::os(pid, format!("fd {fd}: pidfd_getfd"), e))?;
        let sock = copy.as_fd();
        set_options(sock, &image.options.unwrap_or_default())
            .map_err(|e| RestoreError::os(pid, format!("fd {fd}: setsockopt"), e))?;
        if image.ifindex != 0 {
            sys::bind_packet(sock, protocol, image.ifindex).map_err(|e| {
                RestoreError::os(
                    pid,
                    format!(
                        "fd {fd}: bind packet socket to interface {} protocol {protocol:#06x}",
                        image.ifindex
                    ),
                    e,
                )
            })?;
        }
        set_status_flags(r, got, file.flags)?;
        Ok(got)
    }
}

fn set_options(sock: std::os::fd::BorrowedFd<'_>, o: &PacketOptions) -> std::io::Result<()> {
    let set = |opt, v: u32| {
        sys::setsockopt_int(
            sock,
            libc::SOL_PACKET,
            opt,
            i32::try_from(v).unwrap_or(i32::MAX),
        )
    };
    for (opt, v) in [
        (PACKET_AUXDATA, u32::from(o.auxdata)),
        (PACKET_ORIGDEV, u32::from(o.origdev)),
        (PACKET_LOSS, u32::from(o.loss)),
        (PACKET_QDISC_BYPASS, u32::from(o.qdisc_bypass)),
        (PACKET_IGNORE_OUTGOING, u32::from(o.ignore_outgoing)),
        (PACKET_VERSION, o.version),
        (PACKET_RESERVE, o.reserve),
        (PACKET_TIMESTAMP, o.timestamp),
    ] {
        // The defaults are all 0 (TPACKET_V1 included): set what differs.
        if v != 0 {
            set(opt, v)?;
        }
    }
    for (opt, val) in [
        (libc::SO_SNDBUFFORCE, o.sndbuf),
        (libc::SO_RCVBUFFORCE, o.rcvbuf),
    ] {
        if val > 0 {
            let half = i32::try_from(val / 2).unwrap_or(i32::MAX);
            sys::setsockopt_int(sock, libc::SOL_SOCKET, opt, half)?;
        }
    }
    Ok(())
}
