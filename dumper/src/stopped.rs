//! Job-control stops (state T): a process stopped by SIGSTOP, SIGTSTP,
//! SIGTTIN or SIGTTOU is dumped like any other and restored stopped.
//!
//! `PTRACE_SEIZE` of a stopped task makes it re-trap into a group-stop
//! trap (`PTRACE_EVENT_STOP`), whose siginfo carries the stop signal; a
//! running task frozen with `PTRACE_INTERRUPT` traps with SIGTRAP
//! instead. So the leader's siginfo, read right after it is frozen and
//! before anything runs in it, tells whether and by what it was stopped.
//! Detaching later puts the task back in its group stop (the kernel
//! re-arms it when group stop is in effect), so a dump that leaves the
//! tree running leaves it stopped.

use ckpt_image::task::JobStop;
use ckpt_parasite::Tracee;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use crate::error::{DumpError, Result};

/// The job-control stop the freshly frozen `leader` is in, if any. Must
/// be called before any code or syscall is run in it.
pub fn collect(leader: &Tracee) -> Result<Option<JobStop>> {
    let pid = leader.pid();
    let info = nix::sys::ptrace::getsiginfo(Pid::from_raw(pid)).map_err(|source| {
        DumpError::Parasite(ckpt_parasite::ParasiteError::Ptrace {
            pid,
            op: "getsiginfo",
            source,
        })
    })?;
    // A group-stop trap reports the stop signal and PTRACE_EVENT_STOP in
    // the upper byte of si_code.
    let event = info.si_code >> 8;
    let signal = Signal::try_from(info.si_signo).ok();
    Ok(match signal {
        Some(s) if event == libc::PTRACE_EVENT_STOP && is_stop_signal(s) => {
            log::debug!("pid {pid}: job-control stopped by {s}");
            Some(JobStop { signal: s as i32 })
        }
        _ => None,
    })
}

/// Takes the trap still pending in each task of a stopped process.
///
/// Seizing a task in group stop makes it trap at once (the seize waits
/// for that), so the freeze's `PTRACE_INTERRUPT` stays pending and would
/// stop the first remote syscall. Interrupting again and continuing
/// consumes it: the task re-traps inside the kernel's signal path without
/// running an instruction of its own, and nothing is left pending.
///
/// A SIGSTOP sent while the process was stopped stays pending (nothing
/// dequeues it until SIGCONT, which discards it): no mask holds it back,
/// so it is taken and dropped here, every other signal blocked meanwhile
/// so that only it can be dequeued. Blockable signals stay pending, and
/// are saved and restored as such.
pub fn settle(tasks: &[Tracee]) -> Result<()> {
    for t in tasks {
        t.park_with(&t.regs()?)?;
    }
    for t in tasks {
        drop_pending_sigstop(t)?;
    }
    Ok(())
}

/// How many times a task is resumed to take a pending SIGSTOP before the
/// dump gives up: one take is enough unless someone keeps sending it.
const SIGSTOP_TAKES: usize = 8;

/// How long a task resumed to take its pending SIGSTOP may take to reach
/// it: the kernel dequeues it at once, unless a SIGCONT dropped it meanwhile.
const SIGSTOP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(1);

/// Takes the SIGSTOP pending to task `t` (its own or its process's).
fn drop_pending_sigstop(t: &Tracee) -> Result<()> {
    let tid = t.pid();
    if !sigstop_pending(tid)? {
        return Ok(());
    }
    let mask = t.sigmask()?;
    t.set_sigmask(!0)?;
    let mut taken = Ok(());
    for _ in 0..SIGSTOP_TAKES {
        if let Err(e) = t.take_pending_sigstop(SIGSTOP_PATIENCE) {
            taken = Err(e.into());
            break;
        }
        match sigstop_pending(tid) {
            Ok(false) => break,
            Ok(true) => {}
            Err(e) => {
                taken = Err(e);
                break;
            }
        }
    }
    t.set_sigmask(mask)?;
    taken?;
    if sigstop_pending(tid)? {
        return Err(DumpError::Unsupported {
            pid: tid,
            what: "SIGSTOP sent again and again while it is stopped".into(),
        });
    }
    log::debug!("pid {tid}: pending SIGSTOP dropped (SIGCONT would drop it)");
    Ok(())
}

/// Whether SIGSTOP is pending to task `tid`, to it or to its process.
fn sigstop_pending(tid: i32) -> Result<bool> {
    let status = crate::procfile::read(tid, "status")?;
    let bit = 1u64 << (libc::SIGSTOP - 1);
    Ok(["SigPnd", "ShdPnd"].iter().any(|field| {
        crate::procfile::status_field(&status, field)
            .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
            .is_some_and(|m| m & bit != 0)
    }))
}

/// The signals whose default action stops a process.
pub fn is_stop_signal(s: Signal) -> bool {
    matches!(
        s,
        Signal::SIGSTOP | Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU
    )
}

/// Refuses a process another tracer (a debugger, strace) holds: ckpt
/// cannot seize it, and taking it from its tracer would change what that
/// tracer sees. `status` is its /proc/PID/status.
pub fn check_tracer(pid: i32, status: &str) -> Result<()> {
    let tracer: i32 = crate::procfile::status_field(status, "TracerPid")
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    if tracer == 0 {
        return Ok(());
    }
    let name = crate::procfile::read(tracer, "comm")
        .map(|c| c.trim_end_matches('\n').to_string())
        .unwrap_or_else(|_| "gone".into());
    Err(DumpError::Unsupported {
        pid,
        what: format!("process traced by pid {tracer} ({name}; detach it first)"),
    })
}
