//! Netlink sockets, created inside the process (so they are its own, as
//! its `socket(2)` made them) and set up through the restorer's copy:
//! options, the bound port id, the multicast groups, the destination.
//!
//! The restorer holds CAP_NET_ADMIN, which most protocols ask of whoever
//! joins their groups or sends to a group; a process that did not have it
//! at dump time (`NetlinkFile.may_admin`) only gets back the groups any
//! process may join, and anything else is refused in one line.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use ckpt_image::fd::File;
use ckpt_image::fd::netlink::{MAX_GROUP_WORDS, NetlinkFile, NetlinkOptions, protocol_name};
use ckpt_parasite::remote::Remote;
use nix::sys::socket::NetlinkAddr;

use super::{Context, FileRestorer, set_status_flags};
use crate::error::{RestoreError, Result};
use crate::sys;

/// Netlink sockets.
pub struct Netlink;

// uapi/linux/netlink.h, uapi/linux/rtnetlink.h.
const SOL_NETLINK: i32 = 270;
const NETLINK_ADD_MEMBERSHIP: i32 = 1;
const NETLINK_PKTINFO: i32 = 3;
const NETLINK_BROADCAST_ERROR: i32 = 4;
const NETLINK_NO_ENOBUFS: i32 = 5;
const NETLINK_LISTEN_ALL_NSID: i32 = 8;
const NETLINK_CAP_ACK: i32 = 10;
const NETLINK_EXT_ACK: i32 = 11;
const NETLINK_GET_STRICT_CHK: i32 = 12;
const NETLINK_ROUTE: u32 = 0;
const NETLINK_USERSOCK: u32 = 2;
const NETLINK_SELINUX: u32 = 7;
const NETLINK_KOBJECT_UEVENT: u32 = 15;
/// Route groups only CAP_NET_ADMIN may join (multicast routing reports).
const RTNLGRP_IPV4_MROUTE_R: u32 = 30;
const RTNLGRP_IPV6_MROUTE_R: u32 = 31;

/// Whether any process may join group `group` of `protocol` (the
/// kernel's `NL_CFG_F_NONROOT_RECV` protocols, less the groups their own
/// checks keep for CAP_NET_ADMIN). Generic netlink and audit check each
/// group against the caller, which at restore is the restorer: not here.
fn open_to_all(protocol: u32, group: u32) -> bool {
    match protocol {
        NETLINK_ROUTE => !matches!(group, RTNLGRP_IPV4_MROUTE_R | RTNLGRP_IPV6_MROUTE_R),
        NETLINK_USERSOCK | NETLINK_SELINUX | NETLINK_KOBJECT_UEVENT => true,
        _ => false,
    }
}

/// Refuses what the restorer's CAP_NET_ADMIN would give a process that
/// did not have it.
fn check_privilege(pid: i32, fd: i32, image: &NetlinkFile) -> Result<()> {
    if image.may_admin {
        return Ok(());
    }
    let proto = protocol_name(image.protocol);
    let refuse = |what: String| RestoreError::File {
        pid,
        path: format!("fd {fd}"),
        what: format!(
            "netlink {proto} socket {what}, which needs CAP_NET_ADMIN the process did not have at dump time"
        ),
    };
    let closed: Vec<String> = image
        .group_numbers()
        .into_iter()
        .filter(|g| !open_to_all(image.protocol, *g))
        .map(|g| g.to_string())
        .collect();
    if !closed.is_empty() {
        return Err(refuse(format!("in multicast groups {}", closed.join(","))));
    }
    if image.dst_group != 0 && image.protocol != NETLINK_USERSOCK {
        return Err(refuse(format!("sending to group {}", image.dst_group)));
    }
    if image.options.is_some_and(|o| o.listen_all_nsid) {
        return Err(refuse("listening to all namespaces".into()));
    }
    Ok(())
}

impl FileRestorer for Netlink {
    type Image = NetlinkFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &NetlinkFile,
        fd: i32,
    ) -> Result<i32> {
        let pid = cx.pid();
        if image.groups.len() > MAX_GROUP_WORDS {
            return Err(cx.invalid(fd, "netlink socket: too many groups"));
        }
        let ty = match image.sock_type as i32 {
            t @ (libc::SOCK_RAW | libc::SOCK_DGRAM) => t,
            _ => return Err(cx.invalid(fd, "netlink socket: type neither raw nor datagram")),
        };
        check_privilege(pid, fd, image)?;
        let got = r.call(
            "socket (netlink)",
            libc::SYS_socket,
            [
                libc::AF_NETLINK as u64,
                (ty | libc::SOCK_CLOEXEC) as u64,
                u64::from(image.protocol),
                0,
                0,
                0,
            ],
        )? as i32;
        let copy = sys::take_fd(pid, got)
            .map_err(|e| RestoreError::os(pid, format!("fd {fd}: pidfd_getfd"), e))?;
        let sock = copy.as_fd();
        let os = |what: String| move |e| RestoreError::os(pid, format!("fd {fd}: {what}"), e);
        set_options(sock, &image.options.unwrap_or_default()).map_err(os("setsockopt".into()))?;
        if image.portid != 0 {
            nix::sys::socket::bind(sock.as_raw_fd(), &NetlinkAddr::new(image.portid, 0))
                .map_err(std::io::Error::from)
                .map_err(os(format!("bind port id {}", image.portid)))?;
        }
        for group in image.group_numbers() {
            sys::setsockopt_int(sock, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, group as i32)
                .map_err(os(format!("join group {group}")))?;
        }
        if image.dst_portid != 0 || image.dst_group != 0 {
            // connect(2) takes the group as a mask and keeps its lowest bit.
            let mask = match image.dst_group {
                0 => 0,
                g @ 1..=32 => 1u32 << (g - 1),
                _ => return Err(cx.invalid(fd, "netlink socket: destination group past 32")),
            };
            nix::sys::socket::connect(sock.as_raw_fd(), &NetlinkAddr::new(image.dst_portid, mask))
                .map_err(std::io::Error::from)
                .map_err(os(format!(
                    "connect to port id {} group {}",
                    image.dst_portid, image.dst_group
                )))?;
        }
        set_status_flags(r, got, file.flags)?;
        Ok(got)
    }
}

fn set_options(sock: BorrowedFd<'_>, o: &NetlinkOptions) -> std::io::Result<()> {
    for (opt, on) in [
        (NETLINK_PKTINFO, o.pktinfo),
        (NETLINK_BROADCAST_ERROR, o.broadcast_error),
        (NETLINK_NO_ENOBUFS, o.no_enobufs),
        (NETLINK_LISTEN_ALL_NSID, o.listen_all_nsid),
        (NETLINK_CAP_ACK, o.cap_ack),
        (NETLINK_EXT_ACK, o.ext_ack),
        (NETLINK_GET_STRICT_CHK, o.get_strict_chk),
    ] {
        if on {
            sys::setsockopt_int(sock, SOL_NETLINK, opt, 1)?;
        }
    }
    // getsockopt reported twice what was set; the FORCE variants take
    // what the socket had even above the sysctl limits.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_open_to_all_are_given_back_and_others_refused() {
        let route = NetlinkFile {
            protocol: NETLINK_ROUTE,
            groups: vec![1 << 4],
            ..Default::default()
        };
        assert!(check_privilege(1, 3, &route).is_ok());
        let mroute = NetlinkFile {
            groups: vec![1 << (RTNLGRP_IPV4_MROUTE_R - 1)],
            ..route.clone()
        };
        let e = check_privilege(1, 3, &mroute).unwrap_err().to_string();
        assert!(
            e.contains("groups 30") && e.contains("CAP_NET_ADMIN"),
            "{e}"
        );
        let diag = NetlinkFile {
            protocol: 4,
            groups: vec![1],
            may_admin: true,
            ..Default::default()
        };
        assert!(check_privilege(1, 3, &diag).is_ok());
        let diag_user = NetlinkFile {
            may_admin: false,
            ..diag
        };
        assert!(check_privilege(1, 3, &diag_user).is_err());
    }
}
