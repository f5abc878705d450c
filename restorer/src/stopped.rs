//! Job-control stops, restore side: a process dumped stopped (state T)
//! gets its stop signal queued as the very last step of its rebuild,
//! when no remote syscall will run in it any more (a pending stop signal
//! would turn the next one into a signal-delivery stop). Its threads and
//! its leader, let go when the tree resumes, stop at once, before running
//! one instruction of their own. The
//! parent is told (SIGCHLD, `waitpid(WUNTRACED)`) as for the original
//! stop, and only a SIGCONT lets the process run again.

use ckpt_image::task::JobStop;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::{RestoreError, Result};

/// Queues the saved stop signal to process `pid` (host pid) if it was
/// stopped. Only the four signals whose default action stops are taken
/// from the image.
pub fn stop(pid: i32, image_pid: i32, job: Option<&JobStop>) -> Result<()> {
    let Some(job) = job else {
        return Ok(());
    };
    let signal = Signal::try_from(job.signal)
        .ok()
        .filter(|s| {
            matches!(
                s,
                Signal::SIGSTOP | Signal::SIGTSTP | Signal::SIGTTIN | Signal::SIGTTOU
            )
        })
        .ok_or_else(|| {
            RestoreError::Image(ckpt_image::ImageError::Invalid {
                path: ckpt_image::core_name(image_pid).into(),
                what: format!("job stop by signal {}, not a stop signal", job.signal),
            })
        })?;
    log::debug!("pid {pid}: stopped by {signal} again");
    kill(Pid::from_raw(pid), signal)
        .map_err(|e| RestoreError::os(pid, "kill (job-control stop)", e.into()))
}
