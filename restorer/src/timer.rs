//! POSIX timers (timer_create), restore side: created inside the process
//! with their dumped ids (`prctl(PR_TIMER_CREATE_RESTORE_IDS)` makes
//! `timer_create` take the id in `*timerid`, Linux 6.13+ with
//! CONFIG_CHECKPOINT_RESTORE), clock, signal, value and target thread, and
//! armed with the time they had left at dump time, counted from the end
//! of its rebuild (for the frozen process no time passed). They are
//! created after the threads exist (a timer may signal one of them) and
//! armed last.

use ckpt_image::timer::PosixTimer;
use ckpt_parasite::remote::Remote;

use crate::error::{RestoreError, Result};

/// `PR_TIMER_CREATE_RESTORE_IDS` and its arguments (uapi linux/prctl.h).
const PR_TIMER_CREATE_RESTORE_IDS: u64 = 77;
const PR_TIMER_CREATE_RESTORE_IDS_OFF: u64 = 0;
const PR_TIMER_CREATE_RESTORE_IDS_ON: u64 = 1;
/// `struct sigevent` on x86-64: sigev_value (8 bytes), sigev_signo (i32),
/// sigev_notify (i32), then the union whose first member is the target
/// thread id; 64 bytes in all.
const SIGEVENT_SIZE: usize = 64;
const SIGEV_VALUE: usize = 0;
const SIGEV_SIGNO: usize = 8;
const SIGEV_NOTIFY: usize = 12;
const SIGEV_TID: usize = 16;
/// Scratch slots: the sigevent, the timer id, the itimerspec.
const SIGEVENT_SLOT: u64 = 0;
const ID_SLOT: u64 = 1;
const SPEC_SLOT: u64 = 2;
const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Creates the process's POSIX timers, disarmed (the prctl needs the
/// privileges the process has before its credentials are restored).
pub fn create(r: &Remote<'_>, timers: &[PosixTimer]) -> Result<()> {
    if timers.is_empty() {
        return Ok(());
    }
    let pid = r.t.pid();
    r.call(
        "prctl(PR_TIMER_CREATE_RESTORE_IDS)",
        libc::SYS_prctl,
        [PR_TIMER_CREATE_RESTORE_IDS, PR_TIMER_CREATE_RESTORE_IDS_ON, 0, 0, 0, 0],
    )
    .map_err(|e| RestoreError::Host {
        pid,
        what: format!(
            "POSIX timers cannot get their ids back (prctl PR_TIMER_CREATE_RESTORE_IDS needs Linux 6.13+ with CONFIG_CHECKPOINT_RESTORE): {e}"
        ),
    })?;
    for t in timers {
        create_one(r, t)?;
    }
    r.call(
        "prctl(PR_TIMER_CREATE_RESTORE_IDS)",
        libc::SYS_prctl,
        [
            PR_TIMER_CREATE_RESTORE_IDS,
            PR_TIMER_CREATE_RESTORE_IDS_OFF,
            0,
            0,
            0,
            0,
        ],
    )?;
    Ok(())
}

fn create_one(r: &Remote<'_>, t: &PosixTimer) -> Result<()> {
    let pid = r.t.pid();
    log::debug!("pid {pid}: {}", t.describe());
    let mut sev = [0u8; SIGEVENT_SIZE];
    sev[SIGEV_VALUE..SIGEV_VALUE + 8].copy_from_slice(&t.sigev_value.to_le_bytes());
    sev[SIGEV_SIGNO..SIGEV_SIGNO + 4].copy_from_slice(&t.signo.to_le_bytes());
    sev[SIGEV_NOTIFY..SIGEV_NOTIFY + 4].copy_from_slice(&t.sigev_notify.to_le_bytes());
    sev[SIGEV_TID..SIGEV_TID + 4].copy_from_slice(&t.target.to_le_bytes());
    let sev = r.put(SIGEVENT_SLOT, &sev)?;
    let id = r.put(ID_SLOT, &t.id.to_le_bytes())?;
    r.call(
        "timer_create",
        libc::SYS_timer_create,
        [t.clockid as u64, sev, id, 0, 0, 0],
    )
    .map_err(|e| RestoreError::Host {
        pid,
        what: format!("POSIX timer {}: timer_create: {e}", t.id),
    })?;
    let mut got = [0u8; 4];
    r.t.read_mem(id, &mut got)?;
    let got = i32::from_le_bytes(got);
    if got != t.id {
        return Err(RestoreError::Host {
            pid,
            what: format!("POSIX timer {} was created as timer {got}", t.id),
        });
    }
    Ok(())
}

/// Arms the timers with the time they had left, as the last remote calls
/// into the process: a timer that fires now only leaves its signal
/// pending (the leader blocks everything until its final stop, and no
/// thread runs again before the process is let go), so it cannot break
/// into the restorer's remote syscalls.
pub fn arm(r: &Remote<'_>, timers: &[PosixTimer]) -> Result<()> {
    for t in timers.iter().filter(|t| t.value_ns != 0) {
        arm_one(r, t)?;
    }
    Ok(())
}

fn arm_one(r: &Remote<'_>, t: &PosixTimer) -> Result<()> {
    let split = |ns: u64| [ns / NANOS_PER_SEC, ns % NANOS_PER_SEC];
    let [is, ins] = split(t.interval_ns);
    let [vs, vns] = split(t.value_ns);
    let spec = r.put_u64s(SPEC_SLOT, &[is, ins, vs, vns])?;
    r.call(
        "timer_settime",
        libc::SYS_timer_settime,
        [t.id as u64, 0, spec, 0, 0, 0],
    )?;
    Ok(())
}
