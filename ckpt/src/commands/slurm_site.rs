//! The site's side of `ckpt slurm`: what an administrator installs around
//! the job wrapper.
//!
//! - The job's registration: the wrapper records its signal and checkpoint
//!   directory in the job's `Comment` (`ckpt-slurm:SIG:DIR`), the one place
//!   a controller-side hook and a node's Epilog can both read (neither sees
//!   the job's environment).
//! - `ckpt slurm trigger JOB`: the program of a `strigger --time` trigger
//!   (armed by `PrologSlurmctld`): asks a registered, running job to
//!   checkpoint now by sending its signal to the wrapper
//!   (`scancel --batch --signal=SIG JOB`).
//! - `ckpt slurm epilog`: the node Epilog's logic: verifies the committed
//!   checkpoint (seal and checksums) and removes what a killed dump left
//!   (`ckpt-N` newer than `LATEST`, unfinished commits; the dumpers'
//!   temporary directories are `ckpt gc`'s), never the committed
//!   checkpoint; one line per action. Run by root with `--as-user`, it
//!   reads the site's key and then does everything as the job's user.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use anyhow::{Context, bail};

use ckpt_job::JobUser;
use ckpt_job::slurm::budget::TIMING_SUFFIX;
use ckpt_job::slurm::checkpoints::{committed, number_of};
use ckpt_job::slurm::client::{self, JobRecord, Registered, Registration};
use ckpt_job::slurm::{ATTEMPT, LATEST};

/// Records the wrapper's signal and directory in its job's comment, unless
/// the job carries a comment of its own (that one is kept, and the site's
/// hooks will not find the job: one line says so).
pub fn register(job: &str, reg: &Registration) {
    match client::register(job, reg) {
        Ok(Registered::Already | Registered::Updated) => {}
        Ok(Registered::OwnComment(c)) => eprintln!(
            "ckpt slurm: job {job} has a comment of its own ({c:?}): not registered for the site's hooks (trigger, epilog)"
        ),
        Err(e) => eprintln!(
            "ckpt slurm: job {job}: not registered for the site's hooks (trigger, epilog): {:#}",
            anyhow::Error::new(e)
        ),
    }
}

/// Arguments of `ckpt slurm trigger`.
#[derive(clap::Args, Debug)]
pub struct TriggerArgs {
    /// The job to ask for a checkpoint (strigger passes it as the first
    /// argument of its program).
    #[arg(value_name = "JOB")]
    job: String,
}

/// `ckpt slurm trigger JOB`: sends a registered, running job's checkpoint
/// signal to its wrapper (the batch step's shell, which `exec`ed ckpt).
/// Any other job is left alone: its batch shell may die of the signal.
pub fn trigger(a: TriggerArgs) -> anyhow::Result<ExitCode> {
    let job = &a.job;
    if job.is_empty() || !job.bytes().all(|b| b.is_ascii_digit()) {
        bail!("{job:?}: not a job id");
    }
    let record = JobRecord::query(job)?;
    let reg = match record.registration() {
        None => {
            crate::commands::print_stdout(&format!(
                "ckpt slurm trigger: job {job}: not a ckpt slurm job; nothing sent\n"
            ))?;
            return Ok(ExitCode::SUCCESS);
        }
        Some(r) => r.with_context(|| format!("job {job}"))?,
    };
    let state = record.get("JobState").unwrap_or("?");
    if state != "RUNNING" {
        crate::commands::print_stdout(&format!(
            "ckpt slurm trigger: job {job} is {state}, not RUNNING; nothing sent\n"
        ))?;
        return Ok(ExitCode::SUCCESS);
    }
    let sig = reg.signal.as_str();
    let sig = sig.strip_prefix("SIG").unwrap_or(sig);
    let out = Command::new("scancel")
        .arg("--batch")
        .arg(format!("--signal={sig}"))
        .arg(job)
        .stdin(Stdio::null())
        .output()
        .context("cannot run scancel")?;
    if !out.status.success() {
        bail!(
            "job {job}: scancel --batch --signal={sig} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    crate::commands::print_stdout(&format!(
        "ckpt slurm trigger: job {job}: SIG{sig} sent to its batch step to checkpoint into {}\n",
        reg.dir.display()
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// Arguments of `ckpt slurm epilog`.
#[derive(clap::Args, Debug)]
pub struct EpilogArgs {
    /// The job's checkpoint directory (default: the one the job registered
    /// in its comment; a job without one is left alone).
    #[arg(long, short = 'D', value_name = "DIR")]
    dir: Option<PathBuf>,
    /// The job (default: $SLURM_JOB_ID, as Slurm sets it for an Epilog).
    #[arg(long, value_name = "JOB")]
    job: Option<String>,
    /// The site's image key file (default: $CKPT_IMAGE_KEY, else
    /// /var/lib/ckpt/image.key).
    #[arg(long, value_name = "PATH")]
    image_key: Option<PathBuf>,
    /// Run as the job's user (numeric UID:GID, as the Epilog knows them
    /// from SLURM_JOB_UID and SLURM_JOB_GID): run as root, ckpt reads the
    /// image key first, then becomes that user for good (not dumpable, so
    /// the user cannot read the key from it) before it looks at anything
    /// of the job's.
    #[arg(long, value_name = "UID:GID")]
    as_user: Option<JobUser>,
}

/// One entry of a checkpoint directory, as the Epilog sees it.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    /// `ckpt-N`.
    Checkpoint(u64),
    /// `ckpt-N.time`: a checkpoint's timing record.
    Timing(u64),
    /// `LATEST.tmp`: a commit that did not finish.
    LatestTmp,
    /// `ATTEMPT`: a checkpoint that began and never committed.
    Attempt,
    /// Anything else (left alone).
    Other,
}

fn classify(name: &str) -> Entry {
    if let Some(n) = number_of(name) {
        return Entry::Checkpoint(n);
    }
    if name == format!("{LATEST}.tmp") {
        return Entry::LatestTmp;
    }
    if name == ATTEMPT {
        return Entry::Attempt;
    }
    if let Some(n) = name.strip_suffix(TIMING_SUFFIX).and_then(number_of) {
        return Entry::Timing(n);
    }
    Entry::Other
}

/// `ckpt slurm epilog`: exit 0 when the directory holds a verified
/// committed checkpoint, or none; 1 when the committed one fails
/// verification (it is kept, for a human to look at).
pub fn epilog(a: EpilogArgs) -> anyhow::Result<ExitCode> {
    // Read while ckpt may still be root: the job's user may not read the
    // key file, and must not get to, so it is kept until verification
    // needs it, and a failure only counts if it does.
    let key = ckpt_image::ImageKey::load(&ckpt_image::seal::key_path(a.image_key.as_deref()));
    if let Some(user) = a.as_user {
        user.become_it()?;
    }
    let job = match &a.job {
        Some(j) => j.clone(),
        None => std::env::var("SLURM_JOB_ID")
            .ok()
            .filter(|s| !s.is_empty())
            .context("no --job given and SLURM_JOB_ID is not set")?,
    };
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => match JobRecord::query(&job)?.registration() {
            // Not a ckpt slurm job: nothing of ours to look after.
            None => return Ok(ExitCode::SUCCESS),
            Some(r) => r.with_context(|| format!("job {job}"))?.dir,
        },
    };
    // The epilog's report goes to the slurmd log; a reader gone early must
    // not fail the cleanup itself.
    let say = |what: &str| {
        if let Err(e) =
            crate::commands::print_stdout(&format!("ckpt slurm epilog: job {job}: {what}\n"))
        {
            log::warn!("ckpt slurm epilog: job {job}: {e:#}");
        }
    };
    let meta = match std::fs::symlink_metadata(&dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            say(&format!("{}: no checkpoint directory", dir.display()));
            return Ok(ExitCode::SUCCESS);
        }
        Err(e) => return Err(e).with_context(|| format!("{}: stat", dir.display())),
    };
    if !meta.is_dir() {
        bail!("job {job}: {}: not a directory", dir.display());
    }
    // Root tidying a user's directory could be led by a symlink swapped
    // in; the Epilog runs as the job's user (`--as-user`, see
    // scripts/slurm/epilog.sh).
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        bail!(
            "job {job}: {}: owned by uid {}, not by ckpt's user {me}: run the epilog as the job's user (--as-user UID:GID)",
            dir.display(),
            meta.uid()
        );
    }

    let committed = committed(&dir).with_context(|| format!("job {job}"))?;
    let committed_number = committed.as_deref().and_then(number_of);
    let mut verified = true;
    match &committed {
        None => say(&format!("{}: nothing committed", dir.display())),
        Some(name) => {
            let path = dir.join(name);
            let key = key
                .as_ref()
                .map_err(|e| anyhow::anyhow!("{e}"))
                .context("cannot load the image key to verify the committed checkpoint")?;
            match ckpt_image::ImageDir::open(&path, key) {
                Ok(d) => say(&format!(
                    "{}: committed checkpoint verified (seal and checksums of {} files)",
                    path.display(),
                    d.manifest().files.len()
                )),
                Err(e) => {
                    verified = false;
                    say(&format!(
                        "{}: committed checkpoint fails verification, kept: {e}",
                        path.display()
                    ));
                }
            }
        }
    }

    let mut names: Vec<String> = Vec::new();
    for e in std::fs::read_dir(&dir).with_context(|| format!("{}: read", dir.display()))? {
        let e = e.with_context(|| format!("{}: read", dir.display()))?;
        if let Some(n) = e.file_name().to_str() {
            names.push(n.to_string());
        }
    }
    names.sort();
    let present = |n: u64| names.iter().any(|m| number_of(m) == Some(n));
    for name in &names {
        let path = dir.join(name);
        let why = match classify(name) {
            Entry::Checkpoint(n) if committed_number.is_none_or(|c| n > c) => {
                "uncommitted checkpoint (newer than LATEST)"
            }
            Entry::Timing(n) if !present(n) => "timing record of a checkpoint that is gone",
            Entry::LatestTmp => "an unfinished commit of LATEST",
            Entry::Attempt => {
                say(&format!(
                    "{}: a checkpoint began and never committed (the job ended during it); the next start reports it",
                    path.display()
                ));
                continue;
            }
            _ => continue,
        };
        match remove(&path) {
            Ok(()) => say(&format!("{}: removed, {why}", path.display())),
            Err(e) => say(&format!("{}: cannot remove {why}: {e}", path.display())),
        }
    }
    Ok(if verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Removes a file, or a directory with what it holds (symlinks in it are
/// removed, never followed).
fn remove(path: &Path) -> std::io::Result<()> {
    let m = std::fs::symlink_metadata(path)?;
    if m.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_classified_by_name() {
        assert_eq!(classify("ckpt-3"), Entry::Checkpoint(3));
        assert_eq!(classify("ckpt-3.time"), Entry::Timing(3));
        assert_eq!(classify("LATEST.tmp"), Entry::LatestTmp);
        assert_eq!(classify("ATTEMPT"), Entry::Attempt);
        for other in [
            "LATEST",
            "ckpt-",
            "ckpt-x",
            "notes.txt",
            "ckpt-3.tmp.",
            "x.tmp.4",
            "ckpt-3.tmp.77",
        ] {
            assert_eq!(classify(other), Entry::Other, "{other}");
        }
    }
}
