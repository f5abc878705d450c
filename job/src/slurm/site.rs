//! The site's hooks around `ckpt slurm`: `ckpt slurm trigger JOB` (the
//! program of a controller-side `strigger`: asks a registered, running job
//! to checkpoint now by sending its signal to its batch step) and the node
//! Epilog's tidying of a job's checkpoint directory (the committed
//! checkpoint verified and kept, what a killed dump left removed; for a job
//! of several nodes, every part of its last committed epoch verified).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ckpt_image::{ImageDir, ImageKey};

use super::budget::TIMING_SUFFIX;
use super::checkpoints::{CheckpointsError, committed, number_of};
use super::client::{JobRecord, RegistrationError, SlurmError};
use super::nodes::JOB_SUBDIR;
use super::{ATTEMPT, LATEST};
use crate::agent::epoch_dir;
use crate::dir::{DirError, JobDir, check_name};

/// What went wrong in a site hook; each names the job and file.
#[derive(Debug, thiserror::Error)]
pub enum SiteError {
    /// Asking Slurm failed.
    #[error(transparent)]
    Slurm(#[from] SlurmError),
    /// Not a job id.
    #[error("{job:?}: not a job id")]
    NotJobId {
        /// What was given.
        job: String,
    },
    /// The job's comment is a broken registration.
    #[error("job {job}")]
    Registration {
        /// The job.
        job: String,
        /// Why it is broken.
        #[source]
        source: RegistrationError,
    },
    /// `scancel` did not start.
    #[error("cannot run scancel")]
    Scancel(#[source] std::io::Error),
    /// `scancel` failed.
    #[error("job {job}: scancel --batch --signal={signal} failed ({status}): {stderr}")]
    ScancelFailed {
        /// The job.
        job: String,
        /// The signal's name without `SIG`.
        signal: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it said.
        stderr: String,
    },
    /// A file operation on the checkpoint directory failed.
    #[error("{}: {step}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was done.
        step: &'static str,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
    /// The checkpoint directory is not one.
    #[error("job {job}: {}: not a directory", dir.display())]
    NotDir {
        /// The job.
        job: String,
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// The checkpoint directory belongs to another user.
    #[error(
        "job {job}: {}: owned by uid {uid}, not by ckpt's user {me}: run the epilog as the job's user (--as-user UID:GID)",
        dir.display()
    )]
    NotOurs {
        /// The job.
        job: String,
        /// The checkpoint directory.
        dir: PathBuf,
        /// Its owner.
        uid: u32,
        /// The effective uid ckpt runs as.
        me: u32,
    },
    /// `LATEST` cannot be read back.
    #[error("job {job}")]
    Committed {
        /// The job.
        job: String,
        /// Why.
        #[source]
        source: CheckpointsError,
    },
    /// The job directory of a job of several nodes (`DIR/job`) cannot be
    /// read.
    #[error("job {job}")]
    JobDir {
        /// The job.
        job: String,
        /// Why.
        #[source]
        source: DirError,
    },
    /// The image key, needed to verify the committed checkpoint, did not
    /// load. Its error is part of the message, not a cause below it: a
    /// missing key is the site's setup, not a damaged checkpoint.
    #[error("cannot load the image key to verify the committed checkpoint: {reason}")]
    NoKey {
        /// Why the key did not load.
        reason: String,
    },
}

/// This module's results.
type Result<T, E = SiteError> = std::result::Result<T, E>;

/// What [`trigger`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Triggered {
    /// The job is no `ckpt slurm` job: nothing sent.
    NotRegistered,
    /// The job does not run: nothing sent.
    NotRunning {
        /// Its state.
        state: String,
    },
    /// Its signal went to its batch step.
    Sent {
        /// The signal's name without `SIG`.
        signal: String,
        /// The checkpoint directory it checkpoints into.
        dir: PathBuf,
    },
}

/// Sends a registered, running job's checkpoint signal to its wrapper (the
/// batch step's shell, which `exec`ed ckpt). Any other job is left alone:
/// its batch shell may die of the signal.
pub fn trigger(job: &str) -> Result<Triggered> {
    if job.is_empty() || !job.bytes().all(|b| b.is_ascii_digit()) {
        let job = job.to_string();
        return Err(SiteError::NotJobId { job });
    }
    let record = JobRecord::query(job)?;
    let reg = match record.registration() {
        None => return Ok(Triggered::NotRegistered),
        Some(r) => r.map_err(|source| SiteError::Registration {
            job: job.to_string(),
            source,
        })?,
    };
    let state = record.get("JobState").unwrap_or("?");
    if state != "RUNNING" {
        let state = state.to_string();
        return Ok(Triggered::NotRunning { state });
    }
    let sig = reg.signal.as_str();
    let signal = sig.strip_prefix("SIG").unwrap_or(sig).to_string();
    let out = Command::new("scancel")
        .arg("--batch")
        .arg(format!("--signal={signal}"))
        .arg(job)
        .stdin(Stdio::null())
        .output()
        .map_err(SiteError::Scancel)?;
    if !out.status.success() {
        return Err(SiteError::ScancelFailed {
            job: job.to_string(),
            signal,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(Triggered::Sent {
        signal,
        dir: reg.dir,
    })
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

/// What a checkpoint directory's entry `name` is.
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

/// A job's checkpoint directory as the node Epilog tidies it; each action
/// is one line to `say`.
pub struct Epilog<'a> {
    /// The job.
    pub job: &'a str,
    /// Its checkpoint directory.
    pub dir: &'a Path,
    /// Where the lines go (the slurmd log).
    pub say: &'a dyn Fn(&str),
}

impl Epilog<'_> {
    /// Verifies the committed checkpoint with `key` (loaded, or why not)
    /// and removes what a killed dump left (`ckpt-N` newer than `LATEST`,
    /// unfinished commits, orphaned timing records), never the committed
    /// checkpoint. Returns whether the committed checkpoint, if any,
    /// verified (one that fails is kept, for a human to look at).
    pub fn tidy(&self, key: Result<&ImageKey, String>) -> Result<bool> {
        if !self.check_owner()? {
            return Ok(true);
        }
        let committed = committed(self.dir).map_err(|source| SiteError::Committed {
            job: self.job.to_string(),
            source,
        })?;
        let jobdir = self.dir.join(JOB_SUBDIR);
        let verified = if committed.is_none() && jobdir.is_dir() {
            self.verify_epoch(&jobdir, key)?
        } else {
            self.verify(committed.as_deref(), key)?
        };
        self.sweep(committed.as_deref().and_then(number_of))?;
        Ok(verified)
    }

    /// Verifies every part of the last committed epoch of the job of
    /// several nodes in `jobdir` (`DIR/job`, `ckpt job`'s directory): each
    /// part's images as a restore takes them, and that they are the images
    /// the epoch's record names (the crc32c of their manifest). Returns
    /// whether every part verified; those that fail are kept.
    fn verify_epoch(&self, jobdir: &Path, key: Result<&ImageKey, String>) -> Result<bool> {
        let job_err = |source| SiteError::JobDir {
            job: self.job.to_string(),
            source,
        };
        let dir = JobDir::open(jobdir).map_err(job_err)?;
        let last = dir
            .epochs()
            .map_err(job_err)?
            .into_iter()
            .find(|e| e.last_committed);
        let record = match last {
            Some(e) => dir.store().map_err(job_err)?.load(e.epoch),
            None => None,
        };
        let Some(record) = record else {
            (self.say)(&format!("{}: nothing committed", jobdir.display()));
            return Ok(true);
        };
        let key = key.map_err(|reason| SiteError::NoKey { reason })?;
        let epoch = record.epoch;
        let mut verified = true;
        for part in &record.nodes {
            let line = match self.verify_part(&dir, epoch, part, key) {
                Ok(line) => line,
                Err(line) => {
                    verified = false;
                    line
                }
            };
            (self.say)(&line);
        }
        Ok(verified)
    }

    /// Verifies one part of committed epoch `epoch`: the line to say, as
    /// `Err` when it fails.
    fn verify_part(
        &self,
        dir: &JobDir,
        epoch: u64,
        part: &ckpt_coord::store::NodeManifest,
        key: &ImageKey,
    ) -> Result<String, String> {
        let name = &part.node;
        if let Err(e) = check_name("part", name) {
            return Err(format!(
                "{}: committed epoch {epoch} names a part that cannot be: {e}",
                dir.path().display()
            ));
        }
        let path = epoch_dir(&dir.part_dir(name), epoch);
        let fails = |why: String| {
            format!(
                "{}: part {name} of committed epoch {epoch} fails verification, kept: {why}",
                path.display()
            )
        };
        let images = ImageDir::open(&path, key).map_err(|e| fails(e.to_string()))?;
        let manifest = path.join(ckpt_image::MANIFEST_NAME);
        let bytes = std::fs::read(&manifest)
            .map_err(|e| fails(format!("reading {}: {e}", manifest.display())))?;
        if crc32c::crc32c(&bytes) != part.manifest_crc32c {
            return Err(fails(
                "its manifest is not the one the epoch's record names".into(),
            ));
        }
        Ok(format!(
            "{}: part {name} of committed epoch {epoch} verified (seal and checksums of {} files)",
            path.display(),
            images.manifest().files.len()
        ))
    }

    /// Whether the directory is there, refusing one that is not ours.
    fn check_owner(&self) -> Result<bool> {
        let (job, dir) = (self.job.to_string(), self.dir.to_path_buf());
        let meta = match std::fs::symlink_metadata(self.dir) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                (self.say)(&format!("{}: no checkpoint directory", dir.display()));
                return Ok(false);
            }
            Err(source) => {
                let (path, step) = (dir, "stat");
                return Err(SiteError::Io { path, step, source });
            }
        };
        if !meta.is_dir() {
            return Err(SiteError::NotDir { job, dir });
        }
        // Root tidying a user's directory could be led by a symlink
        // swapped in; the Epilog runs as the job's user (`--as-user`).
        let me = nix::unistd::geteuid().as_raw();
        if meta.uid() != me {
            let uid = meta.uid();
            return Err(SiteError::NotOurs { job, dir, uid, me });
        }
        Ok(true)
    }

    /// Verifies the committed checkpoint `name`, if any.
    fn verify(&self, name: Option<&str>, key: Result<&ImageKey, String>) -> Result<bool> {
        let Some(name) = name else {
            (self.say)(&format!("{}: nothing committed", self.dir.display()));
            return Ok(true);
        };
        let path = self.dir.join(name);
        let key = key.map_err(|reason| SiteError::NoKey { reason })?;
        match ImageDir::open(&path, key) {
            Ok(d) => {
                (self.say)(&format!(
                    "{}: committed checkpoint verified (seal and checksums of {} files)",
                    path.display(),
                    d.manifest().files.len()
                ));
                Ok(true)
            }
            Err(e) => {
                (self.say)(&format!(
                    "{}: committed checkpoint fails verification, kept: {e}",
                    path.display()
                ));
                Ok(false)
            }
        }
    }

    /// Removes what a killed dump left; `committed` is the committed
    /// checkpoint's number.
    fn sweep(&self, committed: Option<u64>) -> Result<()> {
        let read = |source| SiteError::Io {
            path: self.dir.to_path_buf(),
            step: "read",
            source,
        };
        let mut names: Vec<String> = Vec::new();
        for e in std::fs::read_dir(self.dir).map_err(read)? {
            if let Some(n) = e.map_err(read)?.file_name().to_str() {
                names.push(n.to_string());
            }
        }
        names.sort();
        let present = |n: u64| names.iter().any(|m| number_of(m) == Some(n));
        for name in &names {
            let path = self.dir.join(name);
            let why = match classify(name) {
                Entry::Checkpoint(n) if committed.is_none_or(|c| n > c) => {
                    "uncommitted checkpoint (newer than LATEST)"
                }
                Entry::Timing(n) if !present(n) => "timing record of a checkpoint that is gone",
                Entry::LatestTmp => "an unfinished commit of LATEST",
                Entry::Attempt => {
                    (self.say)(&format!(
                        "{}: a checkpoint began and never committed (the job ended during it); the next start reports it",
                        path.display()
                    ));
                    continue;
                }
                _ => continue,
            };
            match remove(&path) {
                Ok(()) => (self.say)(&format!("{}: removed, {why}", path.display())),
                Err(e) => (self.say)(&format!("{}: cannot remove {why}: {e}", path.display())),
            }
        }
        Ok(())
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
