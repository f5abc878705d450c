//! The peer's FIN of a CLOSE_WAIT connection to outside the tree.
//!
//! Repair mode rebuilds queues and sequence numbers but cannot mark a FIN
//! as received, and a peer outside the tree, which had its FIN
//! acknowledged long ago, never sends it again. So the restore hands the
//! rebuilt socket (still in repair mode, which processes incoming
//! segments as usual) the segment the peer had sent: FIN+ACK at the
//! receive sequence, acknowledging what the socket had sent, from the
//! peer's address. It is written whole (IP header included) to a raw
//! socket made in the process's network namespace, and carries
//! [`ckpt_netlock::INJECTED_MARK`] so the network lock lets it pass.

use std::net::{IpAddr, SocketAddr};

/// The segment to give back.
pub(super) struct Fin {
    /// The peer (the segment's source).
    pub from: SocketAddr,
    /// The restored socket (its destination).
    pub to: SocketAddr,
    /// The socket's next expected sequence number (its rcv_nxt).
    pub seq: u32,
    /// The first byte the socket has not seen acknowledged (snd_una).
    pub ack: u32,
    /// The peer's window, already shifted by its window scale.
    pub window: u16,
}

/// IP protocol number of TCP.
const PROTO_TCP: u8 = 6;
/// TCP header length without options.
const TCP_HEADER: usize = 20;
/// TCP flags of the segment.
const FLAG_FIN: u8 = 0x01;
const FLAG_ACK: u8 = 0x10;
/// Hop limit of the segment (it only crosses this host's stack).
const TTL: u8 = 64;

/// An IPv4-mapped IPv6 address travels as IPv4.
fn plain(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(a, IpAddr::V4),
        v4 => v4,
    }
}

/// The whole packet: IP header and TCP header. Returns it with the
/// address to send it to, or `None` when the two addresses are of
/// different families.
pub(super) fn packet(fin: &Fin) -> Option<(Vec<u8>, IpAddr)> {
    let (src, dst) = (plain(fin.from.ip()), plain(fin.to.ip()));
    let mut tcp = Vec::with_capacity(TCP_HEADER);
    tcp.extend_from_slice(&fin.from.port().to_be_bytes());
    tcp.extend_from_slice(&fin.to.port().to_be_bytes());
    tcp.extend_from_slice(&fin.seq.to_be_bytes());
    tcp.extend_from_slice(&fin.ack.to_be_bytes());
    tcp.push(((TCP_HEADER / 4) as u8) << 4);
    tcp.push(FLAG_FIN | FLAG_ACK);
    tcp.extend_from_slice(&fin.window.to_be_bytes());
    tcp.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
    let mut pseudo = Vec::new();
    let mut ip = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&[0, PROTO_TCP]);
            pseudo.extend_from_slice(&(TCP_HEADER as u16).to_be_bytes());
            let total = (20 + TCP_HEADER) as u16;
            ip.extend_from_slice(&[0x45, 0]);
            ip.extend_from_slice(&total.to_be_bytes());
            ip.extend_from_slice(&[0, 0, 0x40, 0, TTL, PROTO_TCP, 0, 0]);
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
            let sum = checksum(&ip);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&(TCP_HEADER as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, PROTO_TCP]);
            ip.extend_from_slice(&[0x60, 0, 0, 0]);
            ip.extend_from_slice(&(TCP_HEADER as u16).to_be_bytes());
            ip.extend_from_slice(&[PROTO_TCP, TTL]);
            ip.extend_from_slice(&s.octets());
            ip.extend_from_slice(&d.octets());
        }
        _ => return None,
    }
    pseudo.extend_from_slice(&tcp);
    let sum = checksum(&pseudo);
    tcp[16..18].copy_from_slice(&sum.to_be_bytes());
    ip.extend_from_slice(&tcp);
    Some((ip, dst))
}

/// The Internet checksum (RFC 1071) of `data`.
fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = data
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packet_sums_to_zero_with_its_checksums() {
        let fin = Fin {
            from: "10.0.0.1:80".parse().unwrap(),
            to: "[::ffff:10.0.0.2]:4000".parse().unwrap(),
            seq: 0xdead_beef,
            ack: 7,
            window: 512,
        };
        let (p, dst) = packet(&fin).expect("one family");
        assert_eq!(dst, "10.0.0.2".parse::<IpAddr>().unwrap());
        assert_eq!(p.len(), 40);
        assert_eq!(checksum(&p[..20]), 0, "IP header checksum");
        let mut pseudo = p[12..20].to_vec();
        pseudo.extend_from_slice(&[0, PROTO_TCP, 0, TCP_HEADER as u8]);
        pseudo.extend_from_slice(&p[20..]);
        assert_eq!(checksum(&pseudo), 0, "TCP checksum");
        assert_eq!(p[33], FLAG_FIN | FLAG_ACK);
    }

    #[test]
    fn mixed_families_make_no_packet() {
        let fin = Fin {
            from: "10.0.0.1:80".parse().unwrap(),
            to: "[::1]:4000".parse().unwrap(),
            seq: 0,
            ack: 0,
            window: 0,
        };
        assert!(packet(&fin).is_none());
    }
}
