//! timerfd objects: clock, settime flags, remaining time, interval and the
//! expirations not read yet, all reported by `/proc/PID/fdinfo` (reading
//! the fd would consume the expirations).
//!
//! fdinfo gives the remaining time relative to now even for an absolute
//! timer, so the timer's clock is read right before fdinfo: an absolute
//! timer's deadline is that reading plus the remaining time.

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::timerfd::{NANOS_PER_SEC, TimerfdFile, TimerfdTime};

use super::{Blobs, FdParams, FileDumper};
use crate::error::{DumpError, Result};
use crate::procfile;

/// `anon_inode:[timerfd]`.
pub struct Timerfd;

/// `settime flags:` bits ckpt restores; any other bit is refused rather
/// than silently dropped.
const KNOWN_SETTIME_FLAGS: u32 = (libc::TFD_TIMER_ABSTIME | libc::TFD_TIMER_CANCEL_ON_SET) as u32;

impl FileDumper for Timerfd {
    fn name(&self) -> &'static str {
        "timerfd"
    }

    fn description(&self) -> &'static str {
        "timerfds: clock, absolute or relative deadline, interval, pending expirations"
    }

    fn claims(&self, p: &FdParams) -> bool {
        p.link == "anon_inode:[timerfd]"
    }

    fn collect(&self, p: &FdParams, _file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        let info_path = format!("fdinfo/{}", p.fd);
        let bad = |what: &str| DumpError::Parse {
            pid: p.pid,
            path: info_path.clone(),
            what: what.into(),
        };
        let clockid: i32 = p
            .info_field("clockid")?
            .parse()
            .map_err(|_| bad("clockid is not a number"))?;
        // A fresh fdinfo, read right after the clock, so the remaining time
        // and the clock reading describe one instant (the one collected
        // with the fd's flags may be some milliseconds old).
        let clock_at_dump = clock_now(clockid).ok_or_else(|| {
            p.unsupported(&format!(
                "timerfd on clock {clockid}, which ckpt cannot read"
            ))
        })?;
        let info = procfile::read(p.pid, &info_path)?;
        let field = |key: &str| {
            procfile::status_field(&info, key).ok_or_else(|| bad(&format!("no {key} field")))
        };
        let ticks = field("ticks")?
            .parse()
            .map_err(|_| bad("ticks is not a number"))?;
        let settime = u32::from_str_radix(field("settime flags")?, 8)
            .map_err(|_| bad("settime flags is not an octal number"))?;
        if settime & !KNOWN_SETTIME_FLAGS != 0 {
            return Err(p.unsupported(&format!("timerfd with unknown settime flags {settime:#o}")));
        }
        let value =
            parse_time(field("it_value")?).ok_or_else(|| bad("it_value is not (sec, nsec)"))?;
        let interval = parse_time(field("it_interval")?)
            .ok_or_else(|| bad("it_interval is not (sec, nsec)"))?;
        Ok(Kind::Timerfd(TimerfdFile {
            clockid,
            abstime: settime & libc::TFD_TIMER_ABSTIME as u32 != 0,
            cancel_on_set: settime & libc::TFD_TIMER_CANCEL_ON_SET as u32 != 0,
            value: Some(value),
            interval: Some(interval),
            ticks,
            clock_at_dump: Some(clock_at_dump),
        }))
    }
}

/// Parses fdinfo's `(SEC, NSEC)`.
fn parse_time(s: &str) -> Option<TimerfdTime> {
    let (sec, nsec) = s.strip_prefix('(')?.strip_suffix(')')?.split_once(',')?;
    let t = TimerfdTime {
        sec: sec.trim().parse().ok()?,
        nsec: nsec.trim().parse().ok()?,
    };
    (t.sec >= 0 && (0..NANOS_PER_SEC).contains(&t.nsec)).then_some(t)
}

/// The current time of `clockid`, or `None` if this host cannot read it.
fn clock_now(clockid: i32) -> Option<TimerfdTime> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the
    // call; clock_gettime writes nothing else.
    let rc = unsafe { libc::clock_gettime(clockid, &mut ts) };
    (rc == 0).then_some(TimerfdTime {
        sec: ts.tv_sec,
        nsec: ts.tv_nsec,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fdinfo_times() {
        assert_eq!(
            parse_time("(1, 481478935)"),
            Some(TimerfdTime {
                sec: 1,
                nsec: 481_478_935
            })
        );
        assert_eq!(parse_time("(0, 0)"), Some(TimerfdTime::default()));
        assert_eq!(parse_time("1, 2"), None);
        assert_eq!(parse_time("(0, 1000000000)"), None);
    }
}
