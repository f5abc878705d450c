//! Coordinator addresses: a TCP `host:port` or a Unix stream socket `unix:PATH`.
//!
//! A node-level sub-coordinator's agents run on its own node, so they may reach it over a
//! Unix stream socket instead of loopback TCP (no TCP state machine, no pure ACK segments:
//! about 40 % less CPU per message, see `docs/coord.md` "Benchmark"). Nothing else
//! changes with the transport: the same handshake, secret, caps and eviction rules apply.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

/// The prefix that makes an address a Unix socket path (`unix:/run/ckpt/J.sock`).
pub const UNIX_PREFIX: &str = "unix:";

/// A connected stream socket over either transport. Generic over the two socket types so
/// the blocking client (`std::net`) and the coordinator's event loop (`mio::net`) share
/// one byte path; an enum, not a trait object, because every read and write in the
/// coordinator's hot loop goes through it.
#[derive(Debug)]
pub enum Stream<T, U> {
    /// TCP.
    Tcp(T),
    /// Unix stream socket.
    Unix(U),
}

impl<T: Read, U: Read> Read for Stream<T, U> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl<T: Write, U: Write> Write for Stream<T, U> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        // Sockets buffer nothing on our side: a written byte is already the kernel's.
        Ok(())
    }
}

/// Where a coordinator listens, as a client reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A TCP address (resolved).
    Tcp(SocketAddr),
    /// The path of a Unix stream socket on this node.
    Unix(PathBuf),
}

impl Endpoint {
    /// Parses `unix:PATH` (an absolute path) or resolves `host:port` to its first address.
    pub fn resolve(s: &str) -> io::Result<Endpoint> {
        if let Some(path) = s.strip_prefix(UNIX_PREFIX) {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "a unix: coordinator address needs an absolute path",
                ));
            }
            return Ok(Endpoint::Unix(path));
        }
        s.to_socket_addrs()?
            .next()
            .map(Endpoint::Tcp)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address"))
    }

    /// True for `unix:PATH` addresses (which need no name resolution).
    pub fn is_unix(s: &str) -> bool {
        s.starts_with(UNIX_PREFIX)
    }
}

impl From<SocketAddr> for Endpoint {
    fn from(a: SocketAddr) -> Endpoint {
        Endpoint::Tcp(a)
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Tcp(a) => write!(f, "{a}"),
            Endpoint::Unix(p) => write!(f, "{UNIX_PREFIX}{}", p.display()),
        }
    }
}

/// Who is at the other end of an accepted connection, for logs, abort reasons and the
/// per-source cap on unauthenticated connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerAddr {
    /// A TCP peer.
    Tcp(SocketAddr),
    /// A peer on the Unix socket, known by the credentials the kernel recorded when it
    /// connected (`SO_PEERCRED`): unforgeable, unlike anything the peer says.
    Unix {
        /// Its process id (in our pid namespace; 0 if it is not visible there).
        pid: i32,
        /// Its user id.
        uid: u32,
    },
}

impl From<SocketAddr> for PeerAddr {
    fn from(a: SocketAddr) -> PeerAddr {
        PeerAddr::Tcp(a)
    }
}

impl fmt::Display for PeerAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerAddr::Tcp(a) => write!(f, "{a}"),
            PeerAddr::Unix { pid, uid } => write!(f, "unix peer pid {pid} uid {uid}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_and_tcp_addresses_parse() {
        assert_eq!(
            Endpoint::resolve("unix:/run/c.sock").unwrap(),
            Endpoint::Unix(PathBuf::from("/run/c.sock"))
        );
        assert!(Endpoint::resolve("unix:rel.sock").is_err());
        let tcp = Endpoint::resolve("127.0.0.1:7420").unwrap();
        assert_eq!(tcp, Endpoint::Tcp("127.0.0.1:7420".parse().unwrap()));
        assert_eq!(tcp.to_string(), "127.0.0.1:7420");
        assert_eq!(
            Endpoint::Unix("/a/b".into()).to_string(),
            "unix:/a/b".to_string()
        );
    }
}
