//! TCP, UDP, UDP-Lite and ICMP ping sockets over IPv4 and IPv6.
//!
//! The socket is created inside the process (so it belongs to the
//! process's filesystem identity, as its own `socket(2)` made it), and the
//! restorer sets it up through its own copy (`pidfd_getfd`, the same
//! socket): options, bind, listen or connect, in the restorer's network
//! namespace, which is the dumped one on the same node.
//!
//! An established connection is rebuilt in repair mode (TCP_REPAIR,
//! CAP_NET_ADMIN, which only the restorer has): sequence numbers of both
//! queues, bind and connect (no SYN is sent), negotiated options,
//! timestamp, the bytes of both queues and the window. Repair mode is
//! switched off once the connection's other end is rebuilt too when the
//! tree holds it (so neither end talks to a socket that does not exist
//! yet), at once when the peer is outside; the bytes that had never been
//! sent are then sent normally. The restored process never holds a socket
//! in repair mode. The FINs of half-closed and closing connections are
//! replayed in their order (`closing`); clients of connections not accepted
//! yet and connects under way connect anew once the tree is rebuilt
//! (`reconnect`); options come from the image's one table (`options`).
//!
//! A UDP socket is shut down again as it was, once bound and connected
//! (on an unconnected one the kernel records the shutdown and answers
//! ENOTCONN, as it did for the process). A ping socket is created inside
//! the process like the others, so the kernel checks the process's group
//! against `net.ipv4.ping_group_range` as it did for the process's own
//! `socket(2)`; its echo identifier comes back as the port it binds.

mod closing;
mod fin;
mod options;
mod reconnect;
mod timewait;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::File;
use ckpt_image::fd::file::Kind;
use ckpt_image::fd::inet::{
    InetFamily, InetFile, InetOptions, InetProtocol, InetState, PmixLink, TcpConnection,
    tcp_data_name,
};

use super::{Context, FileRestorer, set_status_flags};
use crate::error::{RestoreError, Result};
use crate::{pmix, sys};
use ckpt_parasite::remote::Remote;
use options::shut_down;

/// TCP, UDP, UDP-Lite and ping sockets.
pub struct Inet;

/// `TCP_REPAIR` values.
const TCP_REPAIR_ON: i32 = 1;
const TCP_REPAIR_OFF: i32 = 0;
/// `TCP_REPAIR_QUEUE` values.
const TCP_RECV_QUEUE: i32 = 1;
const TCP_SEND_QUEUE: i32 = 2;
/// TCP option kinds of `TCP_REPAIR_OPTIONS`.
const TCPOPT_MSS: u32 = 2;
const TCPOPT_WINDOW: u32 = 3;
const TCPOPT_SACK_PERM: u32 = 4;
const TCPOPT_TIMESTAMP: u32 = 8;
/// The largest window shift TCP allows (RFC 7323).
const TCP_MAX_WSCALE: u32 = 14;
/// Below this port binding needs CAP_NET_BIND_SERVICE, unless the sysctl
/// says otherwise.
const UNPRIVILEGED_PORT_START: &str = "/proc/sys/net/ipv4/ip_unprivileged_port_start";
const DEFAULT_UNPRIVILEGED_PORT_START: u16 = 1024;

/// The kernel's `struct tcp_repair_opt`.
#[repr(C)]
#[derive(Clone, Copy)]
struct TcpRepairOpt {
    code: u32,
    val: u32,
}

/// The kernel's `struct tcp_repair_window`.
#[repr(C)]
#[derive(Clone, Copy)]
struct TcpRepairWindow {
    snd_wl1: u32,
    snd_wnd: u32,
    max_window: u32,
    rcv_wnd: u32,
    rcv_wup: u32,
}

/// Whether sequence number `a` comes after `b` (modulo 2^32, as TCP
/// compares them).
fn seq_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// The dumped window, made consistent with the dumped receive sequence
/// (`recv_seq` is rcv_nxt once the receive queue is refilled). The dumper
/// reads the queue and the window with separate calls; a segment still in
/// flight on loopback between them (the peer is frozen, the kernel is not)
/// can leave a window that starts past the queue, which the kernel refuses
/// (EINVAL). rcv_wup never exceeds rcv_nxt, and snd_wl1 lies within the
/// receive window: clamped there, the connection resumes and TCP settles
/// the rest with its next ACK.
fn consistent_window(conn: &TcpConnection) -> TcpRepairWindow {
    let rcv_nxt = conn.recv_seq;
    let rcv_wup = if seq_after(conn.rcv_wup, rcv_nxt) {
        rcv_nxt
    } else {
        conn.rcv_wup
    };
    let snd_wl1 = if seq_after(conn.snd_wl1, rcv_nxt.wrapping_add(conn.rcv_wnd)) {
        rcv_nxt
    } else {
        conn.snd_wl1
    };
    TcpRepairWindow {
        snd_wl1,
        snd_wnd: conn.snd_wnd,
        max_window: conn.max_window,
        rcv_wnd: conn.rcv_wnd,
        rcv_wup,
    }
}

/// A connection rebuilt in repair mode, waiting for its other end.
struct Held {
    pid: i32,
    fd: i32,
    sock: OwnedFd,
    reuseaddr: bool,
    /// SO_SNDBUF as dumped.
    sndbuf: u32,
    /// SO_BUF_LOCK as dumped.
    buf_lock: u32,
    unsent: Vec<u8>,
    /// The network lock dropping the outside peer's segments, deleted
    /// once the connection is out of repair mode.
    lock: Option<ckpt_netlock::Table>,
    /// The inode of the network namespace the lock was put in.
    lock_netns: u64,
    /// How far it had got in closing: its FIN is sent again once repair
    /// is off; the peer's FIN comes from a peer in the tree the same way,
    /// from one outside it was handed back (`give_back_fin`).
    close: closing::Fins,
}

/// Per byte put back into a queue, room for the kernel's per-buffer
/// overhead: a rebuilt queue is cut into other buffers than the original
/// (no larger segments than the restored MSS allows), so while it is
/// refilled its socket buffer is made this much larger than the data, and
/// set back to the dumped size afterwards (which only stops new data
/// until the queue drains, as it would have).
const REFILL_OVERHEAD: u32 = 8;
/// Room for a refill besides the bytes themselves.
const REFILL_SLACK: u32 = 1 << 20;

/// Sets SO_SNDBUFFORCE or SO_RCVBUFFORCE so that what getsockopt reports
/// is `reported` (the kernel doubles the value set).
fn force_buffer(sock: BorrowedFd<'_>, opt: i32, reported: u32) -> std::io::Result<()> {
    sys::setsockopt_int(
        sock,
        libc::SOL_SOCKET,
        opt,
        i32::try_from(reported / 2).unwrap_or(i32::MAX),
    )
}

/// A buffer size with room to refill `bytes`.
fn refill_room(dumped: u32, bytes: usize) -> u32 {
    let need = u32::try_from(bytes)
        .unwrap_or(u32::MAX)
        .saturating_mul(REFILL_OVERHEAD)
        .saturating_add(REFILL_SLACK);
    dumped.max(need)
}

/// Address reuse of rebuilt connections, put back only once every socket
/// of the tree is in place: a listener rebuilt after connections on its
/// port (Open MPI's accepted connections live in other processes) binds
/// only while those still allow reuse.
#[derive(Default)]
struct DeferredReuse(Vec<(OwnedFd, bool)>);

/// Dropped with the restore context, before any restored process runs.
impl Drop for DeferredReuse {
    fn drop(&mut self) {
        for (sock, reuseaddr) in &self.0 {
            let _ = sys::setsockopt_int(
                sock.as_fd(),
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                i32::from(*reuseaddr),
            );
        }
    }
}

/// Connections waiting for their other end, by file id.
#[derive(Default)]
struct Waiting(HashMap<u64, Held>);

/// Dropped with the restore context, before any restored process runs:
/// whatever still waits (an image whose other end no fd holds) leaves
/// repair mode here, so no process ever gets a socket in repair mode.
impl Drop for Waiting {
    fn drop(&mut self) {
        for h in self.0.values() {
            log::warn!(
                "pid {} fd {}: the other end of this TCP connection was never restored; repair mode switched off",
                h.pid,
                h.fd
            );
            let _ = sys::setsockopt_int(
                h.sock.as_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_REPAIR,
                TCP_REPAIR_OFF,
            );
        }
    }
}

impl FileRestorer for Inet {
    type Image = InetFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &InetFile,
        fd: i32,
    ) -> Result<i32> {
        let pid = cx.pid();
        let plan = Plan::of(cx, file, image, fd)?;
        let domain = match plan.family {
            InetFamily::Ipv6 => libc::AF_INET6,
            _ => libc::AF_INET,
        };
        let (ty, transport) = match (plan.protocol, plan.family) {
            (InetProtocol::Tcp, _) => (libc::SOCK_STREAM, libc::IPPROTO_TCP),
            (InetProtocol::Udplite, _) => (libc::SOCK_DGRAM, libc::IPPROTO_UDPLITE),
            (InetProtocol::Ping, InetFamily::Ipv6) => (libc::SOCK_DGRAM, libc::IPPROTO_ICMPV6),
            (InetProtocol::Ping, _) => (libc::SOCK_DGRAM, libc::IPPROTO_ICMP),
            (InetProtocol::Raw, _) => (libc::SOCK_RAW, image.raw_protocol as i32),
            _ => (libc::SOCK_DGRAM, libc::IPPROTO_UDP),
        };
        let got = r.call(
            "socket",
            libc::SYS_socket,
            [
                domain as u64,
                (ty | libc::SOCK_CLOEXEC) as u64,
                transport as u64,
                0,
                0,
                0,
            ],
        )? as i32;
        let copy = sys::take_fd(pid, got)
            .map_err(|e| RestoreError::os(pid, format!("fd {fd}: pidfd_getfd"), e))?;
        let sock = copy.as_fd();
        let os = |what: &str| {
            let what = what.to_string();
            move |e: std::io::Error| RestoreError::os(pid, format!("fd {fd}: {what}"), e)
        };
        let options = plan.options.clone();
        options::set(sock, plan.family, plan.protocol, &options)
            .map_err(|(name, e)| os(&format!("setsockopt {name}"))(e))?;
        options::set_datagram(sock, &plan, &options).map_err(os("setsockopt"))?;
        if let Some(link) = &image.pmix {
            reconnect_pmix(pid, fd, sock, link, &cx.shared.options.pmix_step)?;
            set_status_flags(r, got, file.flags)?;
            return Ok(got);
        }
        match (&plan.tcp, plan.state) {
            (Some(conn), _) if conn.unaccepted_by != 0 => {
                let local = plan.local.expect("checked by Plan::of");
                reconnect::bind(pid, fd, sock, local)?;
                let mut queued = plan.sent;
                queued.extend_from_slice(&plan.unsent);
                cx.shared
                    .outside_peers
                    .reconnects
                    .push(reconnect::Reconnect {
                        pid,
                        fd,
                        sock: copy,
                        peer: plan.peer.expect("checked by Plan::of"),
                        queued,
                        fin_sent: conn.fin_sent,
                        sndbuf: options.sndbuf,
                        buf_lock: options.buf_lock,
                        reuseaddr: options.reuseaddr,
                        in_progress: false,
                    });
            }
            (Some(conn), _) => {
                restore_connection(cx, sock, &plan, conn, file.id, fd)?;
                if conn.fin_received && conn.peer_file_id == 0 {
                    give_back_fin(r, pid, fd, sock, &plan, conn)?;
                }
                let held = Held {
                    pid,
                    fd,
                    sock: copy,
                    reuseaddr: options.reuseaddr,
                    sndbuf: options.sndbuf,
                    buf_lock: options.buf_lock,
                    unsent: plan.unsent,
                    lock: (!conn.network_lock.is_empty())
                        .then(|| ckpt_netlock::Table::named(&conn.network_lock)),
                    lock_netns: conn.network_lock_netns,
                    close: closing::Fins::of(conn),
                };
                finish_or_wait(cx, held, file.id, conn.peer_file_id)?;
            }
            (None, state) => {
                if let Some(local) = plan.local {
                    // Connections on this port may be rebuilt already,
                    // holding it with address reuse on until the end
                    // (`DeferredReuse`); the socket's own setting comes
                    // back once it is bound and listening.
                    let reuse = |on: bool| {
                        sys::setsockopt_int(
                            sock,
                            libc::SOL_SOCKET,
                            libc::SO_REUSEADDR,
                            i32::from(on),
                        )
                    };
                    reuse(true).map_err(os("SO_REUSEADDR"))?;
                    let backlog = i32::try_from(image.backlog).unwrap_or(i32::MAX);
                    // A listen refused after its bind went through
                    // leaves the socket bound: bind only once.
                    let bound = std::cell::Cell::new(false);
                    let take_port = || {
                        if !bound.get() {
                            sys::bind(sock, &local)?;
                            bound.set(true);
                        }
                        if state == InetState::Listen {
                            sys::listen(sock, backlog)?;
                        }
                        Ok::<(), std::io::Error>(())
                    };
                    match take_port() {
                        // An echo identifier in use is no TCP port.
                        Err(e)
                            if e.raw_os_error() == Some(libc::EADDRINUSE)
                                && !matches!(
                                    plan.protocol,
                                    InetProtocol::Ping | InetProtocol::Raw
                                ) =>
                        {
                            let dual = plan.family == InetFamily::Ipv6 && !options.v6only;
                            let cleared = timewait::clear(local, dual)
                                .map_err(os(&format!("clear TIME_WAIT sockets on {local}")))?;
                            log::info!(
                                "pid {pid} fd {fd}: {cleared} TIME_WAIT sockets on {local} removed for the restored socket"
                            );
                            take_port().map_err(os(&format!("bind {local}")))?;
                        }
                        other => other.map_err(os(&format!("bind {local}")))?,
                    }
                    reuse(options.reuseaddr).map_err(os("SO_REUSEADDR"))?;
                }
                match state {
                    InetState::Listen if plan.local.is_none() => {
                        let backlog = i32::try_from(image.backlog).unwrap_or(i32::MAX);
                        sys::listen(sock, backlog).map_err(os("listen"))?;
                    }
                    InetState::Connected => {
                        let peer = plan.peer.expect("checked by Plan::of");
                        sys::connect(sock, &peer).map_err(os(&format!("connect {peer}")))?;
                    }
                    InetState::Connecting => {
                        // Once every listener of the tree is back.
                        cx.shared
                            .outside_peers
                            .reconnects
                            .push(reconnect::Reconnect {
                                pid,
                                fd,
                                sock: copy,
                                peer: plan.peer.expect("checked by Plan::of"),
                                queued: Vec::new(),
                                fin_sent: false,
                                sndbuf: options.sndbuf,
                                buf_lock: options.buf_lock,
                                reuseaddr: options.reuseaddr,
                                in_progress: true,
                            });
                        set_status_flags(r, got, file.flags)?;
                        return Ok(got);
                    }
                    _ => {}
                }
                shut_down(sock, image, state).map_err(os("shutdown"))?;
            }
        }
        set_status_flags(r, got, file.flags)?;
        Ok(got)
    }
}

/// Connects `sock` (the rank's new socket, through the restorer's copy) to
/// the PMIx server of the job step this restore runs in, and performs the
/// client handshake as the rank `link` names: the rank's library then goes
/// on with it as with its old server (`crate::pmix`).
fn reconnect_pmix(
    pid: i32,
    fd: i32,
    sock: BorrowedFd<'_>,
    link: &PmixLink,
    step: &pmix::StepEnv,
) -> Result<()> {
    let pmix_err = |source| RestoreError::Pmix { pid, fd, source };
    let client = pmix::PmixClient {
        nspace: link.nspace.clone(),
        rank: link.rank,
        uid: link.uid,
        gid: link.gid,
    };
    let server = step.server_for(&client).map_err(pmix_err)?;
    sys::connect(sock, &server.addr).map_err(|e| {
        RestoreError::os(
            pid,
            format!("fd {fd}: connect PMIx server {}", server.addr),
            e,
        )
    })?;
    let copy = sock
        .try_clone_to_owned()
        .map_err(|e| RestoreError::os(pid, format!("fd {fd}: dup"), e))?;
    let mut stream = std::net::TcpStream::from(copy);
    let index = pmix::handshake(&mut stream, server.addr, &client).map_err(pmix_err)?;
    log::info!(
        "pid {pid} fd {fd}: rank {} of {} reconnected to the PMIx server at {} (client index {index})",
        client.rank,
        client.nspace,
        server.addr
    );
    Ok(())
}

/// A socket's image, checked.
struct Plan {
    family: InetFamily,
    protocol: InetProtocol,
    /// A raw socket's IP protocol.
    raw_protocol: u32,
    state: InetState,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    tcp: Option<TcpConnection>,
    /// Socket options as dumped.
    options: InetOptions,
    /// An established connection's queues: what was sent and not
    /// acknowledged, what was never sent, what was received and not read.
    sent: Vec<u8>,
    unsent: Vec<u8>,
    received: Vec<u8>,
}

impl Plan {
    fn of(cx: &Context<'_, '_>, file: &File, image: &InetFile, fd: i32) -> Result<Plan> {
        let bad = |what: &str| cx.invalid(fd, &format!("inet socket: {what}"));
        let family = InetFamily::try_from(image.family)
            .ok()
            .filter(|f| *f != InetFamily::Unspecified)
            .ok_or_else(|| bad("unknown family"))?;
        let protocol = InetProtocol::try_from(image.protocol)
            .ok()
            .filter(|p| *p != InetProtocol::Unspecified)
            .ok_or_else(|| bad("unknown protocol"))?;
        let state = InetState::try_from(image.state)
            .ok()
            .filter(|s| *s != InetState::Unspecified)
            .ok_or_else(|| bad("unknown state"))?;
        let addr = |a: &Option<ckpt_image::fd::inet::InetAddr>| -> Result<Option<SocketAddr>> {
            a.as_ref()
                .map(|a| a.to_socket_addr().ok_or_else(|| bad("malformed address")))
                .transpose()
        };
        // A part restored where its addresses changed comes back on the
        // new ones (the map is the operator's or the job's, see `addresses.rs`).
        let moved = &cx.shared.options.files.addresses;
        let local = addr(&image.local)?.map(|a| moved.apply(a));
        let peer = addr(&image.peer)?.map(|a| moved.apply(a));
        for a in local.iter().chain(peer.iter()) {
            let v6 = matches!(a, SocketAddr::V6(_));
            if v6 != (family == InetFamily::Ipv6) {
                return Err(bad("address of the other family"));
            }
        }
        let mut plan = Plan {
            family,
            protocol,
            raw_protocol: image.raw_protocol,
            state,
            local,
            peer,
            tcp: None,
            options: image.options.clone().unwrap_or_default(),
            sent: Vec::new(),
            unsent: Vec::new(),
            received: Vec::new(),
        };
        match (protocol, state) {
            (
                InetProtocol::Udp | InetProtocol::Udplite | InetProtocol::Ping | InetProtocol::Raw,
                InetState::Listen,
            ) => {
                return Err(bad("listening datagram socket"));
            }
            (InetProtocol::Tcp | InetProtocol::Ping | InetProtocol::Raw, _)
                if image.shut_rd || image.shut_wr =>
            {
                return Err(bad("shutdown state on a socket other than UDP"));
            }
            (_, InetState::Connected | InetState::Connecting) if peer.is_none() => {
                return Err(bad("connected without a peer address"));
            }
            (
                InetProtocol::Udp | InetProtocol::Udplite | InetProtocol::Ping | InetProtocol::Raw,
                InetState::Connecting,
            ) => {
                return Err(bad("connecting datagram socket"));
            }
            // A link to a PMIx server is made anew (`reconnect_pmix`).
            (InetProtocol::Tcp, InetState::Connected) if image.pmix.is_some() => {}
            (InetProtocol::Tcp, InetState::Connected) => {
                let mut conn = image
                    .tcp
                    .clone()
                    .ok_or_else(|| bad("established TCP without its connection state"))?;
                if local.is_none() {
                    return Err(bad("established TCP without a local address"));
                }
                plan.load_queues(cx, file, &conn, fd)?;
                check_peer(cx, file, &conn, fd)?;
                plan.skip_delivered(cx, &mut conn, fd)?;
                plan.tcp = Some(conn);
            }
            (InetProtocol::Tcp, InetState::Listen) if local.is_none() => {
                return Err(bad("listening without a local address"));
            }
            _ => {}
        }
        if protocol == InetProtocol::Raw {
            check_raw(cx.pid(), fd, family, image)?;
        }
        // A ping socket's "port" is its echo identifier, open to all; a
        // raw socket's is its protocol.
        if plan.tcp.is_none()
            && !matches!(protocol, InetProtocol::Ping | InetProtocol::Raw)
            && let Some(local) = local
        {
            check_privileged_port(cx.pid(), fd, &local, image.may_bind_privileged)?;
        }
        Ok(plan)
    }

    /// Reads the connection's queued bytes, bounded by the image's lengths.
    fn load_queues(
        &mut self,
        cx: &Context<'_, '_>,
        file: &File,
        conn: &TcpConnection,
        fd: i32,
    ) -> Result<()> {
        let name = tcp_data_name(file.id);
        let want = conn
            .data_len()
            .ok_or_else(|| cx.invalid(fd, "inet socket: queue lengths out of bounds"))?;
        let data = if want == 0 {
            Vec::new()
        } else {
            cx.shared.images.read_raw(&name)?
        };
        if data.len() as u64 != want {
            return Err(cx.invalid(
                fd,
                &format!("{name} holds {} bytes, the connection {want}", data.len()),
            ));
        }
        let send = conn.send_len as usize;
        let sent = send - conn.unsent_len as usize;
        self.sent = data[..sent].to_vec();
        self.unsent = data[sent..send].to_vec();
        self.received = data[send..].to_vec();
        Ok(())
    }
}

impl Plan {
    /// Drops from the send queue what the other end (in the tree) had
    /// already received. The dump reads every send queue before any
    /// receive queue, because the kernel still carries segments and
    /// acknowledgments between two frozen ends: a receiver may be read
    /// with bytes its sender still counted as unacknowledged or unsent,
    /// never short of bytes its sender had given up. Restoring them in
    /// both queues would make the sender's acknowledgments point past what
    /// it sent, which it ignores: the connection would stall.
    fn skip_delivered(
        &mut self,
        cx: &Context<'_, '_>,
        conn: &mut TcpConnection,
        fd: i32,
    ) -> Result<()> {
        let Some(other) = peer_connection(cx, conn.peer_file_id) else {
            return Ok(());
        };
        let Some(delivered) = delivered_bytes(conn, other.recv_seq) else {
            return Err(cx.invalid(
                fd,
                &format!(
                    "inet socket: inconsistent TCP snapshot: the other end waits for byte {} but this end's queue holds bytes {}..{}",
                    other.recv_seq,
                    conn.send_seq.wrapping_sub(conn.send_len),
                    conn.send_seq
                ),
            ));
        };
        if delivered == 0 {
            return Ok(());
        }
        let delivered = delivered as usize;
        let from_sent = delivered.min(self.sent.len());
        self.sent.drain(..from_sent);
        self.unsent.drain(..delivered - from_sent);
        conn.send_len -= delivered as u32;
        conn.unsent_len = self.unsent.len() as u32;
        log::debug!(
            "pid {} fd {fd}: TCP: {delivered} queued bytes already at the other end, not sent again",
            cx.pid()
        );
        Ok(())
    }
}

/// How many bytes at the head of `conn`'s send queue the other end, which
/// waits for byte `peer_recv_seq`, has already received; `None` when the
/// byte it waits for is not in the queue (sequence numbers wrap).
fn delivered_bytes(conn: &TcpConnection, peer_recv_seq: u32) -> Option<u32> {
    let unacked_from = conn.send_seq.wrapping_sub(conn.send_len);
    let delivered = peer_recv_seq.wrapping_sub(unacked_from);
    (delivered <= conn.send_len).then_some(delivered)
}

/// The dumped state of the other end of an in-tree connection.
fn peer_connection<'a>(cx: &'a Context<'_, '_>, peer_file_id: u64) -> Option<&'a TcpConnection> {
    if peer_file_id == 0 {
        return None;
    }
    match cx.shared.files.get(peer_file_id)?.kind.as_ref()? {
        Kind::Inet(i) => i.tcp.as_ref(),
        _ => None,
    }
}

/// A connection's other end, when the tree holds it, must be an
/// established connection naming this one back (so both are rebuilt and
/// the first waits for the second).
fn check_peer(cx: &Context<'_, '_>, file: &File, conn: &TcpConnection, fd: i32) -> Result<()> {
    if conn.peer_file_id == 0 {
        return Ok(());
    }
    let back = match cx
        .shared
        .files
        .get(conn.peer_file_id)
        .and_then(|f| f.kind.as_ref())
    {
        Some(Kind::Inet(i)) => i.tcp.as_ref().map(|t| t.peer_file_id),
        _ => None,
    };
    if back != Some(file.id) || conn.peer_file_id == file.id {
        return Err(cx.invalid(
            fd,
            &format!(
                "inet socket: peer file {} is not the other end of this connection",
                conn.peer_file_id
            ),
        ));
    }
    Ok(())
}

/// A raw socket is made again for a user (the service's restore) only if
/// the process had CAP_NET_RAW at dump time: the socket is the process's,
/// but the restorer's own capabilities must not stand in for its.
fn check_raw(pid: i32, fd: i32, family: InetFamily, image: &InetFile) -> Result<()> {
    if image.may_net_raw || ckpt_image::caller::acting_for().is_none() {
        return Ok(());
    }
    let fam = if family == InetFamily::Ipv6 {
        "IPv6"
    } else {
        "IPv4"
    };
    Err(RestoreError::File {
        pid,
        path: format!("fd {fd}"),
        what: format!(
            "raw {fam} socket (protocol {}): needs CAP_NET_RAW, which the process did not have at dump time",
            image.raw_protocol
        ),
    })
}

/// A port below `ip_unprivileged_port_start` is only given back to a
/// process that could have bound it itself (the restorer binds as root).
fn check_privileged_port(pid: i32, fd: i32, local: &SocketAddr, allowed: bool) -> Result<()> {
    let start = std::fs::read_to_string(UNPRIVILEGED_PORT_START)
        .ok()
        .and_then(|s| s.trim().parse::<u16>().ok())
        .unwrap_or(DEFAULT_UNPRIVILEGED_PORT_START);
    let port = local.port();
    if port != 0 && port < start && !allowed {
        return Err(RestoreError::File {
            pid,
            path: format!("fd {fd}"),
            what: format!(
                "socket bound to {local}: port {port} needs CAP_NET_BIND_SERVICE, which the process did not have at dump time"
            ),
        });
    }
    Ok(())
}

/// Rebuilds an established connection in repair mode, up to (not
/// including) switching repair off and sending what was never sent.
fn restore_connection(
    cx: &Context<'_, '_>,
    sock: BorrowedFd<'_>,
    plan: &Plan,
    conn: &TcpConnection,
    file_id: u64,
    fd: i32,
) -> Result<()> {
    let pid = cx.pid();
    let os = |what: &str| {
        let what = what.to_string();
        move |e: std::io::Error| RestoreError::os(pid, format!("fd {fd}: TCP repair: {what}"), e)
    };
    let tcp = libc::IPPROTO_TCP;
    let (local, peer) = (
        plan.local.expect("checked by Plan::of"),
        plan.peer.expect("checked by Plan::of"),
    );
    sys::setsockopt_int(sock, tcp, libc::TCP_REPAIR, TCP_REPAIR_ON).map_err(os("TCP_REPAIR"))?;
    // Each queue starts where its first saved byte was; writing the bytes
    // back moves it to where it was at dump time.
    let start_of = |seq: u32, len: u32| seq.wrapping_sub(len);
    for (queue, seq) in [
        (TCP_SEND_QUEUE, start_of(conn.send_seq, conn.send_len)),
        (TCP_RECV_QUEUE, start_of(conn.recv_seq, conn.recv_len)),
    ] {
        sys::setsockopt_int(sock, tcp, libc::TCP_REPAIR_QUEUE, queue)
            .map_err(os("TCP_REPAIR_QUEUE"))?;
        sys::setsockopt_int(sock, tcp, libc::TCP_QUEUE_SEQ, seq as i32)
            .map_err(os("TCP_QUEUE_SEQ"))?;
    }
    sys::bind(sock, &local).map_err(os(&format!("bind {local}")))?;
    sys::connect(sock, &peer).map_err(os(&format!("connect {peer}")))?;
    let mut opts = vec![TcpRepairOpt {
        code: TCPOPT_MSS,
        val: conn.mss,
    }];
    if conn.wscale_ok {
        if conn.snd_wscale > TCP_MAX_WSCALE || conn.rcv_wscale > TCP_MAX_WSCALE {
            return Err(cx.invalid(fd, "inet socket: window scale out of bounds"));
        }
        opts.push(TcpRepairOpt {
            code: TCPOPT_WINDOW,
            val: conn.snd_wscale | (conn.rcv_wscale << 16),
        });
    }
    if conn.sack_ok {
        opts.push(TcpRepairOpt {
            code: TCPOPT_SACK_PERM,
            val: 0,
        });
    }
    if conn.timestamps_ok {
        opts.push(TcpRepairOpt {
            code: TCPOPT_TIMESTAMP,
            val: 0,
        });
    }
    sys::setsockopt_raw(sock, tcp, libc::TCP_REPAIR_OPTIONS, &opts)
        .map_err(os("TCP_REPAIR_OPTIONS"))?;
    if conn.timestamps_ok {
        sys::setsockopt_int(sock, tcp, libc::TCP_TIMESTAMP, conn.timestamp as i32)
            .map_err(os("TCP_TIMESTAMP"))?;
    }
    let options = &plan.options;
    force_buffer(
        sock,
        libc::SO_SNDBUFFORCE,
        refill_room(options.sndbuf, plan.sent.len()),
    )
    .map_err(os("SO_SNDBUFFORCE"))?;
    force_buffer(
        sock,
        libc::SO_RCVBUFFORCE,
        refill_room(options.rcvbuf, plan.received.len()),
    )
    .map_err(os("SO_RCVBUFFORCE"))?;
    // Sent but not acknowledged: queued as sent (repair mode transmits
    // nothing; the retransmission timer resends it if the peer lacks it).
    sys::setsockopt_int(sock, tcp, libc::TCP_REPAIR_QUEUE, TCP_SEND_QUEUE)
        .map_err(os("TCP_REPAIR_QUEUE"))?;
    sys::send_all(sock, &plan.sent).map_err(os("refill send queue"))?;
    sys::setsockopt_int(sock, tcp, libc::TCP_REPAIR_QUEUE, TCP_RECV_QUEUE)
        .map_err(os("TCP_REPAIR_QUEUE"))?;
    sys::send_all(sock, &plan.received).map_err(os("refill receive queue"))?;
    let window = consistent_window(conn);
    sys::setsockopt_raw(sock, tcp, libc::TCP_REPAIR_WINDOW, &[window])
        .map_err(os("TCP_REPAIR_WINDOW"))?;
    // The receive buffer goes back to its size now; the send buffer once
    // the bytes never sent are queued too.
    force_buffer(sock, libc::SO_RCVBUFFORCE, options.rcvbuf.max(1))
        .map_err(os("SO_RCVBUFFORCE"))?;
    options::lock_buffers(sock, options.buf_lock).map_err(os("SO_BUF_LOCK"))?;
    log::debug!(
        "pid {pid} fd {fd}: TCP {local} -> {peer} rebuilt (open file {file_id}): {} bytes sent, {} unsent, {} received",
        plan.sent.len(),
        plan.unsent.len(),
        plan.received.len()
    );
    Ok(())
}

/// Hands the rebuilt socket `sock` (fd `fd` of `pid`, in repair mode) the
/// FIN its peer outside the tree had sent (see `fin`), and waits until it
/// is in CLOSE_WAIT again.
fn give_back_fin(
    r: &Remote<'_>,
    pid: i32,
    fd: i32,
    sock: BorrowedFd<'_>,
    plan: &Plan,
    conn: &TcpConnection,
) -> Result<()> {
    let err = |what: &str, e: std::io::Error| {
        RestoreError::os(
            pid,
            format!("fd {fd}: TCP: give back the peer's FIN: {what}"),
            e,
        )
    };
    let segment = fin::Fin {
        from: plan.peer.expect("checked by Plan::of"),
        to: plan.local.expect("checked by Plan::of"),
        seq: conn.recv_seq,
        ack: conn.send_seq.wrapping_sub(conn.send_len),
        window: u16::try_from(conn.snd_wnd >> conn.snd_wscale.min(TCP_MAX_WSCALE))
            .unwrap_or(u16::MAX),
    };
    let Some((packet, dst)) = fin::packet(&segment) else {
        return Err(err(
            "addresses",
            std::io::Error::other("local and peer addresses of different families"),
        ));
    };
    let domain = if dst.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // Made by the process, so in its network namespace.
    let raw = r.call(
        "socket",
        libc::SYS_socket,
        [
            domain as u64,
            (libc::SOCK_RAW | libc::SOCK_CLOEXEC) as u64,
            libc::IPPROTO_RAW as u64,
            0,
            0,
            0,
        ],
    )? as i32;
    let copy = sys::take_fd(pid, raw).map_err(|e| err("pidfd_getfd", e));
    r.call("close", libc::SYS_close, [raw as u64, 0, 0, 0, 0, 0])?;
    let copy = copy?;
    sys::setsockopt_int(
        copy.as_fd(),
        libc::SOL_SOCKET,
        libc::SO_MARK,
        ckpt_netlock::INJECTED_MARK as i32,
    )
    .map_err(|e| err("SO_MARK", e))?;
    sys::send_to(copy.as_fd(), &packet, dst).map_err(|e| err("sendto", e))?;
    let until = std::time::Instant::now() + closing::FIN_WAIT;
    loop {
        let state = sys::tcp_state(sock).map_err(|e| err("TCP_INFO", e))?;
        if state == TCP_CLOSE_WAIT {
            log::debug!("pid {pid} fd {fd}: TCP: the peer's FIN given back");
            return Ok(());
        }
        if std::time::Instant::now() >= until {
            return Err(err(
                "state",
                std::io::Error::other(format!("still in state {state}, not CLOSE_WAIT")),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Switches repair off once both ends of an in-tree connection are
/// rebuilt (or at once for a peer outside).
fn finish_or_wait(
    cx: &mut Context<'_, '_>,
    held: Held,
    file_id: u64,
    peer_file_id: u64,
) -> Result<()> {
    if peer_file_id == 0 {
        cx.shared.outside_peers.held.push(held);
        return Ok(());
    }
    match cx.state::<Waiting>().0.remove(&peer_file_id) {
        Some(other) => finish(cx, vec![other, held]),
        None => {
            cx.state::<Waiting>().0.insert(file_id, held);
            Ok(())
        }
    }
}

/// Connections to peers outside the tree, rebuilt and still in repair
/// mode until the restored tree is let go (`Stopped::resume`): the peer
/// may be a process of another node of the job whose own end is being
/// rebuilt meanwhile, and a segment reaching a node where that end does
/// not exist yet would be answered with a reset. Dropped unreleased (the
/// restore failed, the tree is killed), they close in repair mode: the
/// peer sees nothing.
///
/// With them wait the clients whose server end a listener of the tree had
/// not accepted (`reconnect`): they connect anew once every listener is
/// back.
#[derive(Default)]
pub struct OutsidePeers {
    held: Vec<Held>,
    reconnects: Vec<reconnect::Reconnect>,
}

impl OutsidePeers {
    /// Switches repair off on each (the tree is about to run; in a
    /// coordinated restart every node has rebuilt its part), with the
    /// process's address reuse back, and sends what had never been sent.
    /// Then the network lock that held them goes: the peers' segments find
    /// their sockets again. A lock that cannot be deleted is only logged,
    /// with the command that deletes it, as the tree is in place.
    pub fn release(self) -> Result<()> {
        // Connects under way last: a listener's accept queue is for the
        // connections it had.
        let (made, under_way): (Vec<_>, Vec<_>) =
            self.reconnects.iter().partition(|r| !r.in_progress);
        for r in made.into_iter().chain(under_way) {
            r.connect()?;
        }
        switch_off(&self.held)?;
        // Each table once, in the namespace of a process it held.
        let mut tables: Vec<&Held> = Vec::new();
        for h in &self.held {
            if let Some(table) = &h.lock
                && !tables.iter().any(|t| t.lock.as_ref() == Some(table))
            {
                tables.push(h);
            }
        }
        for h in tables {
            let table = h.lock.as_ref().expect("chosen for its lock");
            let netns = ckpt_netlock::netns_of(h.pid);
            let here = std::fs::metadata(&netns).map(|m| m.ino()).unwrap_or(0);
            if h.lock_netns != 0 && here != h.lock_netns {
                log::warn!(
                    "network lock {table} stays in the network namespace the tree was dumped in (inode {}), not this one: delete it there by hand: {}",
                    h.lock_netns,
                    table.unlock_hint()
                );
            }
            match ckpt_netlock::unlock(table, &netns) {
                Ok(()) => log::info!("network lock {table} deleted"),
                Err(e) => log::warn!("{e}; delete it by hand: {}", table.unlock_hint()),
            }
        }
        // The peer acknowledges the FIN again (it had it already).
        closing::send_fins(&self.held)?;
        for h in &self.held {
            sys::setsockopt_int(
                h.sock.as_fd(),
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                i32::from(h.reuseaddr),
            )
            .map_err(|e| {
                RestoreError::os(h.pid, format!("fd {}: TCP repair: SO_REUSEADDR", h.fd), e)
            })?;
        }
        Ok(())
    }

    /// How many connections wait.
    pub fn len(&self) -> usize {
        self.held.len() + self.reconnects.len()
    }

    /// None wait.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty() && self.reconnects.is_empty()
    }
}

/// Both ends of an in-tree connection are rebuilt: repair off, and the
/// process's address reuse (repair mode overrides it) back when the whole
/// tree is rebuilt (`DeferredReuse`).
fn finish(cx: &mut Context<'_, '_>, ends: Vec<Held>) -> Result<()> {
    switch_off(&ends)?;
    closing::send_fins(&ends)?;
    closing::await_fins(&ends);
    let deferred = &mut cx.state::<DeferredReuse>().0;
    deferred.extend(ends.into_iter().map(|h| (h.sock, h.reuseaddr)));
    Ok(())
}

/// Repair off on every end first (with a window probe, so the peer learns
/// our window), address reuse allowed for now; then the bytes that had
/// never been sent go out like any write.
fn switch_off(ends: &[Held]) -> Result<()> {
    let os = |h: &Held, what: &str| {
        let (pid, fd, what) = (h.pid, h.fd, what.to_string());
        move |e: std::io::Error| RestoreError::os(pid, format!("fd {fd}: TCP repair: {what}"), e)
    };
    for h in ends {
        let s = h.sock.as_fd();
        sys::setsockopt_int(s, libc::IPPROTO_TCP, libc::TCP_REPAIR, TCP_REPAIR_OFF)
            .map_err(os(h, "TCP_REPAIR off"))?;
        // Repair mode forced reuse; until the end it stays allowed.
        sys::setsockopt_int(s, libc::SOL_SOCKET, libc::SO_REUSEADDR, 1)
            .map_err(os(h, "SO_REUSEADDR"))?;
    }
    for h in ends {
        let s = h.sock.as_fd();
        force_buffer(
            s,
            libc::SO_SNDBUFFORCE,
            refill_room(h.sndbuf, h.unsent.len()),
        )
        .map_err(os(h, "SO_SNDBUFFORCE"))?;
        sys::send_all(s, &h.unsent).map_err(os(
            h,
            &format!("send the {} bytes never sent", h.unsent.len()),
        ))?;
        force_buffer(s, libc::SO_SNDBUFFORCE, h.sndbuf.max(1)).map_err(os(h, "SO_SNDBUFFORCE"))?;
        options::lock_buffers(s, h.buf_lock).map_err(os(h, "SO_BUF_LOCK"))?;
    }
    Ok(())
}

/// `TCP_CLOSE_WAIT` of include/net/tcp_states.h.
const TCP_CLOSE_WAIT: u8 = 8;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_the_other_end_has_are_counted_and_a_gap_is_refused() {
        // Queue: bytes 1000..1500 (write_seq 1500).
        let conn = TcpConnection {
            send_seq: 1500,
            send_len: 500,
            ..TcpConnection::default()
        };
        assert_eq!(delivered_bytes(&conn, 1000), Some(0));
        assert_eq!(delivered_bytes(&conn, 1200), Some(200));
        assert_eq!(delivered_bytes(&conn, 1500), Some(500));
        // Waiting for a byte before the queue: acknowledged, in neither.
        assert_eq!(delivered_bytes(&conn, 999), None);
        // Past what was ever written.
        assert_eq!(delivered_bytes(&conn, 1501), None);
        // Across the wrap of the sequence space.
        let wrapped = TcpConnection {
            send_seq: 100,
            send_len: 300,
            ..TcpConnection::default()
        };
        assert_eq!(delivered_bytes(&wrapped, u32::MAX - 99), Some(100));
        assert_eq!(delivered_bytes(&wrapped, u32::MAX - 250), None);
    }

    #[test]
    fn a_window_past_the_receive_queue_is_clamped_to_it() {
        let conn = TcpConnection {
            recv_seq: 1000,
            rcv_wup: 1500,
            rcv_wnd: 100,
            snd_wl1: 5000,
            ..Default::default()
        };
        let w = consistent_window(&conn);
        assert_eq!((w.rcv_wup, w.snd_wl1), (1000, 1000));
        let fine = TcpConnection {
            recv_seq: 1000,
            rcv_wup: 900,
            rcv_wnd: 100,
            snd_wl1: 1050,
            ..Default::default()
        };
        let w = consistent_window(&fine);
        assert_eq!((w.rcv_wup, w.snd_wl1), (900, 1050));
        // Across the wrap of the sequence space.
        let wrapped = TcpConnection {
            recv_seq: 10,
            rcv_wup: u32::MAX - 5,
            rcv_wnd: 100,
            snd_wl1: u32::MAX,
            ..Default::default()
        };
        let w = consistent_window(&wrapped);
        assert_eq!((w.rcv_wup, w.snd_wl1), (u32::MAX - 5, u32::MAX));
    }
}
