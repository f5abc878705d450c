//! The client side: a non-root `ckpt` hands its command to the service.

use std::ffi::OsString;
use std::os::fd::{AsFd, OwnedFd};
use std::process::ExitCode;

use anyhow::Context;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::SigSet;
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::wire::{self, WireError};
use super::{PASSED_SIGNALS, ServiceError, socket_path};

/// Whether this command should go to the service: ckpt is not root, and
/// the command needs root unless the user brought their own key (then it
/// runs here, with what the user's own rights allow).
pub fn wanted(needs_root: bool, own_key: bool) -> bool {
    needs_root && !own_key && !nix::unistd::geteuid().is_root()
}

/// Whether a service answers at `socket` (it is connected to and left
/// at once; the service counts such a connection as one that sent
/// nothing).
pub fn probe(socket: &std::path::Path) -> Result<(), String> {
    wire::connect(socket).map(drop).map_err(|e| match e {
        WireError::Os { source, .. } => source.desc().to_string(),
        other => other.to_string(),
    })
}

/// Runs this process's command through the service and exits as it did.
pub fn delegate(command: &'static str) -> anyhow::Result<ExitCode> {
    let socket = socket_path();
    let conn = wire::connect(&socket).map_err(|e| ServiceError::Unavailable {
        command,
        socket: socket.clone(),
        reason: match &e {
            WireError::Os { source, .. } => source.desc().to_string(),
            other => other.to_string(),
        },
    })?;
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    // For the job `ckpt run` starts: the user's environment is the job's.
    let env: Vec<OsString> = std::env::vars_os()
        .map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            kv
        })
        .collect();
    let cwd: OwnedFd = nix::fcntl::open(
        ".",
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .context("open the working directory")?;
    // A signal the caller started this command with blocked stays blocked
    // and is not passed on: `ckpt slurm` runs its dumps so, so that Slurm's
    // SIGTERM at the end does not cut a checkpoint short.
    let inherited = SigSet::thread_get_mask().context("read the signal mask")?;
    let mut mask = SigSet::empty();
    for s in PASSED_SIGNALS
        .into_iter()
        .filter(|s| !inherited.contains(*s))
    {
        mask.add(s);
    }
    mask.thread_block().context("block signals")?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC).context("signalfd")?;
    let (stdin, stdout, stderr) = (std::io::stdin(), std::io::stdout(), std::io::stderr());
    wire::send_request(
        conn.as_fd(),
        &args,
        &env,
        [cwd.as_fd(), stdin.as_fd(), stdout.as_fd(), stderr.as_fd()],
    )
    .with_context(|| format!("{}: send the request", socket.display()))?;
    drop(cwd);
    loop {
        let mut fds = [
            PollFd::new(conn.as_fd(), PollFlags::POLLIN),
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        ];
        poll(&mut fds, PollTimeout::NONE).context("poll")?;
        let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
        if ready(&fds[1])
            && let Some(info) = signals.read_signal().context("read a signal")?
        {
            let _ = wire::send_signal(conn.as_fd(), info.ssi_signo as i32);
        }
        if ready(&fds[0]) {
            let answer = wire::recv_answer(conn.as_fd()).with_context(|| {
                format!(
                    "{}: the ckpt service ended without an answer",
                    socket.display()
                )
            })?;
            return match answer {
                wire::Answer::Exit(code) => Ok(ExitCode::from(code)),
                wire::Answer::Busy => Err(ServiceError::Busy { socket }.into()),
            };
        }
    }
}
