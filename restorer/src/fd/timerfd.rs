//! timerfd objects, created inside the process with their clock, armed as
//! dumped, with their pending expirations.
//!
//! Time: a relative timer gets back the time it had left at dump time,
//! counted from its restore (as CRIU does): the process was frozen, so for
//! it no time passed, and its next expiration stays as far ahead as it
//! was. An absolute timer (TFD_TIMER_ABSTIME) keeps its deadline on its
//! clock, which is what absolute means; if that passed while the process
//! was saved, the timer fires at once (and a periodic one counts the
//! periods missed, as the kernel does for a late absolute timer).
//!
//! Pending expirations are set exactly with `TFD_IOC_SET_TICKS` (what the
//! ioctl exists for; Linux 3.17+ with CONFIG_CHECKPOINT_RESTORE), after
//! `timerfd_settime`, which would reset them.

use ckpt_image::fd::File;
use ckpt_image::fd::timerfd::{TimerfdFile, TimerfdTime};

use super::{Context, FileRestorer};
use crate::error::{RestoreError, Result};
use ckpt_parasite::remote::Remote;

/// timerfds.
pub struct Timerfd;

/// `TFD_IOC_SET_TICKS`: `_IOW('T', 0, u64)`.
const TFD_IOC_SET_TICKS: u64 = nix::request_code_write!(b'T', 0, std::mem::size_of::<u64>()) as u64;

/// Argument slots of the scratch area.
const SLOT_ITIMERSPEC: u64 = 0;
const SLOT_TICKS: u64 = 1;

/// The shortest time `timerfd_settime` accepts as armed: a periodic timer
/// reported with nothing left (it was expiring at that instant) must stay
/// armed, and a zero value would disarm it.
const SOONEST: TimerfdTime = TimerfdTime { sec: 0, nsec: 1 };

impl FileRestorer for Timerfd {
    type Image = TimerfdFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &TimerfdFile,
        fd: i32,
    ) -> Result<i32> {
        let value = image.value.unwrap_or_default();
        let interval = image.interval.unwrap_or_default();
        if !value.is_valid() || !interval.is_valid() {
            return Err(cx.invalid(fd, "timerfd time out of range"));
        }
        let create_flags = libc::TFD_CLOEXEC | (file.flags as i32 & libc::TFD_NONBLOCK);
        let got = r.call(
            "timerfd_create",
            libc::SYS_timerfd_create,
            [image.clockid as u64, create_flags as u64, 0, 0, 0, 0],
        )? as i32;

        let mut settime_flags = 0;
        if image.abstime {
            settime_flags |= libc::TFD_TIMER_ABSTIME;
        }
        if image.cancel_on_set {
            settime_flags |= libc::TFD_TIMER_CANCEL_ON_SET;
        }
        let armed = !value.is_zero() || !interval.is_zero();
        let it_value = if !armed {
            TimerfdTime::default()
        } else if image.abstime {
            image
                .deadline()
                .ok_or_else(|| cx.invalid(fd, "timerfd deadline out of range"))?
        } else if value.is_zero() {
            SOONEST
        } else {
            value
        };
        // struct itimerspec: it_interval, then it_value.
        let spec = r.put_u64s(
            SLOT_ITIMERSPEC,
            &[
                interval.sec as u64,
                interval.nsec as u64,
                it_value.sec as u64,
                it_value.nsec as u64,
            ],
        )?;
        r.call(
            "timerfd_settime",
            libc::SYS_timerfd_settime,
            [got as u64, settime_flags as u64, spec, 0, 0, 0],
        )?;

        if image.ticks > 0 {
            let ticks = r.put(SLOT_TICKS, &image.ticks.to_ne_bytes())?;
            r.call(
                "ioctl(TFD_IOC_SET_TICKS)",
                libc::SYS_ioctl,
                [got as u64, TFD_IOC_SET_TICKS, ticks, 0, 0, 0],
            )
            .map_err(|e| RestoreError::Host {
                pid: cx.pid(),
                what: format!(
                    "fd {fd}: timerfd with {} expirations not read: {e} \
                     (setting them needs a kernel with CONFIG_CHECKPOINT_RESTORE)",
                    image.ticks
                ),
            })?;
        }
        Ok(got)
    }
}
