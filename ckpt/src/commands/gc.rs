//! `ckpt gc`: removes what killed dumpers left (`NAME.tmp.PID`
//! directories), for sites where no next dump into the same place would.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use ckpt_image::{StaleTmp, SweepOutcome};

use ckpt_job::JobUser;

/// Arguments of `ckpt gc`.
#[derive(clap::Args, Debug)]
pub struct GcArgs {
    /// Directories that hold checkpoints (the parent of `ckpt dump --dir
    /// DIR`, or a `ckpt slurm` directory): every `NAME.tmp.PID` directory
    /// in them whose dumper PID no longer runs is removed, if it is a real
    /// directory (never a symbolic link) of ckpt's user.
    #[arg(value_name = "DIR", required_unless_present = "slurm_job")]
    dirs: Vec<PathBuf>,
    /// Also the checkpoint directory Slurm job JOB registered in its
    /// comment (`ckpt slurm`; a job without one adds nothing), as the node
    /// Epilog passes it.
    #[arg(long, value_name = "JOB")]
    slurm_job: Option<String>,
    /// Run as this user (numeric UID:GID, the job's, as a root-run hook
    /// knows it) before touching any directory: root removes only its own
    /// temporary directories.
    #[arg(long, value_name = "UID:GID")]
    as_user: Option<JobUser>,
}

/// Runs `ckpt gc`: one line per temporary directory found; exits 1 if a
/// directory could not be swept.
pub fn run(a: GcArgs) -> anyhow::Result<ExitCode> {
    if let Some(user) = a.as_user {
        user.become_it()?;
    }
    let mut dirs = a.dirs.clone();
    if let Some(job) = &a.slurm_job
        && let Some(dir) = super::slurm::registered_dir(job)?
    {
        dirs.push(dir);
    }
    let mut failed = false;
    for dir in &dirs {
        if let Err(e) = sweep(dir) {
            failed = true;
            eprintln!("ckpt gc: {e:#}");
        }
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Sweeps one directory, saying what became of each temporary directory.
fn sweep(dir: &Path) -> anyhow::Result<()> {
    if dir.as_os_str().is_empty() {
        bail!("an empty directory name");
    }
    let found = ckpt_image::sweep_stale_tmp_dirs(dir)
        .with_context(|| format!("{}: cannot sweep", dir.display()))?;
    let text: String = found
        .iter()
        .map(|f| format!("ckpt gc: {}: {}\n", dir.join(&f.name).display(), said(f)))
        .collect();
    super::print_stdout(&text)?;
    Ok(())
}

/// What became of one temporary directory, in words.
fn said(f: &StaleTmp) -> String {
    let pid = f.pid;
    match &f.outcome {
        SweepOutcome::Removed => {
            format!("removed, a dumper's temporary directory (pid {pid} is gone)")
        }
        SweepOutcome::DumperAlive => format!("kept, its dumper (pid {pid}) still runs"),
        SweepOutcome::NotADirectory => {
            "kept, a symbolic link or not a directory (never followed)".to_string()
        }
        SweepOutcome::OtherOwner { uid } => format!(
            "kept, owned by uid {uid}, not by ckpt's user {}",
            nix::unistd::geteuid()
        ),
        SweepOutcome::Failed { what } => format!("kept, cannot remove it: {what}"),
    }
}
