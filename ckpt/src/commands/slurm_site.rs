//! The site's side of `ckpt slurm`: what an administrator installs around
//! the job wrapper; the command line and the lines printed (the logic is
//! `ckpt_job::slurm::site` and `ckpt_job::slurm::client`).
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
//!   checkpoint (seal and checksums; for a job of several nodes every part
//!   of the last committed epoch in `DIR/job`) and removes what a killed dump left
//!   (`ckpt-N` newer than `LATEST`, unfinished commits; the dumpers'
//!   temporary directories are `ckpt gc`'s), never the committed
//!   checkpoint; one line per action. Run by root with `--as-user`, it
//!   reads the site's key (for an ordinary user's job, that user's key derived
//!   from it, as the ckpt service sealed their images) and then does
//!   everything as the job's user.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use ckpt_job::JobUser;
use ckpt_job::slurm::client::{self, JobRecord, Registered, Registration};
use ckpt_job::slurm::site::{self, Epilog, Triggered};

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
    let line = match site::trigger(job)? {
        Triggered::NotRegistered => {
            format!("ckpt slurm trigger: job {job}: not a ckpt slurm job; nothing sent\n")
        }
        Triggered::NotRunning { state } => {
            format!("ckpt slurm trigger: job {job} is {state}, not RUNNING; nothing sent\n")
        }
        Triggered::Sent { signal, dir } => format!(
            "ckpt slurm trigger: job {job}: SIG{signal} sent to its batch step to checkpoint into {}\n",
            dir.display()
        ),
    };
    crate::commands::print_stdout(&line)?;
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

/// The key an ordinary user's committed checkpoint in `dir` was sealed
/// with: the user's own, derived from the site's, when the ckpt service
/// made it (its seal names that key), else the site's (a checkpoint root
/// made of the user's job). Only the seal is looked at here; the Epilog
/// verifies it and every checksum.
fn users_checkpoint_key(
    dir: &std::path::Path,
    site: ckpt_image::ImageKey,
    uid: u32,
) -> ckpt_image::ImageKey {
    let users = site.for_user(uid);
    let Ok(Some(name)) = ckpt_job::slurm::checkpoints::committed(dir) else {
        return site;
    };
    let ckpt = dir.join(name);
    let read = |n: &str| std::fs::read(ckpt.join(n)).ok();
    match (
        read(ckpt_image::MANIFEST_NAME),
        read(ckpt_image::seal::SEAL_NAME),
    ) {
        (Some(manifest), Some(seal))
            if users.verify(&manifest, &seal) != Err(ckpt_image::seal::SealFailure::OtherKey) =>
        {
            users
        }
        _ => site,
    }
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
    let key = match (key, a.as_user) {
        (Ok(site), Some(user)) if user.uid != 0 => Ok(users_checkpoint_key(&dir, site, user.uid)),
        (key, _) => key,
    };
    let key = key.as_ref().map_err(ToString::to_string);
    let verified = Epilog {
        job: &job,
        dir: &dir,
        say: &say,
    }
    .tidy(key)?;
    Ok(if verified {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
