//! `ckpt restore`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use ckpt_restorer::RestoreOptions;
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
    /// The site's image key file (default: $CKPT_IMAGE_KEY, else
    /// /var/lib/ckpt/image.key).
    #[arg(long, value_name = "PATH")]
    image_key: Option<PathBuf>,
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
    let key = ckpt_image::ImageKey::load(&ckpt_image::seal::key_path(a.image_key.as_deref()))
        .with_context(|| format!("restore from {} failed", a.dir.display()))?;
    let opts = RestoreOptions {
        dir: a.dir.clone(),
        key: &key,
        pid_wait: Duration::from_secs(a.pid_wait),
        notice: &notice,
        progress: Some(&progress),
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
