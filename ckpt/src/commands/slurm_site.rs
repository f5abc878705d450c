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
use std::process::{Child, Command, ExitCode, Output, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::Signal;

use super as wrapper;
use super::{ATTEMPT, LATEST};
use ckpt_job::JobUser;

/// Prefix of a job `Comment` that registers a `ckpt slurm` job.
const REGISTRATION_PREFIX: &str = "ckpt-slurm:";
/// What `scontrol` prints for an unset field.
const UNSET: [&str; 3] = ["(null)", "None", "Unknown"];

/// A job's record as `scontrol show job JOB` prints it: `Key=Value` words,
/// except the `Comment` line, whose value is the rest of the line.
#[derive(Debug, Default)]
pub struct JobRecord {
    fields: Vec<(String, String)>,
    comment: Option<String>,
}

impl JobRecord {
    /// Asks the controller for job `job`'s record.
    pub fn query(job: &str) -> anyhow::Result<JobRecord> {
        let text = scontrol(&["show", "job", job])?;
        let record = JobRecord::parse(&text);
        if record.get("JobId") != Some(job) {
            bail!("scontrol show job {job}: no record of job {job}");
        }
        Ok(record)
    }

    /// Parses `scontrol show job`'s multi-line form.
    pub fn parse(text: &str) -> JobRecord {
        let mut r = JobRecord::default();
        for line in text.lines() {
            let line = line.trim_start();
            if let Some(c) = line.strip_prefix("Comment=") {
                r.comment = Some(c.trim_end().to_string());
                continue;
            }
            for word in line.split_whitespace() {
                if let Some((k, v)) = word.split_once('=') {
                    r.fields.push((k.to_string(), v.to_string()));
                }
            }
        }
        r
    }

    /// The value of field `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .filter(|v| !UNSET.contains(v))
    }

    /// The job's comment, if it has one.
    pub fn comment(&self) -> Option<&str> {
        self.comment
            .as_deref()
            .filter(|c| !c.is_empty() && !UNSET.contains(c))
    }

    /// Whether the job has been told it is preempted (its grace time runs).
    pub fn preempted(&self) -> bool {
        self.get("PreemptTime").is_some()
    }

    /// The registration `ckpt slurm` left in the comment, if any.
    pub fn registration(&self) -> Option<anyhow::Result<Registration>> {
        let c = self.comment()?;
        c.starts_with(REGISTRATION_PREFIX)
            .then(|| Registration::from_str(c))
    }
}

/// What `ckpt slurm` records in its job's comment: the signal that asks it
/// for a checkpoint and its checkpoint directory.
#[derive(Debug, PartialEq, Eq)]
pub struct Registration {
    pub signal: Signal,
    pub dir: PathBuf,
}

impl std::fmt::Display for Registration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sig = self.signal.as_str();
        let sig = sig.strip_prefix("SIG").unwrap_or(sig);
        write!(f, "{REGISTRATION_PREFIX}{sig}:{}", self.dir.display())
    }
}

impl FromStr for Registration {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> anyhow::Result<Registration> {
        let rest = s
            .strip_prefix(REGISTRATION_PREFIX)
            .with_context(|| format!("comment {s:?} does not start with {REGISTRATION_PREFIX}"))?;
        let (sig, dir) = rest
            .split_once(':')
            .with_context(|| format!("comment {s:?} is not {REGISTRATION_PREFIX}SIG:DIR"))?;
        let signal =
            wrapper::parse_signal(sig).map_err(|e| anyhow::anyhow!("comment {s:?}: {e}"))?;
        let dir = PathBuf::from(dir);
        if !dir.is_absolute() {
            bail!("comment {s:?}: the directory is not an absolute path");
        }
        Ok(Registration { signal, dir })
    }
}

/// The longest a Slurm client may take: the wrapper must not hang on a
/// controller that does not answer (before a requeue, or at a start).
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a client that has not ended is looked at.
const CLIENT_POLL: Duration = Duration::from_millis(10);

/// Runs `scontrol ARGS` (at most [`CLIENT_TIMEOUT`]) and returns its
/// stdout; a non-zero exit is an error carrying its stderr.
pub fn scontrol(args: &[&str]) -> anyhow::Result<String> {
    let child = Command::new("scontrol")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run scontrol {}", args.join(" ")))?;
    let out = wait_bounded(child, Instant::now() + CLIENT_TIMEOUT)
        .with_context(|| format!("scontrol {}", args.join(" ")))?;
    if !out.status.success() {
        bail!(
            "scontrol {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits for a client (its output is a few lines, which fit in the pipe)
/// until `deadline`, then kills it.
pub fn wait_bounded(mut child: Child, deadline: Instant) -> anyhow::Result<Output> {
    loop {
        if child.try_wait().context("wait")?.is_some() {
            return child.wait_with_output().context("read its output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("no answer within {CLIENT_TIMEOUT:?}");
        }
        std::thread::sleep(CLIENT_POLL);
    }
}

/// Records the wrapper's signal and directory in its job's comment, unless
/// the job carries a comment of its own (that one is kept, and the site's
/// hooks will not find the job: one line says so).
pub fn register(job: &str, reg: &Registration) {
    let record = match JobRecord::query(job) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "ckpt slurm: job {job}: not registered for the site's hooks (trigger, epilog): {e:#}"
            );
            return;
        }
    };
    let wanted = reg.to_string();
    match record.comment() {
        Some(c) if c == wanted => return,
        Some(c) if !c.starts_with(REGISTRATION_PREFIX) => {
            eprintln!(
                "ckpt slurm: job {job} has a comment of its own ({c:?}): not registered for the site's hooks (trigger, epilog)"
            );
            return;
        }
        _ => {}
    }
    let comment = format!("Comment={wanted}");
    let id = format!("JobId={job}");
    if let Err(e) = scontrol(&["update", &id, &comment]) {
        eprintln!(
            "ckpt slurm: job {job}: not registered for the site's hooks (trigger, epilog): {e:#}"
        );
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
    if let Some(n) = wrapper::number_of(name) {
        return Entry::Checkpoint(n);
    }
    if name == format!("{LATEST}.tmp") {
        return Entry::LatestTmp;
    }
    if name == ATTEMPT {
        return Entry::Attempt;
    }
    if let Some(n) = name
        .strip_suffix(super::budget::TIMING_SUFFIX)
        .and_then(wrapper::number_of)
    {
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

    let committed = wrapper::committed(&dir).with_context(|| format!("job {job}"))?;
    let committed_number = committed.as_deref().and_then(wrapper::number_of);
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
    let present = |n: u64| names.iter().any(|m| wrapper::number_of(m) == Some(n));
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
    fn record_parses_fields_and_a_comment_with_spaces() {
        let r = JobRecord::parse(
            "JobId=13 JobName=ss-job.sh\n   JobState=RUNNING Reason=None\n   RunTime=00:00:02 TimeLimit=00:05:00\n   PreemptEligibleTime=2026-11-23T16:21:33 PreemptTime=None\n   Partition=debug\n   Comment=ckpt-slurm:USR1:/a dir/x \n",
        );
        assert_eq!(r.get("JobId"), Some("13"));
        assert_eq!(r.get("Partition"), Some("debug"));
        assert!(!r.preempted());
        let reg = r.registration().unwrap().unwrap();
        assert_eq!(reg.signal, Signal::SIGUSR1);
        assert_eq!(reg.dir, PathBuf::from("/a dir/x"));
        assert_eq!(reg.to_string(), "ckpt-slurm:USR1:/a dir/x");
    }

    #[test]
    fn registration_refuses_relative_dirs_and_bad_signals() {
        assert!(Registration::from_str("ckpt-slurm:USR1:rel").is_err());
        assert!(Registration::from_str("ckpt-slurm:KILL:/d").is_err());
        assert!(Registration::from_str("ckpt-slurm:/d").is_err());
        assert!(
            JobRecord::parse("JobId=1\n   Comment=mine\n")
                .registration()
                .is_none()
        );
    }

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
