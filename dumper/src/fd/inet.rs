//! TCP, UDP, UDP-Lite and ICMP ping sockets over IPv4 and IPv6.
//!
//! A socket is recognised by its `/proc/PID/fd/N` link (`socket:[INO]`);
//! ckpt takes its own copy with `pidfd_getfd` (the same open file
//! description, so the same socket) and asks it with getsockopt:
//! SO_DOMAIN/SO_TYPE/SO_PROTOCOL, getsockname/getpeername for the
//! addresses and TCP_INFO for the state, the listen backlog and the
//! negotiated options. (sock_diag would tell the same per socket; this
//! way needs no netlink dump and no matching of inodes.)
//!
//! Established TCP connections are saved through TCP_REPAIR: [`TcpRepair`]
//! switches repair mode on while the tree is frozen, once the collection's
//! parasites are gone, with the tree held ([`TcpRepair::hold`]), so the
//! queues can be read without consuming them, and off again when
//! the tree is thawed; when the tree is killed the sockets are closed in
//! repair mode, which sends nothing to the peer. Segments still pass
//! between two ends in repair mode, so every send queue is read before
//! any receive queue (`read_receive_sides`).
//!
//! A connection to a peer outside the tree (`--tcp-established`) has no
//! socket behind it from the kill to the restore; the kernel would answer
//! the peer's segments with a reset. Unless told otherwise
//! (`--network-lock=none`), [`TcpRepair`] first puts a network lock
//! (`ckpt_netlock`) in place that drops them; the peer retransmits, and
//! the restore deletes the lock once the connection is back. A tree that
//! goes on after the dump (or whose dumper died) gets it deleted at once.
//!
//! Connections closing from one or both ends (FIN_WAIT1, FIN_WAIT2,
//! CLOSE_WAIT, LAST_ACK, CLOSING) are saved like established ones, with
//! which FINs were out. A connection a listener of the tree has not
//! accepted yet is saved through its client (`pending`), a connect under
//! way through its addresses (`connecting`); the options come from the
//! image's one table of them (`read_options`).
//!
//! UDP datagrams queued at dump time are not saved (as in CRIU: UDP may
//! lose datagrams, and putting them back would need their senders'
//! addresses): the dump logs how many bytes it drops. A UDP socket's
//! shutdown state comes from sock_diag ([`diag`]). Data a corked socket
//! (UDP_CORK, or a send with MSG_MORE) holds back is not a datagram yet
//! and could not be put back as it was: such a socket is refused by name;
//! a corked one with nothing pending is saved with the option.
//!
//! A ping socket (ICMP / ICMPv6, SOCK_DGRAM) is saved like a UDP socket
//! whose port is its echo identifier; where it is connected is read from
//! the kernel's table of ping sockets ([`peers`]). A raw socket is saved
//! the same way, with its IP protocol, IP_HDRINCL and ICMP_FILTER, and
//! whether the process had CAP_NET_RAW (a restore for a user makes one
//! again only then).

mod diag;
mod peers;

mod connecting;
mod datagram;
mod pending;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::inet::{
    InetAddr, InetFamily, InetFile, InetProtocol, InetState, PmixLink, TcpConnection, tcp_data_name,
};

use super::{Blobs, FdParams, FileDumper, TreeFiles};
use crate::error::{DumpError, Result};
use crate::options::NetworkLock;
use crate::sys::{self, SockEnd, TcpInfo, TcpRepairWindow};
use crate::{procfile, srun_pmix};
use datagram::{read_options, refuse_pending_cork, udp_shutdown};

/// `socket:[INO]` of an IPv4 or IPv6 socket.
pub struct Inet;

/// Kernel TCP states (include/net/tcp_states.h), as TCP_INFO reports them.
mod tcp_state {
    pub const ESTABLISHED: u8 = 1;
    pub const SYN_SENT: u8 = 2;
    pub const FIN_WAIT1: u8 = 4;
    pub const FIN_WAIT2: u8 = 5;
    pub const CLOSE: u8 = 7;
    pub const CLOSE_WAIT: u8 = 8;
    pub const LAST_ACK: u8 = 9;
    pub const LISTEN: u8 = 10;
    pub const CLOSING: u8 = 11;

    /// The states of a connection saved in repair mode: established, or
    /// closing with at least one FIN not yet through both ends.
    pub fn repairable(s: u8) -> bool {
        matches!(
            s,
            ESTABLISHED | FIN_WAIT1 | FIN_WAIT2 | CLOSE_WAIT | LAST_ACK | CLOSING
        )
    }

    /// This end has shut down writing: its FIN is sent or queued.
    pub fn fin_sent(s: u8) -> bool {
        matches!(s, FIN_WAIT1 | FIN_WAIT2 | LAST_ACK | CLOSING)
    }

    /// This end's FIN counts in its send queue: it is not acknowledged
    /// yet (maybe not even sent, behind queued bytes).
    pub fn fin_unacked(s: u8) -> bool {
        matches!(s, FIN_WAIT1 | LAST_ACK | CLOSING)
    }

    /// The peer's FIN has arrived.
    pub fn fin_received(s: u8) -> bool {
        matches!(s, CLOSE_WAIT | LAST_ACK | CLOSING)
    }

    /// The state's name, for refusals.
    pub fn name(s: u8) -> &'static str {
        match s {
            1 => "ESTABLISHED",
            2 => "SYN_SENT",
            3 => "SYN_RECV",
            4 => "FIN_WAIT1",
            5 => "FIN_WAIT2",
            6 => "TIME_WAIT",
            7 => "CLOSE",
            8 => "CLOSE_WAIT",
            9 => "LAST_ACK",
            10 => "LISTEN",
            11 => "CLOSING",
            _ => "unknown",
        }
    }
}

/// `TCP_REPAIR` values.
const TCP_REPAIR_ON: i32 = 1;
/// Repair off without the window probe the plain `TCP_REPAIR_OFF` sends:
/// the connection just goes on.
const TCP_REPAIR_OFF_NO_WP: i32 = sys::TCP_REPAIR_OFF_NO_WP;
/// `TCP_REPAIR_QUEUE` values.
const TCP_NO_QUEUE: i32 = 0;
const TCP_RECV_QUEUE: i32 = 1;
const TCP_SEND_QUEUE: i32 = 2;
/// `TCPI_OPT_*` bits of `tcp_info.options`.
const TCPI_OPT_TIMESTAMPS: u8 = 1;
const TCPI_OPT_SACK: u8 = 2;
const TCPI_OPT_WSCALE: u8 = 4;
/// `SIOCINQ` / `SIOCOUTQ` (FIONREAD / TIOCOUTQ for sockets).
pub(super) const SIOCINQ: libc::c_ulong = libc::FIONREAD;
pub(super) const SIOCOUTQ: libc::c_ulong = libc::TIOCOUTQ;

/// What getsockopt says a socket is.
pub(super) struct Identity {
    family: InetFamily,
    protocol: InetProtocol,
}

/// The family and transport of the socket behind `sock`; `Ok(None)` for a
/// socket of another family, `Err` with a refusal for an inet socket ckpt
/// cannot save (raw, SCTP, ...).
fn identify(
    sock: BorrowedFd<'_>,
) -> std::io::Result<Option<std::result::Result<Identity, String>>> {
    let domain = sys::getsockopt_int(sock, libc::SOL_SOCKET, libc::SO_DOMAIN)?;
    let family = match domain {
        libc::AF_INET => InetFamily::Ipv4,
        libc::AF_INET6 => InetFamily::Ipv6,
        _ => return Ok(None),
    };
    let ty = sys::getsockopt_int(sock, libc::SOL_SOCKET, libc::SO_TYPE)?;
    let proto = sys::getsockopt_int(sock, libc::SOL_SOCKET, libc::SO_PROTOCOL)?;
    let fam = family_name(family);
    Ok(Some(match (ty, proto) {
        (libc::SOCK_STREAM, libc::IPPROTO_TCP) => Ok(Identity {
            family,
            protocol: InetProtocol::Tcp,
        }),
        (libc::SOCK_DGRAM, libc::IPPROTO_UDP) => Ok(Identity {
            family,
            protocol: InetProtocol::Udp,
        }),
        (libc::SOCK_DGRAM, libc::IPPROTO_UDPLITE) => Ok(Identity {
            family,
            protocol: InetProtocol::Udplite,
        }),
        (libc::SOCK_DGRAM, libc::IPPROTO_ICMP) if family == InetFamily::Ipv4 => Ok(Identity {
            family,
            protocol: InetProtocol::Ping,
        }),
        (libc::SOCK_DGRAM, libc::IPPROTO_ICMPV6) if family == InetFamily::Ipv6 => Ok(Identity {
            family,
            protocol: InetProtocol::Ping,
        }),
        (libc::SOCK_RAW, _) => Ok(Identity {
            family,
            protocol: InetProtocol::Raw,
        }),
        (_, p) => Err(format!("{fam} socket of type {ty}, protocol {p}")),
    }))
}

fn family_name(f: InetFamily) -> &'static str {
    match f {
        InetFamily::Ipv6 => "IPv6",
        _ => "IPv4",
    }
}

fn tcp_info(sock: BorrowedFd<'_>) -> std::io::Result<TcpInfo> {
    sys::getsockopt_raw::<TcpInfo>(sock, libc::IPPROTO_TCP, libc::TCP_INFO).map(|(v, _)| v)
}

pub(super) fn flag(sock: BorrowedFd<'_>, level: i32, opt: i32) -> std::io::Result<bool> {
    sys::getsockopt_int(sock, level, opt).map(|v| v != 0)
}

pub(super) fn uint(sock: BorrowedFd<'_>, level: i32, opt: i32) -> std::io::Result<u32> {
    sys::getsockopt_int(sock, level, opt).map(|v| v.max(0) as u32)
}

impl FileDumper for Inet {
    fn name(&self) -> &'static str {
        "inet"
    }

    fn description(&self) -> &'static str {
        "TCP, UDP, UDP-Lite and ICMP ping sockets (IPv4, IPv6): bound, connected, listening, established, half-closed (FIN_WAIT1, FIN_WAIT2, CLOSE_WAIT) and closing (LAST_ACK, CLOSING) TCP with its queues (TCP_REPAIR), connections not accepted yet whose client is in the tree, connects under way (SYN_SENT), peers outside the tree held off by a network lock; UDP shut down (SHUT_RD, SHUT_WR) or corked with nothing pending, UDP-Lite checksum coverage, a ping socket's echo identifier; raw sockets with their protocol, IP_HDRINCL and ICMP_FILTER"
    }

    fn claims(&self, p: &FdParams) -> bool {
        if p.meta.mode() & libc::S_IFMT != libc::S_IFSOCK {
            return false;
        }
        // A socket ckpt cannot even copy is left to the generic refusal.
        sys::take_fd(p.pid, p.fd)
            .and_then(|s| identify(s.as_fd()))
            .is_ok_and(|id| id.is_some())
    }

    fn collect(&self, p: &FdParams, file_id: u64, blobs: &mut Blobs) -> Result<Kind> {
        let os = |what: &str, e: std::io::Error| DumpError::Proc {
            pid: p.pid,
            path: format!("fd {}: {what}", p.fd).into(),
            source: e,
        };
        let copy = sys::take_fd(p.pid, p.fd).map_err(|e| os("pidfd_getfd", e))?;
        let sock = copy.as_fd();
        let id = match identify(sock).map_err(|e| os("getsockopt", e))? {
            Some(Ok(id)) => id,
            Some(Err(what)) => return Err(p.unsupported(&what)),
            None => return Err(p.unsupported("socket of a family other than IPv4/IPv6")),
        };
        let local = sys::sock_addr(sock, SockEnd::Local).map_err(|e| os("getsockname", e))?;
        let peer = sys::sock_addr(sock, SockEnd::Peer).map_err(|e| os("getpeername", e))?;
        let options = read_options(sock, &id).map_err(|e| os("getsockopt", e))?;
        let mut image = InetFile {
            family: id.family as i32,
            protocol: id.protocol as i32,
            state: InetState::Closed as i32,
            local: local
                .filter(|a| a.port() != 0)
                .as_ref()
                .map(InetAddr::from_socket_addr),
            peer: peer.as_ref().map(InetAddr::from_socket_addr),
            options: Some(options),
            backlog: 0,
            tcp: None,
            may_bind_privileged: procfile::has_effective_cap(
                p.pid,
                caps::Capability::CAP_NET_BIND_SERVICE,
            )?,
            pmix: None,
            pending: 0,
            shut_rd: false,
            shut_wr: false,
            raw_protocol: 0,
            may_net_raw: false,
        };
        let name = |a: &Option<SocketAddr>| a.map_or("-".to_string(), |a| a.to_string());
        match id.protocol {
            InetProtocol::Ping | InetProtocol::Raw => {
                let table = match (id.protocol, id.family) {
                    (InetProtocol::Ping, InetFamily::Ipv6) => "icmp6",
                    (InetProtocol::Ping, _) => "icmp",
                    (_, InetFamily::Ipv6) => "raw6",
                    _ => "raw",
                };
                if id.protocol == InetProtocol::Raw {
                    image.raw_protocol = uint(sock, libc::SOL_SOCKET, libc::SO_PROTOCOL)
                        .map_err(|e| os("getsockopt SO_PROTOCOL", e))?;
                    image.may_net_raw =
                        procfile::has_effective_cap(p.pid, caps::Capability::CAP_NET_RAW)?;
                    // Its "port" is the protocol; an address unspecified
                    // is no bind.
                    image.local = local
                        .filter(|a| !a.ip().is_unspecified())
                        .as_ref()
                        .map(InetAddr::from_socket_addr);
                }
                if let Some(to) = peers::peer(p.pid, table, p.meta.ino())? {
                    image.peer = Some(InetAddr::from_socket_addr(&to));
                    image.state = InetState::Connected as i32;
                }
            }
            InetProtocol::Udp | InetProtocol::Udplite => {
                if peer.is_some() {
                    image.state = InetState::Connected as i32;
                }
                refuse_pending_cork(p, sock, &local)?;
                let (shut_rd, shut_wr) = udp_shutdown(p, &id)?;
                image.shut_rd = shut_rd;
                image.shut_wr = shut_wr;
            }
            _ => {}
        }
        // UDP's and raw sockets' (ping sockets answer no SIOCINQ).
        if matches!(
            id.protocol,
            InetProtocol::Udp | InetProtocol::Udplite | InetProtocol::Raw
        ) {
            let queued = sys::ioctl_int(sock, SIOCINQ).map_err(|e| os("SIOCINQ", e))?;
            if queued > 0 {
                log::warn!(
                    "pid {} fd {}: datagram socket {}: dropping the queued datagrams (the first one has {queued} bytes); datagrams may be lost",
                    p.pid,
                    p.fd,
                    name(&local)
                );
            }
        }
        if id.protocol == InetProtocol::Tcp {
            let info = tcp_info(sock).map_err(|e| os("TCP_INFO", e))?;
            match info.state {
                tcp_state::CLOSE => {}
                tcp_state::SYN_SENT => {
                    let Some(to) = connecting::peer(p.pid, p.meta.ino(), id.family)? else {
                        return Err(p.unsupported(&format!(
                            "TCP socket {} in state SYN_SENT missing from the network namespace's table",
                            name(&local)
                        )));
                    };
                    image.state = InetState::Connecting as i32;
                    image.peer = Some(InetAddr::from_socket_addr(&to));
                }
                tcp_state::LISTEN => {
                    // Each connection not accepted yet must have its
                    // client in the tree (`pending::link`).
                    image.state = InetState::Listen as i32;
                    image.backlog = info.sacked;
                    image.pending = info.unacked;
                }
                state
                    if state != tcp_state::ESTABLISHED
                        && tcp_state::repairable(state)
                        && !in_repair(sock) =>
                {
                    return Err(p.unsupported(&format!(
                        "TCP connection {} -> {} in state {} to a peer outside the tree (dump with --tcp-established to save it)",
                        name(&local),
                        name(&peer),
                        tcp_state::name(state)
                    )));
                }
                tcp_state::ESTABLISHED if !in_repair(sock) && peer.is_some() => {
                    // Not saved by the drain: only a rank's link to its
                    // PMIx server outside the tree gets this far
                    // (`srun_pmix`), the rest is refused as before.
                    let Some(link) = pmix_link(p, sock, peer.expect("checked"))? else {
                        return Err(p.unsupported(&format!(
                            "TCP connection {} -> {} to a peer outside the tree (dump with --tcp-established to save it)",
                            name(&local),
                            name(&peer)
                        )));
                    };
                    image.state = InetState::Connected as i32;
                    image.pmix = Some(link);
                }
                state if tcp_state::repairable(state) => {
                    // The receive side is read by `link_tree`, after
                    // every send queue of the tree (`read_receive_side`).
                    // A FIN not acknowledged yet is still in the send
                    // queue.
                    let fin_queued = tcp_state::fin_unacked(state);
                    let (mut conn, data) =
                        read_send_side(p, sock, &info, &local, &peer, fin_queued)?;
                    // The FINs take a sequence number each but are no
                    // data: the image counts none (`TcpConnection`).
                    if tcp_state::fin_sent(state) {
                        conn.fin_sent = true;
                        conn.send_seq = conn.send_seq.wrapping_sub(1);
                    }
                    conn.fin_received = tcp_state::fin_received(state);
                    conn.fin_first = state == tcp_state::CLOSING;
                    blobs.add(tcp_data_name(file_id), data);
                    image.state = InetState::Connected as i32;
                    image.tcp = Some(conn);
                }
                other => {
                    return Err(p.unsupported(&format!(
                        "TCP socket {} -> {} in state {} (only listening, connecting (SYN_SENT), established, FIN_WAIT1, FIN_WAIT2, CLOSE_WAIT, LAST_ACK and CLOSING connections are supported)",
                        name(&local),
                        name(&peer),
                        tcp_state::name(other)
                    )));
                }
            }
        }
        Ok(Kind::Inet(image))
    }

    fn link_tree(&self, tree: &mut TreeFiles) -> Result<()> {
        read_receive_sides(tree)?;
        // An established connection's other end is the tree's connection
        // with the same two addresses swapped.
        let ends: HashMap<(String, String), u64> = tree
            .files
            .files
            .iter()
            .filter_map(|f| match &f.kind {
                Some(Kind::Inet(i)) if i.tcp.is_some() => Some((
                    (i.local.as_ref()?.to_string(), i.peer.as_ref()?.to_string()),
                    f.id,
                )),
                _ => None,
            })
            .collect();
        for f in &mut tree.files.files {
            if let Some(Kind::Inet(i)) = &mut f.kind
                && let (Some(l), Some(r)) = (&i.local, &i.peer)
                && let Some(tcp) = &mut i.tcp
            {
                tcp.peer_file_id = ends
                    .get(&(r.to_string(), l.to_string()))
                    .copied()
                    .unwrap_or(0);
            }
        }
        pending::link(tree)
    }
}

/// Reads the send side of an established connection in repair mode
/// (switched on by [`TcpRepair::start`]): sequence numbers, the send queue
/// (peeked, not consumed), timestamp and negotiated options. Returns the
/// record and the send queue's bytes; [`read_receive_sides`] completes
/// both.
fn read_send_side(
    p: &FdParams,
    sock: BorrowedFd<'_>,
    info: &TcpInfo,
    local: &Option<SocketAddr>,
    peer: &Option<SocketAddr>,
    fin_queued: bool,
) -> Result<(TcpConnection, Vec<u8>)> {
    let os = |what: &str, e: std::io::Error| DumpError::Proc {
        pid: p.pid,
        path: format!("fd {}: {what}", p.fd).into(),
        source: e,
    };
    let tcp = libc::IPPROTO_TCP;
    let name = |a: &Option<SocketAddr>| a.map_or("-".to_string(), |a| a.to_string());
    // Only a socket in repair mode lets its queue be chosen; the drain put
    // every connection in repair mode except those to a peer outside the
    // tree without --tcp-established.
    match sys::setsockopt_int(sock, tcp, libc::TCP_REPAIR_QUEUE, TCP_SEND_QUEUE) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
            return Err(p.unsupported(&format!(
                "TCP connection {} -> {} to a peer outside the tree (dump with --tcp-established to save it)",
                name(local),
                name(peer)
            )));
        }
        Err(e) => return Err(os("TCP_REPAIR_QUEUE", e)),
    }
    let send_seq = sys::getsockopt_int(sock, tcp, libc::TCP_QUEUE_SEQ)
        .map_err(|e| os("TCP_QUEUE_SEQ (send)", e))? as u32;
    let len = |req, what| {
        sys::ioctl_int(sock, req)
            .map(|v| v.max(0) as u32)
            .map_err(|e| os(what, e))
    };
    // The send queue only shrinks while the tree is frozen: the peer's
    // acknowledgments are still processed, and each drops acknowledged
    // bytes from its head (its end, TCP_QUEUE_SEQ, holds still). So it is
    // peeked whole and taken once its length held still across the peek.
    let mut tries = 0;
    let (send_len, unsent_len, data) = loop {
        let before = len(SIOCOUTQ, "SIOCOUTQ")?;
        let data = sys::recv_peek(sock, before as usize).map_err(|e| os("peek send queue", e))?;
        // A FIN queued counts in both lengths (it is last: unsent if
        // anything is) but peeks as no byte.
        let fin = u32::from(fin_queued);
        let after = len(SIOCOUTQ, "SIOCOUTQ")?.saturating_sub(fin);
        let unsent = len(libc::SIOCOUTQNSD, "SIOCOUTQNSD")?.saturating_sub(fin);
        if data.len() == after as usize {
            break (after, unsent.min(after), data);
        }
        tries += 1;
        if tries == SEND_QUEUE_TRIES {
            return Err(os(
                "peek send queue",
                std::io::Error::other(format!(
                    "its length kept changing ({} bytes peeked, {after} queued)",
                    data.len()
                )),
            ));
        }
    };
    sys::setsockopt_int(sock, tcp, libc::TCP_REPAIR_QUEUE, TCP_NO_QUEUE)
        .map_err(|e| os("TCP_REPAIR_QUEUE", e))?;
    let conn = TcpConnection {
        send_seq,
        send_len,
        unsent_len,
        mss: uint(sock, tcp, libc::TCP_MAXSEG).map_err(|e| os("TCP_MAXSEG", e))?,
        wscale_ok: info.options & TCPI_OPT_WSCALE != 0,
        snd_wscale: u32::from(info.wscale & 0xf),
        rcv_wscale: u32::from(info.wscale >> 4),
        sack_ok: info.options & TCPI_OPT_SACK != 0,
        timestamps_ok: info.options & TCPI_OPT_TIMESTAMPS != 0,
        timestamp: sys::getsockopt_int(sock, tcp, libc::TCP_TIMESTAMP)
            .map_err(|e| os("TCP_TIMESTAMP", e))? as u32,
        ..TcpConnection::default()
    };
    log::debug!(
        "pid {} fd {}: TCP {} -> {}: {send_len} bytes to send ({unsent_len} unsent)",
        p.pid,
        p.fd,
        name(local),
        name(peer)
    );
    Ok((conn, data))
}

/// Completes every established connection of the tree with its receive
/// side (window, receive sequence, the receive queue peeked), once all
/// send sides are read. The kernel still carries segments and
/// acknowledgments between two frozen ends while the dump reads them; in
/// this order no end can be read short of bytes its peer, read earlier,
/// had already given up as acknowledged (they would be in neither queue
/// and the restored connection would stall). A receiver read with bytes
/// its sender still counted as queued is fine: the restore drops them
/// from the sender.
fn read_receive_sides(tree: &mut TreeFiles) -> Result<()> {
    let holders: HashMap<u64, (i32, i32)> =
        tree.holders().map(|h| (h.file_id, (h.pid, h.fd))).collect();
    for f in &mut tree.files.files {
        let Some(Kind::Inet(InetFile {
            tcp: Some(conn), ..
        })) = &mut f.kind
        else {
            continue;
        };
        let &(pid, fd) = holders
            .get(&f.id)
            .expect("every collected file has a holder");
        let os = |what: &str, e: std::io::Error| DumpError::Proc {
            pid,
            path: format!("fd {fd}: {what}").into(),
            source: e,
        };
        let copy = sys::take_fd(pid, fd).map_err(|e| os("pidfd_getfd", e))?;
        let sock = copy.as_fd();
        let tcp = libc::IPPROTO_TCP;
        // The window first: rcv_nxt only grows, so a segment still in
        // flight can only move the receive sequence read below past the
        // window read here, never the other way round, and the kernel
        // accepts the pair on restore.
        let (window, _) =
            sys::getsockopt_raw::<TcpRepairWindow>(sock, tcp, libc::TCP_REPAIR_WINDOW)
                .map_err(|e| os("TCP_REPAIR_WINDOW", e))?;
        sys::setsockopt_int(sock, tcp, libc::TCP_REPAIR_QUEUE, TCP_RECV_QUEUE)
            .map_err(|e| os("TCP_REPAIR_QUEUE", e))?;
        conn.recv_seq = sys::getsockopt_int(sock, tcp, libc::TCP_QUEUE_SEQ)
            .map_err(|e| os("TCP_QUEUE_SEQ (receive)", e))? as u32;
        if conn.fin_received {
            // rcv_nxt counts the peer's FIN; the window too, when it was
            // last advertised after it (its right edge stays put).
            conn.recv_seq = conn.recv_seq.wrapping_sub(1);
        }
        conn.recv_len = sys::ioctl_int(sock, SIOCINQ)
            .map(|v| v.max(0) as u32)
            .map_err(|e| os("SIOCINQ", e))?;
        let data =
            peek_all(sock, conn.recv_len as usize).map_err(|e| os("peek receive queue", e))?;
        sys::setsockopt_int(sock, tcp, libc::TCP_REPAIR_QUEUE, TCP_NO_QUEUE)
            .map_err(|e| os("TCP_REPAIR_QUEUE", e))?;
        conn.snd_wl1 = window.snd_wl1;
        conn.snd_wnd = window.snd_wnd;
        conn.max_window = window.max_window;
        conn.rcv_wnd = window.rcv_wnd;
        conn.rcv_wup = window.rcv_wup;
        if conn.fin_received && seq_after(conn.rcv_wup, conn.recv_seq) {
            conn.rcv_wup = conn.rcv_wup.wrapping_sub(1);
            conn.rcv_wnd = conn.rcv_wnd.wrapping_add(1);
        }
        let name = tcp_data_name(f.id);
        tree.blobs.append(&name, &data);
        if conn.send_len == 0 && conn.recv_len == 0 {
            tree.blobs.remove(&name);
        }
        log::debug!("pid {pid} fd {fd}: TCP: {} bytes received", conn.recv_len);
    }
    Ok(())
}

/// Whether sequence number `a` comes after `b` (modulo 2^32).
fn seq_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// Peeks of a send queue that acknowledgments keep shortening before one
/// holds still: each acknowledgment can only shorten it, so a few suffice.
const SEND_QUEUE_TRIES: u32 = 16;

/// Exactly `len` bytes of the queue chosen with TCP_REPAIR_QUEUE.
fn peek_all(sock: BorrowedFd<'_>, len: usize) -> std::io::Result<Vec<u8>> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let got = sys::recv_peek(sock, len)?;
    if got.len() != len {
        return Err(std::io::Error::other(format!(
            "peeked {} of {len} queued bytes",
            got.len()
        )));
    }
    Ok(got)
}

/// Whether `sock` is in TCP repair mode (the drain put it there).
fn in_repair(sock: BorrowedFd<'_>) -> bool {
    sys::getsockopt_int(sock, libc::IPPROTO_TCP, libc::TCP_REPAIR).is_ok_and(|v| v != 0)
}

/// The rank's link to its Slurm PMIx server, if the connection `sock` to
/// `peer` is one; refused while a request or an answer is in flight on it
/// (the new server would never see the one nor send the other).
fn pmix_link(p: &FdParams, sock: BorrowedFd<'_>, peer: SocketAddr) -> Result<Option<PmixLink>> {
    let status = procfile::read(p.pid, "status")?;
    let effective = |key: &str| {
        procfile::status_field(&status, key)
            .and_then(|v| v.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok())
            .ok_or_else(|| DumpError::Parse {
                pid: p.pid,
                path: format!("/proc/{}/status", p.pid),
                what: format!("no effective id in {key}"),
            })
    };
    let (uid, gid) = (effective("Uid")?, effective("Gid")?);
    let Some(link) = srun_pmix::link_to(p.pid, peer, uid, gid) else {
        return Ok(None);
    };
    let os = |what: &str, e: std::io::Error| DumpError::Proc {
        pid: p.pid,
        path: format!("fd {}: {what}", p.fd).into(),
        source: e,
    };
    let unsent = sys::ioctl_int(sock, SIOCOUTQ).map_err(|e| os("SIOCOUTQ", e))?;
    let unread = sys::ioctl_int(sock, SIOCINQ).map_err(|e| os("SIOCINQ", e))?;
    if unsent > 0 || unread > 0 {
        return Err(p.unsupported(&format!(
            "the PMIx connection of rank {} of {} to {peer} has a request or an answer in flight ({unsent} bytes unsent, {unread} unread): checkpoint again once the rank is out of its PMIx call",
            link.rank, link.nspace
        )));
    }
    Ok(Some(link))
}

/// What [`crate::Frozen::drain`] does with TCP connections.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpPolicy {
    /// Save connections to peers outside the tree too (`ckpt dump
    /// --tcp-established`); those with both ends in the tree are always
    /// saved.
    pub established: bool,
    /// How the peers outside the tree are kept from seeing resets.
    pub lock: NetworkLock,
    /// The tree's root, which names its lock ([`ckpt_netlock::Table`]).
    pub root: i32,
}

/// One connection ckpt switched to repair mode, through its own copy.
struct Repaired {
    pid: i32,
    fd: i32,
    sock: OwnedFd,
    /// Its addresses when the peer is outside the tree (the network lock
    /// holds it); `None` for a peer in the tree.
    outside: Option<ckpt_netlock::Connection>,
    /// SO_REUSEADDR before repair mode, which overrides it (and switching
    /// repair off clears it).
    reuseaddr: bool,
}

/// Established TCP connections of a frozen tree held in repair mode. Dropping
/// it switches repair off again, so a thawed tree's connections go on; a
/// guard process does the same if the dumper dies (see
/// [`sys::fork_repair_guard`]).
#[derive(Default)]
pub struct TcpRepair {
    socks: Vec<Repaired>,
    guard: Option<Guard>,
    /// Processes whose every thread holds a SIGSTOP of ckpt's
    /// ([`TcpRepair::hold`]).
    held: HashSet<i32>,
    /// The network lock put in place for the connections to outside
    /// peers, if any.
    lock: Option<Lock>,
}

/// A network lock in place: its table, in the tree's network namespace.
struct Lock {
    table: ckpt_netlock::Table,
    /// `/proc/ROOT/ns/net`.
    netns: std::path::PathBuf,
    /// That namespace's inode, for the image.
    netns_inode: u64,
}

/// The guard process and the pipe that keeps it waiting.
struct Guard {
    pid: i32,
    tx: OwnedFd,
}

/// An established, half-closed or closing connection found in the tree.
struct Found {
    pid: i32,
    fd: i32,
    sock: OwnedFd,
    local: SocketAddr,
    peer: SocketAddr,
}

/// Every established TCP connection the processes `pids` hold, each
/// once.
fn find_established(pids: &[i32]) -> Result<Vec<Found>> {
    let mut found: Vec<Found> = Vec::new();
    let mut seen: HashSet<u64> = HashSet::new();
    for &pid in pids {
        for fd in procfile::numbered_entries(pid, "fd")? {
            found.extend(established(pid, fd, &mut seen));
        }
    }
    Ok(found)
}

/// An established TCP connection of a running process: its fd and where
/// it goes.
pub(crate) struct TcpPeer {
    /// The fd that holds it.
    pub fd: i32,
    /// The other end's address.
    pub peer: SocketAddr,
}

/// Every established TCP connection process `pid` holds, read without
/// stopping it (checks before the freeze look at these).
pub(crate) fn established_peers(pid: i32) -> Result<Vec<TcpPeer>> {
    Ok(find_established(&[pid])?
        .into_iter()
        .map(|f| TcpPeer {
            fd: f.fd,
            peer: f.peer,
        })
        .collect())
}

/// Fd `fd` of process `pid`, if it is an established, half-closed
/// (FIN_WAIT1, FIN_WAIT2, CLOSE_WAIT) or closing (LAST_ACK, CLOSING) TCP
/// connection not
/// in `seen` (which it joins). Whatever cannot be read here is refused,
/// with its reason, when the fd is collected.
fn established(pid: i32, fd: i32, seen: &mut HashSet<u64>) -> Option<Found> {
    let link = procfile::readlink(pid, &format!("fd/{fd}")).ok()?;
    let ino = link
        .strip_prefix("socket:[")
        .and_then(|s| s.strip_suffix(']'))
        .and_then(|s| s.parse::<u64>().ok())?;
    if !seen.insert(ino) {
        return None;
    }
    let sock = sys::take_fd(pid, fd).ok()?;
    let tcp = matches!(
        identify(sock.as_fd()),
        Ok(Some(Ok(Identity {
            protocol: InetProtocol::Tcp,
            ..
        })))
    );
    if !tcp {
        return None;
    }
    if !tcp_state::repairable(tcp_info(sock.as_fd()).ok()?.state) {
        return None;
    }
    let addr = |end| sys::sock_addr(sock.as_fd(), end).ok().flatten();
    let (Some(local), Some(peer)) = (addr(SockEnd::Local), addr(SockEnd::Peer)) else {
        return None;
    };
    Some(Found {
        pid,
        fd,
        sock,
        local,
        peer,
    })
}

/// The connections of `found` that are saved: those whose peer is in the
/// tree too, and with `policy.established` every one.
///
/// A client whose server end waits in the accept queue of a listener of
/// the tree (`listeners`) counts as in the tree (`pending`); `unaccepted`
/// are the connections waiting in an accept queue of its network
/// namespace, as (server end, client) addresses.
fn chosen(
    found: Vec<Found>,
    policy: TcpPolicy,
    listeners: &[SocketAddr],
    unaccepted: &[(SocketAddr, SocketAddr)],
) -> Result<Vec<Repaired>> {
    let ends: HashSet<(SocketAddr, SocketAddr)> = found.iter().map(|f| (f.local, f.peer)).collect();
    let mut socks = Vec::new();
    for f in found {
        let inside = ends.contains(&(f.peer, f.local))
            || (unaccepted.contains(&(f.peer, f.local))
                && listeners.iter().any(|l| pending::accepts(*l, f.peer)));
        if !inside && srun_pmix::link_to(f.pid, f.peer, 0, 0).is_some() {
            log::debug!(
                "pid {} fd {}: TCP {} -> {}: a rank's link to its PMIx server, saved as such",
                f.pid,
                f.fd,
                f.local,
                f.peer
            );
            continue;
        }
        if !inside && !policy.established {
            log::debug!(
                "pid {} fd {}: TCP {} -> {}: peer outside the tree, not saved without --tcp-established",
                f.pid,
                f.fd,
                f.local,
                f.peer
            );
            continue;
        }
        let reuseaddr =
            flag(f.sock.as_fd(), libc::SOL_SOCKET, libc::SO_REUSEADDR).map_err(|e| {
                DumpError::Proc {
                    pid: f.pid,
                    path: format!("fd {}: SO_REUSEADDR", f.fd).into(),
                    source: e,
                }
            })?;
        log::debug!(
            "pid {} fd {}: TCP {} -> {}: saved ({})",
            f.pid,
            f.fd,
            f.local,
            f.peer,
            if inside {
                "peer in the tree"
            } else {
                "peer outside, --tcp-established"
            }
        );
        socks.push(Repaired {
            pid: f.pid,
            fd: f.fd,
            sock: f.sock,
            outside: (!inside).then_some(ckpt_netlock::Connection {
                local: f.local,
                peer: f.peer,
            }),
            reuseaddr,
        });
    }
    Ok(socks)
}

impl TcpRepair {
    /// Switches every established TCP connection of the processes `pids`
    /// to repair mode whose peer is in the tree, or any peer with
    /// `policy.established`. Those left out are refused when collected.
    ///
    /// `running` are the processes not in a job-control stop: the guard
    /// continues them (see [`TcpRepair::hold`]) if the dumper dies.
    /// `hold_first` runs once the guard is up and before any connection
    /// goes into repair mode (see [`TcpRepair::hold`]).
    pub fn start(
        pids: &[i32],
        running: &[i32],
        policy: TcpPolicy,
        hold_first: impl FnOnce(&mut TcpRepair) -> Result<()>,
    ) -> Result<TcpRepair> {
        let mut repair = TcpRepair::default();
        let listeners = pending::listeners(pids)?;
        let unaccepted = match (listeners.is_empty(), pids.first()) {
            (false, Some(&pid)) => pending::unaccepted(pid)?,
            _ => Vec::new(),
        };
        repair.socks = chosen(find_established(pids)?, policy, &listeners, &unaccepted)?;
        if repair.socks.is_empty() {
            return Ok(repair);
        }
        // The guard first, so no moment passes with a socket in repair
        // mode that nothing would switch back if the dumper died.
        let socks: Vec<(std::os::fd::RawFd, bool)> = repair
            .socks
            .iter()
            .map(|r| (std::os::fd::AsRawFd::as_raw_fd(&r.sock), r.reuseaddr))
            .collect();
        let outside: Vec<ckpt_netlock::Connection> =
            repair.socks.iter().filter_map(|r| r.outside).collect();
        let lock_err = |source| DumpError::NetworkLock {
            pid: policy.root,
            source,
        };
        let table = match policy.lock {
            NetworkLock::Nftables if !outside.is_empty() => {
                Some(ckpt_netlock::Table::for_tree(policy.root))
            }
            _ => None,
        };
        let netns = ckpt_netlock::netns_of(policy.root);
        // Resolved before the fork: the guard can only exec.
        let unlock = match &table {
            Some(t) => {
                let (program, argv) = ckpt_netlock::unlock_argv(t).map_err(lock_err)?;
                let netns = std::fs::File::open(&netns).map_err(|e| DumpError::Proc {
                    pid: policy.root,
                    path: "ns/net".into(),
                    source: e,
                })?;
                Some(sys::GuardUnlock {
                    program,
                    argv,
                    netns,
                })
            }
            None => None,
        };
        let (pid, tx) =
            sys::fork_repair_guard(&socks, running, unlock).map_err(|e| DumpError::Proc {
                pid: std::process::id() as i32,
                path: "fork (TCP repair guard)".into(),
                source: e,
            })?;
        repair.guard = Some(Guard { pid, tx });
        if let Some(table) = table {
            // Before repair mode: from then on until the restore, a
            // segment of the peer must find no socket to answer it.
            ckpt_netlock::lock(&table, &netns, &outside).map_err(lock_err)?;
            log::info!(
                "network lock {table}: {} connections to outside peers",
                outside.len()
            );
            // Read while the root is frozen: the namespace it is in.
            let netns_inode = std::fs::metadata(&netns).map(|m| m.ino()).unwrap_or(0);
            repair.lock = Some(Lock {
                table,
                netns,
                netns_inode,
            });
        }
        hold_first(&mut repair)?;
        // On error `repair` drops: every socket leaves repair mode (one
        // never switched on just gets its SO_REUSEADDR set again).
        for r in &repair.socks {
            sys::setsockopt_int(
                r.sock.as_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_REPAIR,
                TCP_REPAIR_ON,
            )
            .map_err(|e| DumpError::Proc {
                pid: r.pid,
                path: format!("fd {}: TCP_REPAIR (needs CAP_NET_ADMIN)", r.fd).into(),
                source: e,
            })?;
            log::debug!("pid {} fd {}: TCP connection in repair mode", r.pid, r.fd);
        }
        log::info!(
            "drain: {} TCP connections in repair mode (guard pid {pid})",
            repair.socks.len()
        );
        Ok(repair)
    }

    /// Makes sure no thread of process `pid` (its `tasks`, in ptrace stops)
    /// runs while a connection is in repair mode, should the dumper die:
    /// ptrace lets every task go the moment its tracer dies, before the
    /// guard can switch repair off, and a write to a connection in repair
    /// mode fails (EINVAL), a read too (EPERM): the job would die of the
    /// dump. So each thread gets a SIGSTOP queued, which a detached thread
    /// takes before its own code runs (a job-control stop); the guard
    /// switches repair off first and then sends SIGCONT, which also drops
    /// a SIGSTOP not yet taken. On the normal path [`TcpRepair::detach`]
    /// takes the signal back under ptrace. Nothing may run code in a held
    /// process meanwhile (a parasite would take the signal). Nothing is
    /// held without a connection in repair mode; a process already stopped
    /// by job control stays so when detached anyway.
    pub fn hold(&mut self, pid: i32, tasks: &[ckpt_parasite::Tracee]) -> Result<()> {
        if self.socks.is_empty() || self.held.contains(&pid) {
            return Ok(());
        }
        // Marked first: a thread that got its signal must be taken back
        // even if a later one fails.
        self.held.insert(pid);
        for t in tasks {
            t.hold_stop(pid)?;
        }
        Ok(())
    }

    /// Detaches task `t` of process `pid`, taking back its SIGSTOP if
    /// [`TcpRepair::hold`] gave it one. Call after [`TcpRepair::release`].
    pub fn detach(&self, pid: i32, t: ckpt_parasite::Tracee) -> ckpt_parasite::Result<()> {
        if self.held.contains(&pid) {
            t.detach_held()
        } else {
            t.detach()
        }
    }

    /// Switches repair mode off again (the tree goes on).
    pub fn release(&mut self) {
        self.release_own();
        self.unlock();
        self.dismiss_guard();
    }

    /// Deletes the network lock: the connections are live again.
    fn unlock(&mut self) {
        if let Some(lock) = self.lock.take()
            && let Err(e) = ckpt_netlock::unlock(&lock.table, &lock.netns)
        {
            log::warn!("{e}; delete it by hand: {}", lock.table.unlock_hint());
        }
    }

    fn dismiss_guard(&mut self) {
        if let Some(g) = self.guard.take() {
            sys::dismiss_repair_guard(g.pid, g.tx);
        }
    }

    fn release_own(&mut self) {
        for r in self.socks.drain(..) {
            let s = r.sock.as_fd();
            let off =
                sys::setsockopt_int(s, libc::IPPROTO_TCP, libc::TCP_REPAIR, TCP_REPAIR_OFF_NO_WP)
                    .and_then(|()| {
                        sys::setsockopt_int(
                            s,
                            libc::SOL_SOCKET,
                            libc::SO_REUSEADDR,
                            i32::from(r.reuseaddr),
                        )
                    });
            if let Err(e) = off {
                log::warn!(
                    "pid {} fd {}: cannot switch TCP repair mode off: {e}",
                    r.pid,
                    r.fd
                );
            }
        }
    }

    /// Closes ckpt's copies still in repair mode (the tree was killed): a
    /// socket closed in repair mode sends neither FIN nor RST, so the peer
    /// never learns the connection went away and a restore can continue it.
    /// The network lock stays until the restore deletes it.
    pub fn abandon(&mut self) {
        self.socks.clear();
        if let Some(lock) = self.lock.take() {
            log::info!(
                "network lock {} stays until the restore (by hand: {})",
                lock.table,
                lock.table.unlock_hint()
            );
        }
        self.dismiss_guard();
    }

    /// Records the network lock in the image of every connection to an
    /// outside peer of `tree` (after [`Inet::link_tree`] found which).
    pub fn record_lock(&self, tree: &mut TreeFiles) {
        let Some(Lock {
            table, netns_inode, ..
        }) = &self.lock
        else {
            return;
        };
        for f in &mut tree.files.files {
            if let Some(Kind::Inet(InetFile { tcp: Some(tcp), .. })) = &mut f.kind
                && tcp.peer_file_id == 0
                && tcp.unaccepted_by == 0
            {
                tcp.network_lock = table.name().to_string();
                tcp.network_lock_netns = *netns_inode;
            }
        }
    }
}

impl Drop for TcpRepair {
    fn drop(&mut self) {
        self.release();
    }
}
