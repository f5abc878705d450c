//! TIME_WAIT sockets in the way of a listener coming back.
//!
//! A listener's port can be held, between dump and restore, by the
//! TIME_WAIT remains of connections that used it meanwhile (a job that
//! exited normally leaves them for a minute). They refuse the bind of a
//! socket without SO_REUSEADDR (and a listener's `listen` even with it,
//! unless the remains had it too), yet the restored process owned that
//! port when it was dumped. So before giving up, ckpt removes the
//! TIME_WAIT sockets of exactly that local address and port with the
//! kernel's `SOCK_DESTROY` (`ss -K`): they hold no data, only the
//! two-minute guard against late segments of a connection that is over.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto, socket,
};

// uapi/linux/sock_diag.h, inet_diag.h, netlink.h, net/tcp_states.h.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_HDRLEN: usize = 16;
const TCP_TIME_WAIT: u32 = 6;
/// `struct inet_diag_sockid`: ports, addresses, interface, cookie.
const SOCKID_LEN: usize = 48;
/// `struct inet_diag_req_v2`: family, protocol, ext, pad, states, sockid.
const REQ_LEN: usize = 8 + SOCKID_LEN;
/// Where the sockid starts in `struct inet_diag_msg`.
const MSG_SOCKID_AT: usize = 4;
/// Room for one batch of replies.
const RECV_BUF: usize = 64 << 10;

/// Removes the TIME_WAIT sockets whose local end is `local` (any address
/// when `local`'s is unspecified; IPv4 ones too for a dual-stack IPv6
/// socket). Returns how many went.
pub fn clear(local: SocketAddr, dual_stack: bool) -> std::io::Result<usize> {
    let mut families = vec![family_of(local.ip())];
    if dual_stack && local.ip().is_unspecified() {
        families.push(libc::AF_INET as u8);
    }
    let mut cleared = 0;
    for family in families {
        for sockid in time_wait(family)? {
            if matches(&sockid, family, local) {
                destroy(family, &sockid)?;
                cleared += 1;
            }
        }
    }
    Ok(cleared)
}

fn family_of(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => libc::AF_INET as u8,
        IpAddr::V6(_) => libc::AF_INET6 as u8,
    }
}

/// A sockid's local port and address against `local`.
fn matches(sockid: &[u8; SOCKID_LEN], family: u8, local: SocketAddr) -> bool {
    let port = u16::from_be_bytes([sockid[0], sockid[1]]);
    if port != local.port() {
        return false;
    }
    if local.ip().is_unspecified() {
        return true;
    }
    let src = &sockid[4..20];
    match local.ip() {
        IpAddr::V4(a) => family == libc::AF_INET as u8 && src[..4] == a.octets(),
        IpAddr::V6(a) => family == libc::AF_INET6 as u8 && src[..16] == a.octets(),
    }
}

fn netlink() -> std::io::Result<std::os::fd::OwnedFd> {
    Ok(socket(
        AddressFamily::Netlink,
        SockType::Datagram,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkSockDiag,
    )?)
}

fn request(kind: u16, flags: u16, family: u8, sockid: &[u8; SOCKID_LEN]) -> Vec<u8> {
    let mut req = Vec::with_capacity(NLMSG_HDRLEN + REQ_LEN);
    req.extend_from_slice(&((NLMSG_HDRLEN + REQ_LEN) as u32).to_ne_bytes());
    req.extend_from_slice(&kind.to_ne_bytes());
    req.extend_from_slice(&flags.to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    req.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
    req.push(family);
    req.push(libc::IPPROTO_TCP as u8);
    req.push(0); // no extensions
    req.push(0); // pad
    req.extend_from_slice(&(1u32 << TCP_TIME_WAIT).to_ne_bytes());
    req.extend_from_slice(sockid);
    req
}

fn send(sock: &std::os::fd::OwnedFd, req: &[u8]) -> std::io::Result<()> {
    sendto(
        sock.as_raw_fd(),
        req,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )?;
    Ok(())
}

fn bad(what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("sock_diag: {what}"),
    )
}

/// The sockids of every TCP socket of `family` in TIME_WAIT.
fn time_wait(family: u8) -> std::io::Result<Vec<[u8; SOCKID_LEN]>> {
    let sock = netlink()?;
    let mut any = [0u8; SOCKID_LEN];
    any[40..48].fill(0xff); // no cookie
    send(
        &sock,
        &request(
            SOCK_DIAG_BY_FAMILY,
            NLM_F_REQUEST | NLM_F_DUMP,
            family,
            &any,
        ),
    )?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; RECV_BUF];
    loop {
        let n = recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty())?;
        let mut b = &buf[..n];
        if b.is_empty() {
            return Err(bad("netlink reply ended early"));
        }
        while b.len() >= NLMSG_HDRLEN {
            let len = u32::from_ne_bytes(b[0..4].try_into().expect("4 bytes")) as usize;
            if len < NLMSG_HDRLEN || len > b.len() {
                return Err(bad("bad message length"));
            }
            match u16::from_ne_bytes([b[4], b[5]]) {
                NLMSG_DONE => return Ok(out),
                NLMSG_ERROR => return Err(errno_of(&b[NLMSG_HDRLEN..len])),
                SOCK_DIAG_BY_FAMILY => {
                    let msg = &b[NLMSG_HDRLEN..len];
                    let id = msg
                        .get(MSG_SOCKID_AT..MSG_SOCKID_AT + SOCKID_LEN)
                        .ok_or_else(|| bad("short message"))?;
                    out.push(id.try_into().expect("SOCKID_LEN bytes"));
                }
                _ => {}
            }
            b = &b[((len + 3) & !3).min(b.len())..];
        }
    }
}

fn errno_of(payload: &[u8]) -> std::io::Error {
    match payload.get(0..4) {
        Some(e) => {
            std::io::Error::from_raw_os_error(-i32::from_ne_bytes(e.try_into().expect("4 bytes")))
        }
        None => bad("short error message"),
    }
}

/// `SOCK_DESTROY` of one socket, waiting for the kernel's answer.
fn destroy(family: u8, sockid: &[u8; SOCKID_LEN]) -> std::io::Result<()> {
    let sock = netlink()?;
    send(
        &sock,
        &request(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, family, sockid),
    )?;
    let mut buf = vec![0u8; 4096];
    let n = recv(sock.as_raw_fd(), &mut buf, MsgFlags::empty())?;
    let b = &buf[..n];
    if b.len() < NLMSG_HDRLEN + 4 || u16::from_ne_bytes([b[4], b[5]]) != NLMSG_ERROR {
        return Err(bad("no answer to SOCK_DESTROY"));
    }
    match i32::from_ne_bytes(
        b[NLMSG_HDRLEN..NLMSG_HDRLEN + 4]
            .try_into()
            .expect("4 bytes"),
    ) {
        0 => Ok(()),
        // Gone by itself meanwhile.
        e if -e == libc::ENOENT => Ok(()),
        e => Err(std::io::Error::from_raw_os_error(-e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockids_match_by_port_and_address() {
        let mut id = [0u8; SOCKID_LEN];
        id[0..2].copy_from_slice(&1024u16.to_be_bytes());
        id[4..8].copy_from_slice(&[192, 0, 2, 2]);
        let v4 = libc::AF_INET as u8;
        assert!(matches(&id, v4, "0.0.0.0:1024".parse().unwrap()));
        assert!(matches(&id, v4, "192.0.2.2:1024".parse().unwrap()));
        assert!(!matches(&id, v4, "192.0.2.3:1024".parse().unwrap()));
        assert!(!matches(&id, v4, "0.0.0.0:1025".parse().unwrap()));
        assert!(!matches(
            &id,
            libc::AF_INET6 as u8,
            "[::1]:1024".parse().unwrap()
        ));
    }
}
