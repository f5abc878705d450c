//! Job-control stops, restore side: a process dumped stopped (state T)
//! gets its stop signal queued as the very last step of its rebuild,
//! when no remote syscall will run in it any more (a pending stop signal
//! would turn the next one into a signal-delivery stop). Before the tree
//! resumes, the leader takes it and starts the group stop
//! ([`enter_group_stop`]); its threads and itself, let go, stay stopped
//! before running one instruction or taking one pending signal. The
//! parent is told (SIGCHLD, `waitpid(WUNTRACED)`) as for the original
//! stop, and only a SIGCONT lets the process run again.

use ckpt_image::task::JobStop;
use ckpt_parasite::Tracee;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::{RestoreError, Result};

/// The stop signal of process `image_pid`'s saved job stop, if it was
/// stopped. Only the four signals whose default action stops are taken
/// from the image.
pub fn signal_of(image_pid: i32, job: Option<&JobStop>) -> Result<Option<Signal>> {
    let Some(job) = job else {
        return Ok(None);
    };
    Signal::try_from(job.signal)
        .ok()
        .filter(|s| {
            matches!(
                s,
                Signal::SIGSTOP | Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU
            )
        })
        .map(Some)
        .ok_or_else(|| {
            RestoreError::Image(ckpt_image::ImageError::Invalid {
                path: ckpt_image::core_name(image_pid).into(),
                what: format!("job stop by signal {}, not a stop signal", job.signal),
            })
        })
}

/// Queues the saved stop signal to process `pid` (host pid) if it was
/// stopped.
pub fn stop(pid: i32, image_pid: i32, job: Option<&JobStop>) -> Result<()> {
    let Some(signal) = signal_of(image_pid, job)? else {
        return Ok(());
    };
    log::debug!("pid {pid}: stopped by {signal} again");
    kill(Pid::from_raw(pid), signal)
        .map_err(|e| RestoreError::os(pid, "kill (job-control stop)", e.into()))
}

/// Puts the process of `leader` (still traced, its stop signal queued by
/// [`stop`]) into its group stop before it is let go. Signals pending to
/// it since the dump stay pending, as they were while it was stopped:
/// let go with them and the stop signal pending, it would take those
/// numbered below the stop signal first and run their handlers. So every
/// signal but the stop signal is blocked while the leader takes it; the
/// group stop then holds each task, let go, before it dequeues anything.
pub fn enter_group_stop(leader: &Tracee, signal: Signal) -> Result<()> {
    let mask = leader.sigmask()?;
    leader.set_sigmask(!(1u64 << (signal as i32 - 1)))?;
    let stopped = leader.take_stop_signal(signal);
    leader.set_sigmask(mask)?;
    stopped?;
    Ok(())
}
