//! What a socket's options and, for UDP, its shutdown and cork state
//! are: the image's table of options read through getsockopt, the few a
//! datagram or raw socket has outside it, sock_diag for what getsockopt
//! does not tell.

use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::inet::options::{
    self, ICMP_FILTER, IPV6_HDRINCL, SOL_RAW, SOL_UDPLITE, UDPLITE_RECV_CSCOV, UDPLITE_SEND_CSCOV,
};
use ckpt_image::fd::inet::{InetFamily, InetOptions, InetProtocol, SockFilterInsn};

use super::super::FdParams;
use super::{Identity, SIOCOUTQ, diag, flag, uint};
use crate::error::{DumpError, Result};
use crate::sys;

/// How many times, `CORK_SETTLE` apart, bytes still charged to a UDP
/// socket's send buffer are looked at before they count as pending: a
/// datagram just handed to a device is freed within that.
const CORK_TRIES: u32 = 20;
const CORK_SETTLE: std::time::Duration = std::time::Duration::from_millis(5);

/// The socket's options: those of the table ([`options::NUMERIC`],
/// [`options::NAMED`]) that apply to it, buffer sizes, SO_LINGER and the
/// classic BPF filter. An option this kernel does not know (ENOPROTOOPT)
/// stays at its default.
pub(super) fn read_options(sock: BorrowedFd<'_>, id: &Identity) -> std::io::Result<InetOptions> {
    let known = |r: std::io::Result<()>| match r {
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => Ok(()),
        other => other,
    };
    let sol = libc::SOL_SOCKET;
    let mut o = InetOptions {
        sndbuf: uint(sock, sol, libc::SO_SNDBUF)?,
        rcvbuf: uint(sock, sol, libc::SO_RCVBUF)?,
        ..InetOptions::default()
    };
    for n in options::NUMERIC
        .iter()
        .filter(|n| n.applies.to(id.family, id.protocol))
    {
        known(sys::getsockopt_int(sock, n.level, n.opt).map(|v| n.set(&mut o, v)))?;
    }
    for n in options::NAMED
        .iter()
        .filter(|n| n.applies.to(id.family, id.protocol))
    {
        known(
            sys::getsockopt_raw::<[u8; options::NAME_MAX]>(sock, n.level, n.opt).map(
                |(name, len)| {
                    let name = &name[..len.min(name.len())];
                    let name = name.split(|b| *b == 0).next().unwrap_or_default();
                    (n.set)(&mut o, String::from_utf8_lossy(name).into_owned());
                },
            ),
        )?;
    }
    match id.protocol {
        InetProtocol::Udp => o.udp_cork = flag(sock, libc::SOL_UDP, libc::UDP_CORK)?,
        InetProtocol::Raw if id.family == InetFamily::Ipv6 => {
            o.hdrincl = flag(sock, libc::IPPROTO_IPV6, IPV6_HDRINCL)?;
        }
        InetProtocol::Raw => {
            o.hdrincl = flag(sock, libc::IPPROTO_IP, libc::IP_HDRINCL)?;
            if uint(sock, libc::SOL_SOCKET, libc::SO_PROTOCOL)? == libc::IPPROTO_ICMP as u32 {
                // A mask: every bit counts, the sign one too.
                o.icmp_filter = sys::getsockopt_int(sock, SOL_RAW, ICMP_FILTER)? as u32;
            }
        }
        InetProtocol::Udplite => {
            o.udp_cork = flag(sock, libc::SOL_UDP, libc::UDP_CORK)?;
            o.udplite_send_cscov = uint(sock, SOL_UDPLITE, UDPLITE_SEND_CSCOV)?;
            o.udplite_recv_cscov = uint(sock, SOL_UDPLITE, UDPLITE_RECV_CSCOV)?;
        }
        _ => {}
    }
    let (linger, _) = sys::getsockopt_raw::<sys::Linger>(sock, sol, libc::SO_LINGER)?;
    o.linger_on = linger.onoff != 0;
    o.linger_secs = linger.secs.max(0) as u32;
    o.filter = sys::socket_filter(sock)?
        .into_iter()
        .map(|i| SockFilterInsn {
            code: u32::from(i.code),
            jt: u32::from(i.jt),
            jf: u32::from(i.jf),
            k: i.k,
        })
        .collect();
    Ok(o)
}

/// Whether a UDP or UDP-Lite socket is shut down for reading and for
/// writing, as sock_diag tells (the collection runs in the tree's network
/// namespace).
pub(super) fn udp_shutdown(p: &FdParams, id: &Identity) -> Result<(bool, bool)> {
    let what = "sock_diag (NETLINK_SOCK_DIAG, inet)";
    let os = |e| DumpError::Proc {
        pid: p.pid,
        path: format!("fd {}: {what}", p.fd).into(),
        source: e,
    };
    let domain = match id.family {
        InetFamily::Ipv6 => libc::AF_INET6,
        _ => libc::AF_INET,
    };
    let transport = match id.protocol {
        InetProtocol::Udplite => libc::IPPROTO_UDPLITE,
        _ => libc::IPPROTO_UDP,
    };
    let bits = diag::shutdown_of(domain, transport, p.meta.ino())
        .map_err(os)?
        .ok_or_else(|| os(std::io::Error::other("no socket of that inode")))?;
    Ok((
        bits & diag::RCV_SHUTDOWN != 0,
        bits & diag::SEND_SHUTDOWN != 0,
    ))
}

/// Refuses a UDP socket holding back data of a datagram not sent yet
/// (UDP_CORK, or a send with MSG_MORE): the pending bytes are charged to
/// its send buffer until the datagram leaves, and a restore could not put
/// them back as part of one datagram. Bytes of datagrams already on their
/// way are let go first (the tree is frozen: nothing adds to them).
pub(super) fn refuse_pending_cork(
    p: &FdParams,
    sock: BorrowedFd<'_>,
    local: &Option<SocketAddr>,
) -> Result<()> {
    let mut tries = 0;
    loop {
        let charged = sys::ioctl_int(sock, SIOCOUTQ).map_err(|e| DumpError::Proc {
            pid: p.pid,
            path: format!("fd {}: SIOCOUTQ", p.fd).into(),
            source: e,
        })?;
        if charged <= 0 {
            return Ok(());
        }
        tries += 1;
        if tries == CORK_TRIES {
            return Err(p.unsupported(&format!(
                "corked UDP socket {} with {charged} bytes pending (UDP_CORK or MSG_MORE)",
                local.map_or("-".to_string(), |a| a.to_string())
            )));
        }
        std::thread::sleep(CORK_SETTLE);
    }
}
