//! TCP, UDP, UDP-Lite and ICMP ping sockets over IPv4 and IPv6.
//!
//! The messages are defined in `image/proto/fd_inet.proto`. An established
//! TCP connection's queued bytes live in [`tcp_data_name`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

pub mod options;

pub use crate::pb::{
    InetAddr, InetFamily, InetFile, InetOptions, InetProtocol, InetState, PmixLink, SockFilterInsn,
    TcpConnection,
};

/// The most bytes one queue of a connection may hold in an image: the
/// kernel's own ceiling for a socket buffer (`INT_MAX`), so a forged
/// length cannot make restore allocate more.
pub const MAX_QUEUE_BYTES: u32 = i32::MAX as u32;

/// File name of the queued bytes of the TCP connection of open file
/// `file_id`: the send queue, then the receive queue.
pub fn tcp_data_name(file_id: u64) -> String {
    format!("tcp-{file_id}.img")
}

impl InetAddr {
    /// The record of a socket address.
    pub fn from_socket_addr(a: &SocketAddr) -> Self {
        match a {
            SocketAddr::V4(v4) => InetAddr {
                addr: v4.ip().octets().to_vec(),
                port: u32::from(v4.port()),
                scope_id: 0,
            },
            SocketAddr::V6(v6) => InetAddr {
                addr: v6.ip().octets().to_vec(),
                port: u32::from(v6.port()),
                scope_id: v6.scope_id(),
            },
        }
    }

    /// The socket address recorded, or `None` for a malformed record (an
    /// address of neither 4 nor 16 bytes, a port above 65535).
    pub fn to_socket_addr(&self) -> Option<SocketAddr> {
        let port = u16::try_from(self.port).ok()?;
        let ip: IpAddr = match self.addr.len() {
            4 => Ipv4Addr::from(<[u8; 4]>::try_from(self.addr.as_slice()).ok()?).into(),
            16 => Ipv6Addr::from(<[u8; 16]>::try_from(self.addr.as_slice()).ok()?).into(),
            _ => return None,
        };
        Some(match ip {
            IpAddr::V4(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
            IpAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(v6, port, 0, self.scope_id)),
        })
    }
}

impl std::fmt::Display for InetAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.to_socket_addr() {
            Some(a) => write!(f, "{a}"),
            None => write!(f, "(malformed address)"),
        }
    }
}

impl TcpConnection {
    /// The TCP state the connection was in, as its FIN flags tell.
    pub fn state_name(&self) -> &'static str {
        match (self.fin_sent, self.fin_received) {
            (false, false) => "established",
            (true, false) => "FIN_WAIT",
            (false, true) => "CLOSE_WAIT",
            (true, true) if self.fin_first => "CLOSING",
            (true, true) => "LAST_ACK",
        }
    }

    /// Bytes of `tcp-ID.img` this connection needs, or `None` if a queue
    /// length is out of bounds or the unsent part exceeds the send queue.
    pub fn data_len(&self) -> Option<u64> {
        let bounded = self.send_len <= MAX_QUEUE_BYTES
            && self.recv_len <= MAX_QUEUE_BYTES
            && self.unsent_len <= self.send_len;
        bounded.then(|| u64::from(self.send_len) + u64::from(self.recv_len))
    }
}

/// An inet socket in one line: transport, family, state, addresses,
/// and for an established connection its queued bytes and where its
/// other end is.
impl super::Describe for InetFile {
    fn describe(&self) -> String {
        let proto = match InetProtocol::try_from(self.protocol) {
            Ok(InetProtocol::Tcp) => "tcp",
            Ok(InetProtocol::Udp) => "udp",
            Ok(InetProtocol::Udplite) => "udplite",
            Ok(InetProtocol::Ping) => "ping",
            Ok(InetProtocol::Raw) => "raw",
            _ => "?",
        };
        let family = match InetFamily::try_from(self.family) {
            Ok(InetFamily::Ipv4) => "4",
            Ok(InetFamily::Ipv6) => "6",
            _ => "?",
        };
        let state = match InetState::try_from(self.state) {
            Ok(InetState::Listen) if self.pending > 0 => format!(
                "listen backlog {} ({} not accepted yet)",
                self.backlog, self.pending
            ),
            Ok(InetState::Listen) => format!("listen backlog {}", self.backlog),
            Ok(InetState::Connected) if let Some(t) = &self.tcp => t.state_name().into(),
            Ok(InetState::Connected) if self.pmix.is_some() => "PMIx server link".into(),
            Ok(InetState::Connected) => "connected".into(),
            Ok(InetState::Connecting) => "connecting (SYN_SENT)".into(),
            Ok(InetState::Closed) if self.local.is_some() => "bound".into(),
            Ok(InetState::Closed) => "unbound".into(),
            _ => "?".into(),
        };
        let mut s = format!("{proto}{family} {state}");
        if self.protocol == InetProtocol::Raw as i32 {
            s.push_str(&format!(" protocol {}", self.raw_protocol));
        }
        if let Some(l) = &self.local {
            s.push_str(&format!(" {l}"));
        }
        if let Some(p) = &self.peer {
            s.push_str(&format!(" -> {p}"));
        }
        match (self.shut_rd, self.shut_wr) {
            (true, true) => s.push_str(" shut down"),
            (true, false) => s.push_str(" shut down for reading"),
            (false, true) => s.push_str(" shut down for writing"),
            (false, false) => {}
        }
        if let Some(l) = &self.pmix {
            s.push_str(&format!(" rank {} of {}", l.rank, l.nspace));
        }
        if let Some(t) = &self.tcp {
            s.push_str(&format!(
                " send queue {} ({} unsent) receive queue {} peer {}",
                t.send_len,
                t.unsent_len,
                t.recv_len,
                if t.peer_file_id == 0 {
                    "outside the tree".to_string()
                } else {
                    format!("file {}", t.peer_file_id)
                }
            ));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_malformed_ones_are_refused() {
        for s in ["127.0.0.1:80", "[::1]:65535", "[fe80::1%3]:9"] {
            let a: SocketAddr = s.parse().unwrap();
            assert_eq!(InetAddr::from_socket_addr(&a).to_socket_addr(), Some(a));
        }
        let bad_len = InetAddr {
            addr: vec![1, 2, 3],
            port: 1,
            scope_id: 0,
        };
        assert_eq!(bad_len.to_socket_addr(), None);
        let bad_port = InetAddr {
            addr: vec![127, 0, 0, 1],
            port: 70000,
            scope_id: 0,
        };
        assert_eq!(bad_port.to_socket_addr(), None);
    }

    #[test]
    fn queue_lengths_are_bounded() {
        let ok = TcpConnection {
            send_len: 10,
            unsent_len: 4,
            recv_len: 5,
            ..Default::default()
        };
        assert_eq!(ok.data_len(), Some(15));
        let unsent_too_long = TcpConnection {
            send_len: 1,
            unsent_len: 2,
            ..Default::default()
        };
        assert_eq!(unsent_too_long.data_len(), None);
        let huge = TcpConnection {
            recv_len: u32::MAX,
            ..Default::default()
        };
        assert_eq!(huge.data_len(), None);
    }
}
