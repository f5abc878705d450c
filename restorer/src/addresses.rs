//! Restoring a node's part of a job where its addresses changed: the part
//! moved to another node, or its network namespace was recreated with
//! other addresses. Every inet socket comes back on the mapped addresses
//! (bound, listening, connected; an established connection keeps its
//! sequence numbers and queues, only its address pair changes), so a job
//! whose processes all moved together keeps its connections: both ends of
//! each connection are rebuilt with the same map.
//!
//! The map comes from the operator (`ckpt restore --map-address`) or from
//! the coordinated restart's address exchange; never from the image.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};

use ckpt_image::fd::Files;
use ckpt_image::fd::file::Kind;

/// Old address → the address to use instead.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressMap {
    moves: BTreeMap<IpAddr, IpAddr>,
}

/// Two different new addresses for one old address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("address {old} is mapped both to {first} and to {second}")]
pub struct AddressConflict {
    /// The dumped address.
    pub old: IpAddr,
    /// The mapping already known.
    pub first: IpAddr,
    /// The one that contradicts it.
    pub second: IpAddr,
}

impl AddressMap {
    /// An empty map: every address stays as dumped.
    pub fn new() -> AddressMap {
        AddressMap::default()
    }

    /// Maps `old` to `new`; the same pair twice is fine, a different `new`
    /// for a mapped `old` is a conflict. Mapping an address to an address
    /// of the other family is refused the same way (a socket cannot change
    /// family).
    pub fn insert(&mut self, old: IpAddr, new: IpAddr) -> Result<(), AddressConflict> {
        if old.is_ipv4() != new.is_ipv4() {
            return Err(AddressConflict {
                old,
                first: old,
                second: new,
            });
        }
        match self.moves.insert(old, new) {
            Some(first) if first != new => {
                self.moves.insert(old, first);
                Err(AddressConflict {
                    old,
                    first,
                    second: new,
                })
            }
            _ => Ok(()),
        }
    }

    /// Adds every pair of `other`.
    pub fn merge(&mut self, other: &AddressMap) -> Result<(), AddressConflict> {
        for (&old, &new) in &other.moves {
            self.insert(old, new)?;
        }
        Ok(())
    }

    /// True when nothing moves.
    pub fn is_empty(&self) -> bool {
        self.moves.iter().all(|(old, new)| old == new)
    }

    /// The pairs, old address first.
    pub fn iter(&self) -> impl Iterator<Item = (IpAddr, IpAddr)> + '_ {
        self.moves.iter().map(|(&o, &n)| (o, n))
    }

    /// `a` with its address mapped (port and scope kept).
    pub fn apply(&self, a: SocketAddr) -> SocketAddr {
        match self.moves.get(&a.ip()) {
            Some(&new) => SocketAddr::new(new, a.port()),
            None => a,
        }
    }
}

/// The addresses the checkpoint's inet sockets were bound to on their node:
/// what the node was reachable at. Loopback, unspecified and link-local
/// addresses are left out (they are the same on every node, or mean
/// nothing elsewhere).
pub fn node_addresses(files: &Files) -> BTreeSet<IpAddr> {
    files
        .files
        .iter()
        .filter_map(|f| match &f.kind {
            Some(Kind::Inet(i)) => i.local.as_ref().and_then(|a| a.to_socket_addr()),
            _ => None,
        })
        .map(|a| a.ip())
        .filter(|ip| !ip.is_loopback() && !ip.is_unspecified() && !is_link_local(ip))
        .collect()
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.segments()[0] & 0xffc0 == 0xfe80,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn mapped_addresses_keep_their_ports_and_others_stay() {
        let mut m = AddressMap::new();
        m.insert(ip("10.0.0.1"), ip("10.0.0.2")).unwrap();
        m.insert(ip("10.0.0.2"), ip("10.0.0.1")).unwrap();
        assert_eq!(
            m.apply("10.0.0.1:80".parse().unwrap()),
            "10.0.0.2:80".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(
            m.apply("10.0.0.2:5".parse().unwrap()),
            "10.0.0.1:5".parse::<SocketAddr>().unwrap()
        );
        let outside: SocketAddr = "192.168.1.1:22".parse().unwrap();
        assert_eq!(m.apply(outside), outside);
        assert!(!m.is_empty());
    }

    #[test]
    fn contradicting_and_cross_family_pairs_are_refused() {
        let mut m = AddressMap::new();
        m.insert(ip("10.0.0.1"), ip("10.0.0.2")).unwrap();
        m.insert(ip("10.0.0.1"), ip("10.0.0.2")).unwrap();
        let e = m.insert(ip("10.0.0.1"), ip("10.0.0.3")).unwrap_err();
        assert_eq!(e.first, ip("10.0.0.2"));
        assert_eq!(m.apply("10.0.0.1:1".parse().unwrap()).ip(), ip("10.0.0.2"));
        assert!(m.insert(ip("10.0.0.4"), ip("::1")).is_err());
    }

    #[test]
    fn an_identity_map_moves_nothing() {
        let mut m = AddressMap::new();
        m.insert(ip("10.0.0.1"), ip("10.0.0.1")).unwrap();
        assert!(m.is_empty());
    }
}
