//! Socket options put back, from the image's one table of them
//! (`ckpt_image::fd::inet::options`), those of datagram and raw sockets
//! outside it, and the shutdown state of a UDP socket.

use std::os::fd::BorrowedFd;

use ckpt_image::fd::inet::options::{
    self, ICMP_FILTER, IPV6_HDRINCL, SOL_RAW, SOL_UDPLITE, UDPLITE_RECV_CSCOV, UDPLITE_SEND_CSCOV,
    When,
};
use ckpt_image::fd::inet::{InetFamily, InetFile, InetOptions, InetProtocol, InetState};

use super::Plan;
use crate::sys;

/// `SO_BUF_LOCK`, as in the table.
const SO_BUF_LOCK: i32 = 72;

/// Sets one option; a kernel that does not know it (ENOPROTOOPT) is let
/// off when the value is the default (0), which is all a dump on such a
/// kernel records.
fn set_int(sock: BorrowedFd<'_>, level: i32, opt: i32, value: i32) -> std::io::Result<()> {
    match sys::setsockopt_int(sock, level, opt, value) {
        Err(e) if value == 0 && e.raw_os_error() == Some(libc::ENOPROTOOPT) => Ok(()),
        other => other,
    }
}

/// Sets the options of `o` that apply to a socket of `family` and
/// `protocol`, before it is bound: the table's, the buffer sizes (the
/// FORCE variants take what the dump saw even above the sysctl limits:
/// what the socket had, no more; getsockopt reports twice what was set),
/// SO_LINGER and the socket filter. Returns the first failure with the
/// option's name.
pub(super) fn set(
    sock: BorrowedFd<'_>,
    family: InetFamily,
    protocol: InetProtocol,
    o: &InetOptions,
) -> std::result::Result<(), (&'static str, std::io::Error)> {
    let applies = |a: options::Applies| a.to(family, protocol);
    // A raw socket has its "port" (the protocol) from the start, and the
    // kernel takes IPV6_V6ONLY only before a port.
    let takes = move |opt: i32| !(protocol == InetProtocol::Raw && opt == libc::IPV6_V6ONLY);
    let numeric = |when: When| {
        options::NUMERIC
            .iter()
            .filter(move |n| n.when == when && applies(n.applies) && takes(n.opt))
    };
    for n in numeric(When::Always) {
        set_int(sock, n.level, n.opt, n.get(o)).map_err(|e| (n.name, e))?;
    }
    for n in numeric(When::NonZero) {
        let v = n.get(o);
        if v != 0 {
            set_int(sock, n.level, n.opt, v).map_err(|e| (n.name, e))?;
        }
    }
    for n in options::NAMED.iter().filter(|n| applies(n.applies)) {
        let name = (n.get)(o);
        if !name.is_empty() {
            sys::setsockopt_raw(sock, n.level, n.opt, name.as_bytes()).map_err(|e| (n.name, e))?;
        }
    }
    for (name, opt, val) in [
        ("SO_SNDBUFFORCE", libc::SO_SNDBUFFORCE, o.sndbuf),
        ("SO_RCVBUFFORCE", libc::SO_RCVBUFFORCE, o.rcvbuf),
    ] {
        if val > 0 {
            super::force_buffer(sock, opt, val).map_err(|e| (name, e))?;
        }
    }
    for n in numeric(When::AfterBuffers) {
        set_int(sock, n.level, n.opt, n.get(o)).map_err(|e| (n.name, e))?;
    }
    let linger = sys::Linger {
        onoff: i32::from(o.linger_on),
        secs: i32::try_from(o.linger_secs).unwrap_or(i32::MAX),
    };
    sys::setsockopt_raw(sock, libc::SOL_SOCKET, libc::SO_LINGER, &[linger])
        .map_err(|e| ("SO_LINGER", e))?;
    if !o.filter.is_empty() {
        let prog = o
            .filter
            .iter()
            .map(|i| {
                Some(sys::SockFilter {
                    code: u16::try_from(i.code).ok()?,
                    jt: u8::try_from(i.jt).ok()?,
                    jf: u8::try_from(i.jf).ok()?,
                    k: i.k,
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                (
                    "SO_ATTACH_FILTER",
                    std::io::Error::other("an instruction's field out of bounds"),
                )
            })?;
        sys::attach_filter(sock, &prog).map_err(|e| ("SO_ATTACH_FILTER", e))?;
    }
    Ok(())
}

/// Puts SO_BUF_LOCK back after the buffer sizes were forced again (which
/// locks them): a socket whose sizes the kernel tuned goes on being tuned.
pub(super) fn lock_buffers(sock: BorrowedFd<'_>, buf_lock: u32) -> std::io::Result<()> {
    set_int(
        sock,
        libc::SOL_SOCKET,
        SO_BUF_LOCK,
        i32::try_from(buf_lock).unwrap_or(0),
    )
}

/// The options of datagram and raw sockets the table does not hold:
/// UDP_CORK, IP_HDRINCL, ICMP_FILTER and UDP-Lite's checksum coverage.
pub(super) fn set_datagram(
    sock: BorrowedFd<'_>,
    plan: &Plan,
    o: &InetOptions,
) -> std::io::Result<()> {
    let set = |level, opt, v: bool| sys::setsockopt_int(sock, level, opt, i32::from(v));
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
