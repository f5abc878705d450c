//! `ckpt restore`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use ckpt_restorer::{FilePolicy, InheritFd, RestoreOptions};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::Pid;

/// Arguments of `ckpt restore`.
#[derive(clap::Args, Debug)]
pub struct RestoreArgs {
    /// Checkpoint directory.
    #[arg(long, short = 'D', value_name = "DIR")]
    dir: PathBuf,
    /// Exit as soon as the process runs instead of waiting for it.
    #[arg(long, short = 'd')]
    detach: bool,
    /// Seconds to wait for a zombie that still holds the pid.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    pid_wait: u64,
    /// Print the restored pid as JSON.
    #[arg(long)]
    json: bool,
    /// Let a terminal fd N of the restored process receive this command's
    /// own fd N (repeatable). Fds 0, 1 and 2 are always passed; any other
    /// terminal fd gets /dev/null.
    #[arg(long = "inherit-fd", value_name = "N")]
    inherit_fd: Vec<u16>,
    /// Accept that this open file changed since the dump (repeatable): it is
    /// reopened at its end instead of the dumped offset, as an append-only
    /// log continues. Its owner, mode and type must still match.
    #[arg(long = "allow-changed", value_name = "PATH")]
    allow_changed: Vec<PathBuf>,
}

/// Runs `ckpt restore`: exits 0 once the process runs with `--detach`,
/// otherwise waits and exits with its status (128+signal if killed).
pub fn run(a: RestoreArgs) -> anyhow::Result<ExitCode> {
    let bar = super::progress_bar("restoring pages");
    let notice = |msg: &str| match &bar {
        Some(b) => b.println(format!("ckpt: {msg}")),
        None => eprintln!("ckpt: {msg}"),
    };
    let progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let opts = RestoreOptions {
        dir: a.dir.clone(),
        pid_wait: Duration::from_secs(a.pid_wait),
        notice: &notice,
        progress: Some(&progress),
        files: FilePolicy {
            inherit_fds: a
                .inherit_fd
                .iter()
                .map(|&n| InheritFd(i32::from(n)))
                .collect(),
            allow_changed: a
                .allow_changed
                .iter()
                .map(|p| dumped_form(p))
                .collect::<anyhow::Result<_>>()?,
        },
    };
    // The engine's phases: a coordinated restart publishes and subscribes
    // between them.
    let r = ckpt_restorer::rebuild(&opts).and_then(|stopped| stopped.resume());
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let r = r.with_context(|| format!("restore from {} failed", a.dir.display()))?;
    if a.json {
        println!("{}", serde_json::json!({ "pid": r.pid }));
    } else {
        eprintln!("ckpt: restored pid {}", r.pid);
    }
    if a.detach {
        return Ok(ExitCode::SUCCESS);
    }
    loop {
        match waitpid(Pid::from_raw(r.pid), None) {
            Ok(WaitStatus::Exited(_, code)) => return Ok(ExitCode::from(code as u8)),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Ok(ExitCode::from(128 + sig as u8)),
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e).context(format!("waiting for pid {}", r.pid)),
        }
    }
}

/// A path as the dump recorded it: absolute, with every symbolic link
/// resolved (the dump read it from /proc).
fn dumped_form(p: &std::path::Path) -> anyhow::Result<PathBuf> {
    std::fs::canonicalize(p).or_else(|_| {
        std::path::absolute(p).with_context(|| format!("--allow-changed {}", p.display()))
    })
}
