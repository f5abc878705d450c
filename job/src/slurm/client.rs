//! Talking to Slurm: a job's record (`scontrol show job`), the
//! registration `ckpt slurm` leaves in its job's comment for the site's
//! hooks, and bounded runs of Slurm's clients (the wrapper must not hang on
//! a controller that does not answer).

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

/// What went wrong asking Slurm; each names the command or job.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    /// A client did not start.
    #[error("cannot run {command}")]
    Spawn {
        /// The command line.
        command: String,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
    /// A client did not answer.
    #[error("{command}")]
    Client {
        /// The command line.
        command: String,
        /// What went wrong waiting for it.
        #[source]
        source: WaitError,
    },
    /// A client failed.
    #[error("{command} failed ({status}): {stderr}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: ExitStatus,
        /// What it said.
        stderr: String,
    },
    /// The controller has no record of the job.
    #[error("scontrol show job {job}: no record of job {job}")]
    NoRecord {
        /// The job id.
        job: String,
    },
}

/// Waiting for a Slurm client failed.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// Waiting itself failed.
    #[error("wait")]
    Wait(#[source] std::io::Error),
    /// Its output could not be read.
    #[error("read its output")]
    Output(#[source] std::io::Error),
    /// It did not end in time (it was killed).
    #[error("no answer within {CLIENT_TIMEOUT:?}")]
    NoAnswer,
}

/// A job comment that should be a registration and is not one.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// It does not start with the prefix.
    #[error("comment {comment:?} does not start with {REGISTRATION_PREFIX}")]
    NoPrefix {
        /// The comment.
        comment: String,
    },
    /// It is not `ckpt-slurm:SIG:DIR`.
    #[error("comment {comment:?} is not {REGISTRATION_PREFIX}SIG:DIR")]
    NotSigDir {
        /// The comment.
        comment: String,
    },
    /// Its signal is not one.
    #[error("comment {comment:?}: {source}")]
    Signal {
        /// The comment.
        comment: String,
        /// Why the signal was refused.
        #[source]
        source: SignalError,
    },
    /// Its directory is relative.
    #[error("comment {comment:?}: the directory is not an absolute path")]
    Relative {
        /// The comment.
        comment: String,
    },
}

/// A checkpoint signal refused.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    /// A number that is no signal.
    #[error("{given}: not a signal number")]
    Number {
        /// What was given.
        given: String,
    },
    /// A name that is no signal.
    #[error("{given}: not a signal name")]
    Name {
        /// What was given.
        given: String,
    },
    /// A signal the wrapper cannot take for a checkpoint.
    #[error(
        "{given}: cannot be the checkpoint signal (uncatchable, or sent by Slurm or the kernel for other reasons)"
    )]
    Reserved {
        /// What was given.
        given: String,
    },
}

/// This module's results.
type Result<T, E = SlurmError> = std::result::Result<T, E>;

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
    pub fn query(job: &str) -> Result<JobRecord> {
        let text = scontrol(&["show", "job", job])?;
        let record = JobRecord::parse(&text);
        if record.get("JobId") != Some(job) {
            let job = job.to_string();
            return Err(SlurmError::NoRecord { job });
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
    pub fn registration(&self) -> Option<Result<Registration, RegistrationError>> {
        let c = self.comment()?;
        c.starts_with(REGISTRATION_PREFIX)
            .then(|| Registration::from_str(c))
    }
}

/// What `ckpt slurm` records in its job's comment: the signal that asks it
/// for a checkpoint and its checkpoint directory.
#[derive(Debug, PartialEq, Eq)]
pub struct Registration {
    /// The checkpoint signal.
    pub signal: Signal,
    /// The checkpoint directory.
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
    type Err = RegistrationError;

    fn from_str(s: &str) -> Result<Registration, RegistrationError> {
        let comment = || s.to_string();
        let rest = s
            .strip_prefix(REGISTRATION_PREFIX)
            .ok_or_else(|| RegistrationError::NoPrefix { comment: comment() })?;
        let (sig, dir) = rest
            .split_once(':')
            .ok_or_else(|| RegistrationError::NotSigDir { comment: comment() })?;
        let signal = parse_signal(sig).map_err(|source| RegistrationError::Signal {
            comment: comment(),
            source,
        })?;
        let dir = PathBuf::from(dir);
        if !dir.is_absolute() {
            return Err(RegistrationError::Relative { comment: comment() });
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
pub fn scontrol(args: &[&str]) -> Result<String> {
    let command = format!("scontrol {}", args.join(" "));
    let spawned = Command::new("scontrol")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let child = match spawned {
        Ok(c) => c,
        Err(source) => return Err(SlurmError::Spawn { command, source }),
    };
    let out = match wait_bounded(child, Instant::now() + CLIENT_TIMEOUT) {
        Ok(o) => o,
        Err(source) => return Err(SlurmError::Client { command, source }),
    };
    if !out.status.success() {
        return Err(SlurmError::Failed {
            command,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits for a client (its output is a few lines, which fit in the pipe)
/// until `deadline`, then kills it.
pub fn wait_bounded(mut child: Child, deadline: Instant) -> Result<Output, WaitError> {
    loop {
        if child.try_wait().map_err(WaitError::Wait)?.is_some() {
            return child.wait_with_output().map_err(WaitError::Output);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(WaitError::NoAnswer);
        }
        std::thread::sleep(CLIENT_POLL);
    }
}

/// `USR1`, `SIGUSR1` or a number; never a signal the wrapper needs for
/// itself or that cannot be caught.
pub fn parse_signal(s: &str) -> Result<Signal, SignalError> {
    let given = || s.to_string();
    let sig = match s.parse::<i32>() {
        Ok(n) => Signal::try_from(n).map_err(|_| SignalError::Number { given: given() })?,
        Err(_) => {
            let name = s.to_ascii_uppercase();
            let full = if name.starts_with("SIG") {
                name
            } else {
                format!("SIG{name}")
            };
            Signal::from_str(&full).map_err(|_| SignalError::Name { given: given() })?
        }
    };
    match sig {
        Signal::SIGKILL | Signal::SIGSTOP | Signal::SIGCONT | Signal::SIGCHLD => {
            Err(SignalError::Reserved { given: given() })
        }
        _ => Ok(sig),
    }
}

/// What [`register`] did.
#[derive(Debug, PartialEq, Eq)]
pub enum Registered {
    /// The comment already was this registration.
    Already,
    /// The comment is now this registration.
    Updated,
    /// The job carries a comment of its own, which is kept: the site's
    /// hooks will not find the job.
    OwnComment(String),
}

/// Records the wrapper's signal and directory in its job's comment, unless
/// the job carries a comment of its own.
pub fn register(job: &str, reg: &Registration) -> Result<Registered> {
    let record = JobRecord::query(job)?;
    let wanted = reg.to_string();
    match record.comment() {
        Some(c) if c == wanted => return Ok(Registered::Already),
        Some(c) if !c.starts_with(REGISTRATION_PREFIX) => {
            return Ok(Registered::OwnComment(c.to_string()));
        }
        _ => {}
    }
    let comment = format!("Comment={wanted}");
    let id = format!("JobId={job}");
    scontrol(&["update", &id, &comment])?;
    Ok(Registered::Updated)
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
}
