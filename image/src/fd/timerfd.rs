//! timerfd_create(2) objects.
//!
//! The messages are defined in `image/proto/fd_timerfd.proto`.

pub use crate::pb::{TimerfdFile, TimerfdTime};

/// Nanoseconds in a second.
pub const NANOS_PER_SEC: i64 = 1_000_000_000;

/// Clock ids a timerfd can use, by name (the values are the same on every
/// Linux architecture; kept here so the format crate needs no libc).
const CLOCK_NAMES: &[(i32, &str)] = &[
    (0, "realtime"),
    (1, "monotonic"),
    (7, "boottime"),
    (8, "realtime-alarm"),
    (9, "boottime-alarm"),
];

impl TimerfdTime {
    /// Zero: for `value` a disarmed timer, for `interval` a one-shot one.
    pub fn is_zero(&self) -> bool {
        self.sec == 0 && self.nsec == 0
    }

    /// The sum of two times, nanoseconds kept below one second; `None` on
    /// overflow (only a corrupt image gets there).
    pub fn checked_add(&self, other: &TimerfdTime) -> Option<TimerfdTime> {
        let nsec = self.nsec.checked_add(other.nsec)?;
        let sec = self
            .sec
            .checked_add(other.sec)?
            .checked_add(nsec / NANOS_PER_SEC)?;
        Some(TimerfdTime {
            sec,
            nsec: nsec % NANOS_PER_SEC,
        })
    }

    /// Seconds and nanoseconds are in range for `timerfd_settime`.
    pub fn is_valid(&self) -> bool {
        self.sec >= 0 && (0..NANOS_PER_SEC).contains(&self.nsec)
    }
}

impl std::fmt::Display for TimerfdTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{:09}s", self.sec, self.nsec)
    }
}

impl TimerfdFile {
    /// An absolute timer's deadline on its clock: where the clock stood
    /// when the remaining time was read, plus that remaining time.
    pub fn deadline(&self) -> Option<TimerfdTime> {
        let at = self.clock_at_dump.unwrap_or_default();
        at.checked_add(&self.value.unwrap_or_default())
    }

    /// The clock's name, for messages (`clock N` for one ckpt does not know).
    pub fn clock_name(&self) -> String {
        CLOCK_NAMES
            .iter()
            .find(|(id, _)| *id == self.clockid)
            .map_or_else(|| format!("clock {}", self.clockid), |(_, n)| (*n).into())
    }
}

/// A timerfd in one line: clock, how it is armed, pending expirations.
impl super::Describe for TimerfdFile {
    fn describe(&self) -> String {
        let value = self.value.unwrap_or_default();
        let interval = self.interval.unwrap_or_default();
        let armed = if value.is_zero() && interval.is_zero() {
            "disarmed".to_string()
        } else if self.abstime {
            let deadline = self
                .deadline()
                .map_or_else(|| "?".into(), |d| d.to_string());
            format!(
                "deadline {deadline}{}",
                if self.cancel_on_set {
                    " cancel-on-set"
                } else {
                    ""
                }
            )
        } else {
            format!("in {value}")
        };
        let every = if interval.is_zero() {
            String::new()
        } else {
            format!(" every {interval}")
        };
        format!(
            "timerfd {} {armed}{every} ticks {}",
            self.clock_name(),
            self.ticks
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadline_carries_nanoseconds() {
        let t = TimerfdFile {
            clockid: 0,
            abstime: true,
            value: Some(TimerfdTime {
                sec: 2,
                nsec: 600_000_000,
            }),
            clock_at_dump: Some(TimerfdTime {
                sec: 10,
                nsec: 500_000_000,
            }),
            ..Default::default()
        };
        assert_eq!(
            t.deadline(),
            Some(TimerfdTime {
                sec: 13,
                nsec: 100_000_000
            })
        );
        assert_eq!(t.clock_name(), "realtime");
    }
}
