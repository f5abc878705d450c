//! TCP sockets whose connect(2) is under way (SYN_SENT).
//!
//! Such a socket cannot enter repair mode (the kernel allows it only
//! closed or established) and has exchanged no byte: all it holds is its
//! local address and the peer it is connecting to, which getpeername
//! does not tell before the handshake is done. The kernel's table of the
//! process's network namespace (`/proc/PID/net/tcp`, `tcp6`) does, found
//! by the socket's inode. The restore connects anew (a new SYN, as a
//! retransmission would be), and the program sees its connect complete
//! when the peer answers.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use ckpt_image::fd::inet::InetFamily;

use crate::error::{DumpError, Result};
use crate::procfile;

/// The peer the SYN_SENT socket with inode `ino` of process `pid` is
/// connecting to, or `None` when the table has no such socket.
pub(super) fn peer(pid: i32, ino: u64, family: InetFamily) -> Result<Option<SocketAddr>> {
    let table = match family {
        InetFamily::Ipv6 => "net/tcp6",
        _ => "net/tcp",
    };
    Ok(entries(pid, table)?
        .into_iter()
        .find(|e| e.inode == ino)
        .map(|e| e.remote))
}

/// One socket of the kernel's table.
pub(super) struct Entry {
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// 0 for a socket no file holds yet (one in an accept queue).
    pub inode: u64,
}

/// The sockets of table `table` (`net/tcp`, `net/tcp6`) of process
/// `pid`'s network namespace.
pub(super) fn entries(pid: i32, table: &str) -> Result<Vec<Entry>> {
    let text = procfile::read(pid, table)?;
    text.lines()
        .skip(1)
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // sl local rem st tx:rx tr:when retrnsmt uid timeout inode ...
            let addr = |i: usize| fields.get(i).and_then(|f| parse_addr(f));
            let inode = fields.get(9).and_then(|f| f.parse::<u64>().ok());
            match (addr(1), addr(2), inode) {
                (Some(local), Some(remote), Some(inode)) => Ok(Entry {
                    local,
                    remote,
                    inode,
                }),
                _ => Err(DumpError::Parse {
                    pid,
                    path: format!("/proc/{pid}/{table}"),
                    what: format!("line {line:?}"),
                }),
            }
        })
        .collect()
}

/// An address of the table: `ADDR:PORT` in hexadecimal, the address as
/// the kernel's 32-bit words in this host's byte order.
fn parse_addr(field: &str) -> Option<SocketAddr> {
    let (addr, port) = field.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Vec<u32> = (0..addr.len() / 8)
        .map(|i| u32::from_str_radix(addr.get(i * 8..i * 8 + 8)?, 16).ok())
        .collect::<Option<_>>()?;
    let octets: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let ip: IpAddr = match octets.len() {
        4 => Ipv4Addr::from(<[u8; 4]>::try_from(octets.as_slice()).ok()?).into(),
        16 => Ipv6Addr::from(<[u8; 16]>::try_from(octets.as_slice()).ok()?).into(),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_addresses_are_read_in_host_order() {
        let v4 = u32::from_ne_bytes([127, 0, 0, 1]);
        let field = format!("{v4:08X}:1F90");
        assert_eq!(parse_addr(&field), Some("127.0.0.1:8080".parse().unwrap()));
        let one = u32::from_ne_bytes([0, 0, 0, 1]);
        let field = format!("000000000000000000000000{one:08X}:0050");
        assert_eq!(parse_addr(&field), Some("[::1]:80".parse().unwrap()));
        assert_eq!(parse_addr("0100007F"), None);
        assert_eq!(parse_addr("0100007F:XYZ0"), None);
    }
}
