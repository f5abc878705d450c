//! Key/value exchange for the restart PUBLISH/SUBSCRIBE phases.
//!
//! The root holds the authoritative map; a sub-coordinator keeps the same structure as a
//! cache of what its agents published or fetched, so repeated gets for one key cost a
//! single upstream request. A get for a missing key parks a waiter until the key is put or
//! the waiter's deadline passes; the answer for a timed-out key is `None`.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Instant;

/// Identifies a connection across token reuse: a reply for a closed connection whose
/// token was handed to a new one must not reach the newcomer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId {
    /// Poll token index.
    pub token: usize,
    /// Unique serial of the connection.
    pub serial: u64,
}

/// Values and parked gets.
#[derive(Debug, Default)]
pub struct KvStore {
    values: HashMap<String, Vec<u8>>,
    waiters: HashMap<String, Vec<u64>>,
    info: HashMap<u64, (ConnId, String, Instant)>,
    deadlines: BinaryHeap<Reverse<(Instant, u64)>>,
    next_id: u64,
}

impl KvStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets everything (a new round starts from an empty map).
    pub fn clear(&mut self) {
        *self = KvStore::default();
    }

    /// Number of stored keys.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// True when no key is stored.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Stores a pair; returns the waiters it satisfies.
    pub fn put(&mut self, key: String, value: Vec<u8>) -> Vec<(ConnId, String, Vec<u8>)> {
        let mut out = Vec::new();
        if let Some(ids) = self.waiters.remove(&key) {
            for id in ids {
                if let Some((conn, k, _)) = self.info.remove(&id) {
                    out.push((conn, k, value.clone()));
                }
            }
        }
        self.values.insert(key, value);
        out
    }

    /// The value if present, else parks a waiter until `deadline`.
    pub fn get(&mut self, conn: ConnId, key: &str, deadline: Instant) -> Option<Vec<u8>> {
        if let Some(v) = self.values.get(key) {
            return Some(v.clone());
        }
        let id = self.next_id;
        self.next_id += 1;
        self.waiters.entry(key.to_string()).or_default().push(id);
        self.info.insert(id, (conn, key.to_string(), deadline));
        self.deadlines.push(Reverse((deadline, id)));
        None
    }

    /// True if somebody waits for `key`.
    pub fn is_awaited(&self, key: &str) -> bool {
        self.waiters.contains_key(key)
    }

    /// Latest deadline among the waiters for `key`.
    pub fn latest_deadline(&self, key: &str) -> Option<Instant> {
        self.waiters
            .get(key)?
            .iter()
            .filter_map(|id| self.info.get(id).map(|i| i.2))
            .max()
    }

    /// Removes and returns waiters whose deadline is at or before `now`.
    pub fn expire(&mut self, now: Instant) -> Vec<(ConnId, String)> {
        let mut out = Vec::new();
        while let Some(Reverse((d, id))) = self.deadlines.peek().copied() {
            if d > now {
                break;
            }
            self.deadlines.pop();
            if let Some((conn, key, _)) = self.info.remove(&id) {
                if let Some(list) = self.waiters.get_mut(&key) {
                    list.retain(|x| *x != id);
                    if list.is_empty() {
                        self.waiters.remove(&key);
                    }
                }
                out.push((conn, key));
            }
        }
        out
    }

    /// Removes and returns the waiters for `key` whose deadline is at or before `by`.
    pub fn expire_key(&mut self, key: &str, by: Instant) -> Vec<ConnId> {
        let Some(list) = self.waiters.get_mut(key) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let info = &mut self.info;
        list.retain(|id| match info.get(id) {
            Some((conn, _, d)) if *d <= by => {
                out.push(*conn);
                info.remove(id);
                false
            }
            Some(_) => true,
            None => false,
        });
        if list.is_empty() {
            self.waiters.remove(key);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn waiters_are_answered_or_expire() {
        let mut kv = KvStore::new();
        let c = ConnId {
            token: 1,
            serial: 1,
        };
        let now = Instant::now();
        assert_eq!(kv.get(c, "a", now + Duration::from_secs(5)), None);
        assert_eq!(kv.get(c, "b", now), None);
        assert_eq!(kv.expire(now), vec![(c, "b".to_string())]);
        let done = kv.put("a".into(), vec![1]);
        assert_eq!(done, vec![(c, "a".to_string(), vec![1])]);
        assert_eq!(kv.get(c, "a", now), Some(vec![1]));
        assert!(kv.expire(now + Duration::from_secs(10)).is_empty());
    }
}
