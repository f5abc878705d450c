//! One `sock_diag` netlink dump (`NETLINK_SOCK_DIAG`,
//! `SOCK_DIAG_BY_FAMILY`) and the walk over its replies' attributes: what
//! the kernel tells of a socket that getsockopt does not (an inet
//! socket's shutdown state). It answers for the asking thread's network
//! namespace; the tree's files are collected in the tree's (`ns.rs`).

use std::os::fd::AsRawFd;

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto, socket,
};

// uapi/linux/sock_diag.h, uapi/linux/netlink.h.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;
const NLA_HDRLEN: usize = 4;
/// Room for one batch of replies.
const RECV_BUF: usize = 64 << 10;

/// Sends `request` (the family's request structure, after the netlink
/// header) as a dump and returns every socket's reply message (without
/// its netlink header), in the kernel's order.
pub fn dump(request: &[u8]) -> std::io::Result<Vec<Vec<u8>>> {
    let sock = socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )?;
    let mut req = Vec::with_capacity(NLMSG_HDRLEN + request.len());
    req.extend_from_slice(&((NLMSG_HDRLEN + request.len()) as u32).to_ne_bytes());
    req.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    req.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    req.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
    req.extend_from_slice(request);
    sendto(
        sock.as_raw_fd(),
        &req,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; RECV_BUF];
    loop {
        let n = recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty())?;
        if n == 0 {
            return Err(bad("netlink reply ended early"));
        }
        if parse_batch(&buf[..n], &mut out)? {
            return Ok(out);
        }
    }
}

/// The attributes after the first `fixed` bytes of reply `msg`: each
/// attribute's type and payload. A malformed one ends the walk.
pub fn attributes(msg: &[u8], fixed: usize) -> impl Iterator<Item = (u16, &[u8])> {
    let mut rest = msg.get(fixed..).unwrap_or_default();
    std::iter::from_fn(move || {
        let len = usize::from(u16_at(rest, 0).ok()?);
        let kind = u16_at(rest, 2).ok()?;
        if len < NLA_HDRLEN || len > rest.len() {
            return None;
        }
        let data = &rest[NLA_HDRLEN..len];
        rest = &rest[align4(len).min(rest.len())..];
        // The top bits flag nested and byte-order attributes.
        Some((kind & 0x3fff, data))
    })
}

/// A malformed reply.
pub fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("sock_diag: {what}"),
    )
}

/// The native-endian u16 at `at` of `b`.
pub fn u16_at(b: &[u8], at: usize) -> std::io::Result<u16> {
    b.get(at..at + 2)
        .map(|s| u16::from_ne_bytes([s[0], s[1]]))
        .ok_or_else(|| bad("short message"))
}

/// The native-endian u32 at `at` of `b`.
pub fn u32_at(b: &[u8], at: usize) -> std::io::Result<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]))
        .ok_or_else(|| bad("short message"))
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Moves one datagram's replies into `out`; true at the end of the dump.
fn parse_batch(mut b: &[u8], out: &mut Vec<Vec<u8>>) -> std::io::Result<bool> {
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
            SOCK_DIAG_BY_FAMILY => out.push(b[NLMSG_HDRLEN..len].to_vec()),
            _ => {}
        }
        b = &b[align4(len).min(b.len())..];
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_are_walked_and_a_truncated_one_ends_the_walk() {
        let mut m = vec![0u8; 4];
        // Type 8, one byte, padded to four.
        m.extend_from_slice(&5u16.to_ne_bytes());
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&[3, 0, 0, 0]);
        // Type 2 claiming more than there is.
        m.extend_from_slice(&40u16.to_ne_bytes());
        m.extend_from_slice(&2u16.to_ne_bytes());
        let got: Vec<(u16, Vec<u8>)> = attributes(&m, 4).map(|(k, d)| (k, d.to_vec())).collect();
        assert_eq!(got, vec![(8, vec![3])]);
    }
}
