//! `ckpt dump`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use ckpt_dumper::{DumpReport, WriteOptions};

use crate::scripts::{ActionScripts, Phase};

/// Arguments of `ckpt dump`.
#[derive(clap::Args, Debug)]
pub struct DumpArgs {
    /// The process to checkpoint, with all its threads and descendants.
    #[arg(long = "tree", short = 't', value_name = "PID")]
    pid: i32,
    /// Checkpoint directory to create; must not exist.
    #[arg(long, short = 'D', value_name = "DIR")]
    dir: PathBuf,
    /// Leave the process running after the dump (the default).
    #[arg(long, conflicts_with = "kill")]
    leave_running: bool,
    /// Kill the process once the images are complete and synced.
    #[arg(long)]
    kill: bool,
    /// Store page data LZ4-compressed (smaller images; restore decompresses).
    #[arg(long)]
    compress: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    /// The site's image key file, created on first use (default: $CKPT_IMAGE_KEY, else
    /// /var/lib/ckpt/image.key).
    #[arg(long, value_name = "PATH")]
    image_key: Option<PathBuf>,
    /// Run this program at pre-dump (before the freeze) and post-dump
    /// (images committed, tree still frozen) (repeatable); a failure aborts
    /// the dump.
    #[arg(long = "action-script", value_name = "PATH")]
    action_scripts: Vec<PathBuf>,
    /// Accepted for CRIU compatibility; changes nothing (terminals are
    /// always recorded; see `restore --shell-job`).
    #[arg(long, short = 'j')]
    shell_job: bool,
    /// Declare an open file external instead of refusing it (repeatable):
    /// KEY is `pipe:[INODE]` or `socket:[INODE]` as /proc/PID/fd shows the
    /// fd, or a path. Nothing of it is saved; restore is handed an fd for it
    /// with `--inherit-fd fd[N]:KEY`.
    #[arg(long = "external", value_name = "KEY")]
    externals: Vec<String>,
    /// Also save established TCP connections to peers outside the tree
    /// (CRIU's option): they are frozen in repair mode, and after
    /// `--kill` the peer sees nothing until the restored process continues
    /// the stream. Connections with both ends in the tree are always saved.
    #[arg(long)]
    tcp_established: bool,
}

/// Runs `ckpt dump`.
pub fn run(a: DumpArgs) -> anyhow::Result<ExitCode> {
    let bar = super::progress_bar("dumping pages").filter(|_| !crate::logger::verbose_on_stderr());
    let progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    // The engine's phases, one after the other (a coordinated dump runs
    // the same steps with barriers between them).
    let key =
        ckpt_image::ImageKey::load_or_create(&ckpt_image::seal::key_path(a.image_key.as_deref()))?;
    let write = WriteOptions {
        dir: a.dir.clone(),
        progress: Some(&progress),
        compress: a.compress,
        key: &key,
        log: Some(&crate::logger::captured),
        externals: &a.externals,
    };
    let scripts = ActionScripts::new(a.action_scripts.clone(), &a.dir);
    let report =
        phases(&a, &write, &scripts).with_context(|| format!("dump of pid {} failed", a.pid));
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let report = report?;
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "pid": report.pid,
                "processes": report.processes,
                "dir": report.dir,
                "vmas": report.vmas,
                "pages_bytes": report.pages_bytes,
                "fds": report.fds,
                "frozen_ms": report.frozen_ms,
                "killed": a.kill,
                "stats": report.stats,
            })
        );
    } else {
        eprintln!(
            "dumped pid {} ({} processes) to {}: {} VMAs, {} bytes of pages, {} fds, frozen {} ms{}",
            report.pid,
            report.processes,
            report.dir.display(),
            report.vmas,
            report.pages_bytes,
            report.fds,
            report.frozen_ms,
            if a.kill { ", killed" } else { "" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The engine's phases with the action scripts between them.
fn phases(
    a: &DumpArgs,
    write: &WriteOptions<'_>,
    scripts: &ActionScripts,
) -> anyhow::Result<DumpReport> {
    scripts.run(Phase::PreDump, Some(a.pid))?;
    let mut frozen = ckpt_dumper::freeze(a.pid)?;
    frozen.drain(&ckpt_dumper::DrainOptions {
        tcp_established: a.tcp_established,
    })?;
    let written = frozen.write(write)?;
    if let Err(e) = scripts.run(Phase::PostDump, Some(a.pid)) {
        // A vetoed dump leaves no checkpoint, like any failed one; dropping
        // `written` then thaws the tree.
        let dir = &written.report().dir;
        if let Err(rm) = std::fs::remove_dir_all(dir) {
            return Err(anyhow::Error::new(e).context(format!(
                "{}: cannot remove the vetoed checkpoint: {rm}",
                dir.display()
            )));
        }
        return Err(e.into());
    }
    Ok(if a.kill {
        written.kill()?
    } else {
        written.resume()?
    })
}
