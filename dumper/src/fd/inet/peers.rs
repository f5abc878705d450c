//! Where a connected ICMP ping or raw socket sends: getpeername only
//! answers for a nonzero port, which such a socket connected the usual
//! way (port 0) has not, so the peer is read from the kernel's table of
//! those sockets in the process's network namespace (`/proc/PID/net/icmp`,
//! `icmp6`, `raw`, `raw6`), found by inode.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::error::Result;
use crate::procfile;

/// `sk_state` of a connected datagram socket.
const TCP_ESTABLISHED: u8 = 1;

/// The address socket `ino` of process `pid` is connected to (`None`
/// when it is not), from table `net/NAME` (`icmp`, `icmp6`, `raw`, `raw6`).
pub fn peer(pid: i32, table: &str, ino: u64) -> Result<Option<SocketAddr>> {
    let table = procfile::read(pid, &format!("net/{table}"))?;
    Ok(table.lines().skip(1).find_map(|l| connected_to(l, ino)))
}

/// The peer of a table line of socket `ino` in the connected state.
fn connected_to(line: &str, ino: u64) -> Option<SocketAddr> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.get(9)?.parse::<u64>().ok()? != ino {
        return None;
    }
    if u8::from_str_radix(f.get(3)?, 16).ok()? != TCP_ESTABLISHED {
        return None;
    }
    let (addr, port) = f.get(2)?.split_once(':')?;
    Some(SocketAddr::new(
        ip(addr)?,
        u16::from_str_radix(port, 16).ok()?,
    ))
}

/// An address as the table prints it: each 32-bit word of the address in
/// network order, printed as a native integer.
fn ip(hex: &str) -> Option<IpAddr> {
    let word = |i: usize| {
        hex.get(i * 8..i * 8 + 8)
            .and_then(|w| u32::from_str_radix(w, 16).ok())
            .map(u32::to_ne_bytes)
    };
    match hex.len() {
        8 => Some(Ipv4Addr::from(word(0)?).into()),
        32 => {
            let mut b = [0u8; 16];
            for i in 0..4 {
                b[i * 4..i * 4 + 4].copy_from_slice(&word(i)?);
            }
            Some(Ipv6Addr::from(b).into())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connected_lines_give_their_peer_and_others_none() {
        let lo = u32::from_ne_bytes([127, 0, 0, 1]);
        let v4 = format!(
            "   12: {lo:08X}:0457 {lo:08X}:0000 01 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 0"
        );
        assert_eq!(
            connected_to(&v4, 4242),
            Some("127.0.0.1:0".parse().unwrap())
        );
        assert_eq!(connected_to(&v4, 4243), None);
        let closed = v4.replacen(" 01 ", " 07 ", 1);
        assert_eq!(connected_to(&closed, 4242), None);
        let one = u32::from_ne_bytes([0, 0, 0, 1]);
        let v6 = format!(
            "    3: 00000000000000000000000000000000:0001 000000000000000000000000{one:08X}:0000 01 00000000:00000000 00:00000000 00000000     0        0 77 2 0000000000000000 0"
        );
        assert_eq!(connected_to(&v6, 77), Some("[::1]:0".parse().unwrap()));
    }
}
