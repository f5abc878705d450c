//! Admission of connections that have not authenticated yet.
//!
//! Anyone who can reach the port can open connections, and each one costs the coordinator
//! a file descriptor and, once read, buffers. Authenticated peers (agents, relays, control
//! clients) are not limited here; unauthenticated ones are capped per source and in total.
//! A connection over a cap evicts the oldest unauthenticated connection of the same source
//! (or, for the total cap, the oldest of all), so a flood only ever displaces the flood's
//! own earlier connections and a genuine agent, whose handshake takes one round trip, gets
//! through however long the flood lasts. Connections accepted in the same batch are never
//! evicted by each other (none of them has had a chance to speak yet): the newcomer is
//! closed instead. This module decides; `server/accept.rs` closes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::Instant;

use crate::addr::PeerAddr;
use crate::kv::ConnId;

/// Default cap on unauthenticated connections from one source. A node runs one agent
/// (a relay node: a few dozen local agents, which retry when closed); more pending
/// handshakes than this from one address is a flood or a bug.
pub const DEFAULT_MAX_PENDING_PER_SOURCE: usize = 32;
/// Default cap on unauthenticated connections in total (further lowered to fit the
/// descriptor limit, see [`ConnLimits`]). Handshakes take a round trip, so this many in
/// flight admits thousands of agents per second.
pub const DEFAULT_MAX_PENDING: usize = 1024;

/// Caps on connections that have not authenticated yet (see `docs/coord.md`, "Resource
/// limits and hostile clients").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    /// Unauthenticated connections from one source (an IPv4 address or an IPv6 /64).
    pub max_pending_per_source: usize,
    /// Unauthenticated connections in total. The coordinator lowers it further so that
    /// these plus `expect` authenticated peers plus some control clients fit under the
    /// descriptor limit.
    pub max_pending: usize,
    /// The descriptor limit to plan for; `None` reads the process's `RLIMIT_NOFILE`.
    pub fd_limit: Option<u64>,
}

impl Default for ConnLimits {
    fn default() -> ConnLimits {
        ConnLimits {
            max_pending_per_source: DEFAULT_MAX_PENDING_PER_SOURCE,
            max_pending: DEFAULT_MAX_PENDING,
            fd_limit: None,
        }
    }
}

/// Where a connection comes from, for the per-source cap. IPv6 hosts usually own a whole
/// /64, so that is one source; IPv4-mapped IPv6 addresses count as their IPv4 address.
/// Peers on the Unix socket count by user: all of one uid's connections are one source,
/// as all of one host's are over TCP (they get no more room than a TCP host).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Source {
    V4(u32),
    V6Prefix(u64),
    LocalUser(u32),
}

impl From<PeerAddr> for Source {
    fn from(a: PeerAddr) -> Source {
        match a {
            PeerAddr::Tcp(a) => Source::from(a.ip()),
            PeerAddr::Unix { uid, .. } => Source::LocalUser(uid),
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::V4(a) => write!(f, "{}", std::net::Ipv4Addr::from_bits(*a)),
            Source::V6Prefix(p) => write!(
                f,
                "{}/64",
                std::net::Ipv6Addr::from_bits(u128::from(*p) << 64)
            ),
            Source::LocalUser(uid) => write!(f, "local uid {uid}"),
        }
    }
}

impl From<IpAddr> for Source {
    fn from(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V4(a) => Source::V4(a.to_bits()),
            // The upper 64 bits: the network prefix.
            IpAddr::V6(a) => Source::V6Prefix((a.to_bits() >> 64) as u64),
        }
    }
}

/// Which cap a new connection hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cap {
    /// `max_pending_per_source`.
    Source,
    /// `max_pending`.
    Total,
}

/// What to do with a newly accepted connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Room for it.
    Admit,
    /// Close `victim` (an older unauthenticated connection), then admit.
    Evict {
        /// The connection to close.
        victim: ConnId,
        /// The cap that was hit.
        cap: Cap,
    },
    /// Close the new connection at once.
    Shed(Cap),
}

#[derive(Debug)]
struct Pending {
    id: ConnId,
    source: Source,
    since: Instant,
    batch: u64,
}

/// The unauthenticated connections, oldest first (by connection serial, which only grows).
#[derive(Debug)]
pub(crate) struct Admission {
    per_source: usize,
    total: usize,
    by_age: BTreeMap<u64, Pending>,
    by_source: HashMap<Source, BTreeSet<u64>>,
}

impl Admission {
    /// Caps of `per_source` and `total` (each at least 1).
    pub(crate) fn new(per_source: usize, total: usize) -> Admission {
        let total = total.max(1);
        Admission {
            per_source: per_source.clamp(1, total),
            total,
            by_age: BTreeMap::new(),
            by_source: HashMap::new(),
        }
    }

    /// The effective caps: (per source, total).
    pub(crate) fn caps(&self) -> (usize, usize) {
        (self.per_source, self.total)
    }

    /// Unauthenticated connections held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_age.len()
    }

    /// Decides about a connection from `source` accepted in accept batch `batch`.
    pub(crate) fn check(&self, source: Source, batch: u64) -> Verdict {
        let same = self.by_source.get(&source);
        if same.map_or(0, |s| s.len()) >= self.per_source {
            return self.evict_or_shed(same.and_then(|s| s.first()), batch, Cap::Source);
        }
        if self.by_age.len() >= self.total {
            return self.evict_or_shed(self.by_age.keys().next(), batch, Cap::Total);
        }
        Verdict::Admit
    }

    fn evict_or_shed(&self, oldest: Option<&u64>, batch: u64, cap: Cap) -> Verdict {
        match oldest.and_then(|serial| self.by_age.get(serial)) {
            Some(p) if p.batch < batch => Verdict::Evict { victim: p.id, cap },
            _ => Verdict::Shed(cap),
        }
    }

    /// Records an admitted connection.
    pub(crate) fn insert(&mut self, id: ConnId, source: Source, since: Instant, batch: u64) {
        self.by_source.entry(source).or_default().insert(id.serial);
        self.by_age.insert(
            id.serial,
            Pending {
                id,
                source,
                since,
                batch,
            },
        );
    }

    /// Forgets a connection (authenticated or closed); false if it was not pending.
    pub(crate) fn remove(&mut self, id: ConnId) -> bool {
        let Some(p) = self.by_age.remove(&id.serial) else {
            return false;
        };
        if let Some(set) = self.by_source.get_mut(&p.source) {
            set.remove(&id.serial);
            if set.is_empty() {
                self.by_source.remove(&p.source);
            }
        }
        true
    }

    /// The oldest unauthenticated connection and when it was accepted: the next one whose
    /// handshake time runs out.
    pub(crate) fn oldest(&self) -> Option<(ConnId, Instant)> {
        self.by_age.values().next().map(|p| (p.id, p.since))
    }

    /// The oldest unauthenticated connection accepted before batch `batch`, to close when
    /// the descriptors run out.
    pub(crate) fn evictable(&self, batch: u64) -> Option<ConnId> {
        self.by_age
            .values()
            .next()
            .filter(|p| p.batch < batch)
            .map(|p| p.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(serial: u64) -> ConnId {
        ConnId {
            token: serial as usize + 3,
            serial,
        }
    }

    fn src(last: u8) -> Source {
        Source::from(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn per_source_cap_evicts_that_sources_oldest_only() {
        let now = Instant::now();
        let mut a = Admission::new(2, 10);
        a.insert(id(1), src(9), now, 1);
        a.insert(id(2), src(1), now, 1);
        a.insert(id(3), src(1), now, 1);
        // Same batch: nobody has spoken yet, the newcomer goes.
        assert_eq!(a.check(src(1), 1), Verdict::Shed(Cap::Source));
        // A later batch evicts the source's oldest, not the older one of another source.
        assert_eq!(
            a.check(src(1), 2),
            Verdict::Evict {
                victim: id(2),
                cap: Cap::Source
            }
        );
        assert_eq!(a.check(src(2), 2), Verdict::Admit);
    }

    #[test]
    fn total_cap_evicts_the_oldest_and_removal_frees_room() {
        let now = Instant::now();
        let mut a = Admission::new(5, 3);
        for s in 1..=3 {
            a.insert(id(s), src(s as u8), now, s);
        }
        assert_eq!(
            a.check(src(7), 4),
            Verdict::Evict {
                victim: id(1),
                cap: Cap::Total
            }
        );
        assert!(a.remove(id(1)));
        assert!(!a.remove(id(1)));
        assert_eq!(a.check(src(7), 4), Verdict::Admit);
        assert_eq!(a.oldest().map(|(i, _)| i), Some(id(2)));
        assert_eq!(a.evictable(2), None);
        assert_eq!(a.evictable(3), Some(id(2)));
        assert_eq!(a.len(), 2);
    }

    #[test]
    fn sources_are_v4_addresses_and_v6_prefixes() {
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        assert_eq!(Source::from(mapped), src(1));
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(Source::from(a), Source::from(b));
        assert_ne!(Source::from(a), Source::from(c));
    }

    #[test]
    fn caps_are_at_least_one_and_per_source_within_total() {
        assert_eq!(Admission::new(0, 0).caps(), (1, 1));
        assert_eq!(Admission::new(50, 20).caps(), (20, 20));
    }
}
