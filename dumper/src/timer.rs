//! POSIX timers (timer_create), dump side: `/proc/PID/timers` lists each
//! timer's id, signal, value, notification and clock; where it stands
//! (time left, period) only the process can ask, so `timer_gettime` runs
//! inside it through the parasite.

use ckpt_image::timer::{PosixTimer, SIGEV_THREAD_ID};
use ckpt_parasite::Infection;

use crate::error::{DumpError, Result};
use crate::procfile;

/// `CLOCK_THREAD_CPUTIME_ID`: the CPU time of the thread that created the
/// timer, which ckpt cannot name at restore.
const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
/// `struct itimerspec`: interval (sec, nsec), then value (sec, nsec).
const ITIMERSPEC_SIZE: usize = 32;
const NANOS_PER_SEC: u64 = 1_000_000_000;

/// One timer as `/proc/PID/timers` shows it.
#[derive(Debug, PartialEq, Eq)]
struct Listed {
    id: i32,
    signo: i32,
    sigev_value: u64,
    sigev_notify: i32,
    target: i32,
    clockid: i32,
}

/// The process's POSIX timers, from the parasite `inf` in its leader.
pub fn collect(inf: &Infection<'_>, pid: i32) -> Result<Vec<PosixTimer>> {
    let text = procfile::read(pid, "timers")?;
    let listed = parse(&text).map_err(|what| DumpError::Parse {
        pid,
        path: "timers".into(),
        what,
    })?;
    let (buf, len) = inf.syscall_buffer();
    debug_assert!(len >= ITIMERSPEC_SIZE);
    let mut out = Vec::new();
    for t in listed {
        if t.clockid < 0 || t.clockid == CLOCK_THREAD_CPUTIME_ID {
            return Err(DumpError::Unsupported {
                pid,
                what: format!(
                    "POSIX timer {} on clock {} (the CPU clock of one thread or of another process)",
                    t.id, t.clockid
                ),
            });
        }
        inf.syscall(
            "timer_gettime",
            libc::SYS_timer_gettime,
            [t.id as u64, buf, 0, 0, 0, 0],
        )?;
        let mut spec = [0u8; ITIMERSPEC_SIZE];
        inf.tracee().read_mem(buf, &mut spec)?;
        let word = |i: usize| u64::from_le_bytes(spec[i * 8..i * 8 + 8].try_into().expect("8"));
        let nanos = |sec: u64, nsec: u64| sec.saturating_mul(NANOS_PER_SEC).saturating_add(nsec);
        let timer = PosixTimer {
            id: t.id,
            clockid: t.clockid,
            sigev_notify: t.sigev_notify,
            signo: t.signo,
            sigev_value: t.sigev_value,
            target: t.target,
            interval_ns: nanos(word(0), word(1)),
            value_ns: nanos(word(2), word(3)),
        };
        log::debug!("pid {pid}: {}", timer.describe());
        out.push(timer);
    }
    out.sort_by_key(|t| t.id);
    Ok(out)
}

/// Parses `/proc/PID/timers`: blocks of `ID:`, `signal: SIGNO/VALUE`,
/// `notify: KIND/pid.N` (or `tid.N`), `ClockID:` lines.
fn parse(text: &str) -> std::result::Result<Vec<Listed>, String> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(first) = lines.next() {
        let field = |line: Option<&str>, key: &str| -> std::result::Result<String, String> {
            line.and_then(|l| l.strip_prefix(key))
                .map(|v| v.trim().to_string())
                .ok_or_else(|| format!("expected {key} line"))
        };
        let id = field(Some(first), "ID:")?;
        let signal = field(lines.next(), "signal:")?;
        let notify = field(lines.next(), "notify:")?;
        let clock = field(lines.next(), "ClockID:")?;
        let bad = |what: &str, v: &str| format!("bad {what}: {v}");
        let (signo, value) = signal
            .split_once('/')
            .ok_or_else(|| bad("signal", &signal))?;
        let (kind, who) = notify
            .split_once('/')
            .ok_or_else(|| bad("notify", &notify))?;
        let mut sigev_notify = match kind {
            "signal" => 0,
            "none" => 1,
            "thread" => 2,
            _ => return Err(bad("notify", &notify)),
        };
        let target = match who.split_once('.') {
            Some(("pid", n)) => n,
            Some(("tid", n)) => {
                sigev_notify |= SIGEV_THREAD_ID;
                n
            }
            _ => return Err(bad("notify", &notify)),
        };
        out.push(Listed {
            id: id.parse().map_err(|_| bad("ID", &id))?,
            signo: signo.parse().map_err(|_| bad("signal", &signal))?,
            sigev_value: u64::from_str_radix(value, 16).map_err(|_| bad("signal", &signal))?,
            sigev_notify,
            target: target.parse().map_err(|_| bad("notify", &notify))?,
            clockid: clock.parse().map_err(|_| bad("ClockID", &clock))?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_timers() {
        let text = "ID: 2\nsignal: 14/0000000000000000\nnotify: signal/pid.22495\nClockID: 0\n\
                    ID: 1\nsignal: 34/0000000000001234\nnotify: signal/tid.22496\nClockID: 1\n";
        let t = parse(text).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(
            t[1],
            Listed {
                id: 1,
                signo: 34,
                sigev_value: 0x1234,
                sigev_notify: SIGEV_THREAD_ID,
                target: 22496,
                clockid: 1
            }
        );
        assert_eq!(t[0].sigev_notify, 0);
        assert!(parse("ID: 1\nsignal: x\n").is_err());
        assert!(parse("").unwrap().is_empty());
    }
}
