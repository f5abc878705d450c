//! Socket options and the shutdown state, as dumped: what is set on a
//! restored socket before it is bound, and what is done after.

use std::os::fd::BorrowedFd;

use ckpt_image::fd::inet::{InetFamily, InetFile, InetOptions, InetProtocol, InetState};

use super::{Plan, force_buffer};
use crate::sys;

/// IPV6_HDRINCL (linux/in6.h) and the raw ICMP filter (linux/icmp.h).
const IPV6_HDRINCL: i32 = 36;
const SOL_RAW: i32 = 255;
const ICMP_FILTER: i32 = 1;
/// UDP-Lite checksum coverage options (`SOL_UDPLITE`, linux/udp.h).
const SOL_UDPLITE: i32 = 136;
const UDPLITE_SEND_CSCOV: i32 = 10;
const UDPLITE_RECV_CSCOV: i32 = 11;

/// Options that must be in place before bind (address reuse, v6only) and
/// the rest that getsockopt reported.
pub(super) fn set_options(
    sock: BorrowedFd<'_>,
    plan: &Plan,
    o: &InetOptions,
) -> std::io::Result<()> {
    let sol = libc::SOL_SOCKET;
    let set = |level, opt, v: bool| sys::setsockopt_int(sock, level, opt, i32::from(v));
    set(sol, libc::SO_REUSEADDR, o.reuseaddr)?;
    set(sol, libc::SO_REUSEPORT, o.reuseport)?;
    set(sol, libc::SO_BROADCAST, o.broadcast)?;
    set(sol, libc::SO_KEEPALIVE, o.keepalive)?;
    // getsockopt reports twice what was set; the FORCE variants take what
    // the dump saw even above the sysctl limits (it is what the socket
    // had, no more).
    for (opt, val) in [
        (libc::SO_SNDBUFFORCE, o.sndbuf),
        (libc::SO_RCVBUFFORCE, o.rcvbuf),
    ] {
        if val > 0 {
            force_buffer(sock, opt, val)?;
        }
    }
    if plan.family == InetFamily::Ipv6 {
        // A raw socket has its "port" (the protocol) from the start, and
        // the kernel takes IPV6_V6ONLY only before a port.
        if plan.protocol != InetProtocol::Raw {
            set(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, o.v6only)?;
        }
        if o.tos != 0 {
            sys::setsockopt_int(sock, libc::IPPROTO_IPV6, libc::IPV6_TCLASS, o.tos as i32)?;
        }
    } else if o.tos != 0 {
        sys::setsockopt_int(sock, libc::IPPROTO_IP, libc::IP_TOS, o.tos as i32)?;
    }
    if matches!(plan.protocol, InetProtocol::Udp | InetProtocol::Udplite) {
        set(libc::SOL_UDP, libc::UDP_CORK, o.udp_cork)?;
    }
    // IPPROTO_RAW has the header included, and the kernel refuses the
    // option on it.
    if plan.protocol == InetProtocol::Raw && plan.raw_protocol != libc::IPPROTO_RAW as u32 {
        if plan.family == InetFamily::Ipv6 {
            set(libc::IPPROTO_IPV6, IPV6_HDRINCL, o.hdrincl)?;
        } else {
            set(libc::IPPROTO_IP, libc::IP_HDRINCL, o.hdrincl)?;
        }
    }
    if plan.protocol == InetProtocol::Raw && o.icmp_filter != 0 {
        sys::setsockopt_int(sock, SOL_RAW, ICMP_FILTER, o.icmp_filter as i32)?;
    }
    if plan.protocol == InetProtocol::Udplite {
        for (opt, val) in [
            (UDPLITE_SEND_CSCOV, o.udplite_send_cscov),
            (UDPLITE_RECV_CSCOV, o.udplite_recv_cscov),
        ] {
            sys::setsockopt_int(
                sock,
                SOL_UDPLITE,
                opt,
                i32::try_from(val).unwrap_or(i32::MAX),
            )?;
        }
    }
    if plan.protocol == InetProtocol::Tcp {
        let tcp = libc::IPPROTO_TCP;
        set(tcp, libc::TCP_NODELAY, o.nodelay)?;
        for (opt, val) in [
            (libc::TCP_KEEPIDLE, o.keepidle),
            (libc::TCP_KEEPINTVL, o.keepintvl),
            (libc::TCP_KEEPCNT, o.keepcnt),
        ] {
            if val > 0 {
                sys::setsockopt_int(sock, tcp, opt, i32::try_from(val).unwrap_or(i32::MAX))?;
            }
        }
    }
    Ok(())
}

/// Shuts a UDP socket down as it was at dump time. The kernel records a
/// shutdown of an unconnected socket and answers ENOTCONN, as it did when
/// the process asked.
pub(super) fn shut_down(
    sock: BorrowedFd<'_>,
    image: &InetFile,
    state: InetState,
) -> std::io::Result<()> {
    use nix::sys::socket::Shutdown;
    let how = match (image.shut_rd, image.shut_wr) {
        (false, false) => return Ok(()),
        (true, false) => Shutdown::Read,
        (false, true) => Shutdown::Write,
        (true, true) => Shutdown::Both,
    };
    match nix::sys::socket::shutdown(std::os::fd::AsRawFd::as_raw_fd(&sock), how) {
        Err(nix::errno::Errno::ENOTCONN) if state != InetState::Connected => Ok(()),
        other => other.map_err(std::io::Error::from),
    }
}
