//! POSIX timers of a process (`Core::posix_timers`).
//!
//! The message is defined in `image/proto/timer.proto`.

pub use crate::pb::PosixTimer;

/// `SIGEV_THREAD_ID`: the timer signals one thread (`target`).
pub const SIGEV_THREAD_ID: i32 = 4;

/// Names of the notification kinds, by `sigev_notify` without
/// `SIGEV_THREAD_ID` (the values are the same on every Linux architecture;
/// kept here so the format crate needs no libc).
const NOTIFY_NAMES: &[&str] = &["signal", "none", "thread"];

impl PosixTimer {
    /// The timer in one line, as `ckpt show` prints it.
    pub fn describe(&self) -> String {
        let notify = NOTIFY_NAMES
            .get((self.sigev_notify & !SIGEV_THREAD_ID) as usize)
            .copied()
            .unwrap_or("unknown");
        let to = if self.sigev_notify & SIGEV_THREAD_ID != 0 {
            format!(" to thread {}", self.target)
        } else {
            String::new()
        };
        format!(
            "timer {} clock {} notify {notify} signo {} value {:#x}{to}, next in {} ns, every {} ns",
            self.id, self.clockid, self.signo, self.sigev_value, self.value_ns, self.interval_ns
        )
    }
}
