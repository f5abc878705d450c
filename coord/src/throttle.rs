//! Rate limit for log lines a hostile or overloaded network can produce at will.
//!
//! A flood of connections must not become a flood of log lines (disk, journald and the
//! operator's attention are resources too). Each kind of condition logs its first line at
//! once; further lines of that kind within the interval are only counted, and when the
//! interval is over one line reports the last of them with the count.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A repeatable condition caused from outside, logged at most once per interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Noise {
    /// `accept` failed for a reason other than running out of descriptors.
    AcceptFailed,
    /// Out of file descriptors: a pending connection was shed or evicted.
    FdExhausted,
    /// A connection was closed at accept because a cap on unauthenticated ones was hit.
    OverCap,
    /// An unauthenticated connection did not finish the handshake in time.
    HandshakeTimeout,
    /// An unauthenticated connection was dropped (protocol error, too much data).
    Dropped,
    /// A handshake was refused (wrong job or version, failed authentication, a message
    /// out of order).
    Refused,
}

#[derive(Debug)]
struct Window {
    start: Instant,
    /// Lines counted but not logged since `start`.
    suppressed: u64,
    /// The most recent of them, reported with the count.
    last: String,
}

/// Per-[`Noise`] windows.
#[derive(Debug)]
pub(crate) struct LogThrottle {
    interval: Duration,
    windows: HashMap<Noise, Window>,
}

impl LogThrottle {
    /// At most one line per kind per `interval`.
    pub(crate) fn new(interval: Duration) -> LogThrottle {
        LogThrottle {
            interval,
            windows: HashMap::new(),
        }
    }

    /// Offers one line; returns the lines to log now (none while the kind is throttled).
    pub(crate) fn note(&mut self, kind: Noise, now: Instant, line: String) -> Vec<String> {
        let mut out = Vec::new();
        self.expire(kind, now, &mut out);
        match self.windows.get_mut(&kind) {
            Some(w) => {
                w.suppressed += 1;
                w.last = line;
            }
            None => {
                self.windows.insert(
                    kind,
                    Window {
                        start: now,
                        suppressed: 0,
                        last: String::new(),
                    },
                );
                out.push(line);
            }
        }
        out
    }

    /// The summaries of every window that is over; call it regularly so a burst that
    /// stopped is still reported.
    pub(crate) fn flush(&mut self, now: Instant) -> Vec<String> {
        let mut out = Vec::new();
        let kinds: Vec<Noise> = self.windows.keys().copied().collect();
        for kind in kinds {
            self.expire(kind, now, &mut out);
        }
        out
    }

    /// Ends `kind`'s window if its interval has passed: a window that suppressed lines is
    /// summarised and a new one starts (so a steady flood gives one line per interval); a
    /// quiet one is dropped, so the next line of that kind is logged at once.
    fn expire(&mut self, kind: Noise, now: Instant, out: &mut Vec<String>) {
        let Some(w) = self.windows.get_mut(&kind) else {
            return;
        };
        let age = now.saturating_duration_since(w.start);
        if age < self.interval {
            return;
        }
        if w.suppressed == 0 {
            self.windows.remove(&kind);
            return;
        }
        let last = std::mem::take(&mut w.last);
        out.push(match w.suppressed - 1 {
            0 => last,
            more => format!(
                "{last} ({more} more in the last {:.0} s)",
                age.as_secs_f64()
            ),
        });
        w.start = now;
        w.suppressed = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: Duration = Duration::from_secs(1);

    #[test]
    fn a_flood_gives_one_line_then_one_summary_per_interval() {
        let t0 = Instant::now();
        let mut t = LogThrottle::new(SEC);
        let mut logged = Vec::new();
        for i in 0..1000u64 {
            let now = t0 + Duration::from_millis(i);
            logged.extend(t.note(Noise::OverCap, now, format!("shed {i}")));
            logged.extend(t.flush(now));
        }
        assert_eq!(logged, vec!["shed 0".to_string()]);
        logged.extend(t.flush(t0 + SEC));
        assert_eq!(logged[1], "shed 999 (998 more in the last 1 s)");
        // Quiet for an interval: the kind logs at once again.
        assert!(t.flush(t0 + 2 * SEC).is_empty());
        assert_eq!(
            t.note(Noise::OverCap, t0 + 3 * SEC, "again".into()),
            vec!["again".to_string()]
        );
    }

    #[test]
    fn kinds_are_throttled_separately() {
        let t0 = Instant::now();
        let mut t = LogThrottle::new(SEC);
        assert_eq!(t.note(Noise::Refused, t0, "a".into()).len(), 1);
        assert_eq!(t.note(Noise::Refused, t0, "b".into()).len(), 0);
        assert_eq!(t.note(Noise::HandshakeTimeout, t0, "c".into()).len(), 1);
        // One suppressed line is reported as itself, without a count.
        assert_eq!(
            t.note(Noise::Refused, t0 + SEC, "d".into()),
            vec!["b".to_string()]
        );
    }
}
