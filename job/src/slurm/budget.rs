//! The dump-time budget of `ckpt slurm`: every checkpoint is timed from the
//! signal to the commit of `LATEST`, and compared with the time Slurm
//! gives before it kills the job (the lead).
//!
//! The lead of a checkpoint is `--lead SECS` if given; else, when the job
//! record says the job is preempted (`PreemptTime` set), its partition's
//! `GraceTime`; else the time left to the job's time limit when the signal
//! came (`TimeLimit - RunTime`). `KillWait` comes on top and is not
//! counted: it is the slack, not the plan.
//!
//! A timed checkpoint leaves `DIR/ckpt-N.time` (`took_ms`, and `lead_s`
//! when the lead was known). At the next start the last committed
//! checkpoint's time is compared with `--lead`, else with the smaller of
//! the partition's `GraceTime` (when not 0) and the lead recorded with it.
//! `DIR/ATTEMPT` is written when a checkpoint begins and removed when it
//! ends; found at a start, it means the job was killed during a dump.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::client::{CLIENT_TIMEOUT, JobRecord, scontrol, wait_bounded};
use super::{ATTEMPT, Warn};

/// Writing a timing or attempt record failed.
#[derive(Debug, thiserror::Error)]
#[error("{}: {step}", path.display())]
pub struct RecordError {
    /// The record.
    pub path: PathBuf,
    /// `create` or `write`.
    pub step: &'static str,
    /// Its error.
    #[source]
    pub source: std::io::Error,
}

/// Suffix of a checkpoint's timing record: `ckpt-N.time`.
pub const TIMING_SUFFIX: &str = ".time";
/// The most a timing or attempt record may hold (they are a few lines).
const RECORD_MAX: u64 = 4096;
/// Keys of the records.
const TOOK_KEY: &str = "took_ms";
const LEAD_KEY: &str = "lead_s";
const BEGAN_KEY: &str = "began_unix_s";
/// `scontrol`'s name for a time limit that is not one.
const UNLIMITED: &str = "UNLIMITED";

/// Where a lead time comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeadSource {
    /// `--lead SECS`.
    Flag,
    /// The partition's `GraceTime` (preemption).
    GraceTime {
        /// The job's partition.
        partition: String,
    },
    /// The time left to the job's time limit at the signal.
    TimeLeft,
    /// The lead recorded with the last checkpoint.
    Recorded,
}

/// The time Slurm gives a checkpoint, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lead {
    /// How long.
    pub time: Duration,
    /// Where it comes from.
    pub source: LeadSource,
}

impl std::fmt::Display for Lead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} s lead (", self.time.as_secs())?;
        match &self.source {
            LeadSource::Flag => write!(f, "--lead")?,
            LeadSource::GraceTime { partition } => write!(f, "GraceTime of partition {partition}")?,
            LeadSource::TimeLeft => write!(f, "time left to the job's limit at the signal")?,
            LeadSource::Recorded => write!(f, "that of the last checkpoint")?,
        }
        write!(f, ")")
    }
}

/// How long one checkpoint took, and the lead it had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timing {
    /// From the signal to the commit.
    pub took: Duration,
    /// The lead it had, when known.
    pub lead: Option<Duration>,
}

impl Timing {
    /// Writes `DIR/NAME.time` (replacing one a failed run may have left).
    pub fn write(&self, dir: &Path, name: &str) -> Result<(), RecordError> {
        let mut text = format!("{TOOK_KEY} {}\n", self.took.as_millis());
        if let Some(l) = self.lead {
            text.push_str(&format!("{LEAD_KEY} {}\n", l.as_secs()));
        }
        write_private(&dir.join(format!("{name}{TIMING_SUFFIX}")), &text)
    }

    /// Reads `DIR/NAME.time`, if there is one.
    pub fn read(dir: &Path, name: &str) -> Option<Timing> {
        let text = read_small(&dir.join(format!("{name}{TIMING_SUFFIX}")))?;
        let took = Duration::from_millis(value(&text, TOOK_KEY)?);
        let lead = value(&text, LEAD_KEY).map(Duration::from_secs);
        Some(Timing { took, lead })
    }
}

/// The number after `key ` in a record.
fn value(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A record's text, at most [`RECORD_MAX`] bytes, never through a
/// symbolic link; `None` if it cannot be read.
fn read_small(path: &Path) -> Option<String> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let mut text = String::new();
    f.take(RECORD_MAX).read_to_string(&mut text).ok()?;
    Some(text)
}

/// Writes `path` 0600 without following a symlink, replacing what is there.
fn write_private(path: &Path, text: &str) -> Result<(), RecordError> {
    let failed = |step| {
        let path = path.to_path_buf();
        move |source| RecordError { path, step, source }
    };
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(failed("create"))?;
    f.write_all(text.as_bytes()).map_err(failed("write"))
}

/// A checkpoint in progress: marks `DIR/ATTEMPT` and asks Slurm, while the
/// dump runs, what lead it has.
pub struct Attempt {
    /// When the signal was taken.
    began: Instant,
    /// `--lead`, if given.
    flag: Option<Duration>,
    /// `scontrol show job`, asked at the signal (without `--lead`).
    query: Option<Child>,
}

impl Attempt {
    /// Called the moment the signal is taken.
    pub fn begin(dir: &Path, job: &str, flag: Option<Duration>, warn: Warn<'_>) -> Attempt {
        let began = Instant::now();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        if let Err(e) = write_private(&dir.join(ATTEMPT), &format!("{BEGAN_KEY} {now}\n")) {
            warn(&format!("{e:#} (the next start cannot tell a killed dump)"));
        }
        let query = match flag {
            Some(_) => None,
            None => Command::new("scontrol")
                .args(["show", "job", job])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .ok(),
        };
        Attempt { began, flag, query }
    }

    /// The checkpoint did not happen (the dump failed): no record.
    pub fn abandon(self, dir: &Path) {
        let _ = std::fs::remove_file(dir.join(ATTEMPT));
        if let Some(mut c) = self.query {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `LATEST` names the new checkpoint `name`: records its time and warns
    /// when it took longer than its lead. Returns the time and the lead.
    pub fn committed(self, dir: &Path, name: &str, warn: Warn<'_>) -> (Duration, Option<Lead>) {
        let took = self.began.elapsed();
        let lead = match self.flag {
            Some(time) => Some(Lead {
                time,
                source: LeadSource::Flag,
            }),
            None => {
                let deadline = self.began + CLIENT_TIMEOUT;
                self.query.and_then(|q| lead_from_query(q, deadline))
            }
        };
        let timing = Timing {
            took,
            lead: lead.as_ref().map(|l| l.time),
        };
        if let Err(e) = timing.write(dir, name) {
            warn(&format!("{e:#} (the next start cannot check the budget)"));
        }
        let _ = std::fs::remove_file(dir.join(ATTEMPT));
        if let Some(l) = &lead
            && took > l.time
        {
            warn(&format!(
                "checkpoint {name} took {:.1} s from the signal to its commit, more than the {l}: Slurm may kill the job before a checkpoint commits (give more lead or GraceTime)",
                took.as_secs_f64()
            ));
        }
        (took, lead)
    }
}

/// The lead the job record (asked at the signal) gives.
fn lead_from_query(child: Child, deadline: Instant) -> Option<Lead> {
    let out = wait_bounded(child, deadline).ok()?;
    let record = JobRecord::parse(&String::from_utf8_lossy(&out.stdout));
    if record.preempted() {
        let partition = record.get("Partition")?.to_string();
        let time = grace_time(&partition)?;
        return Some(Lead {
            time,
            source: LeadSource::GraceTime { partition },
        });
    }
    let limit = parse_duration(record.get("TimeLimit")?)?;
    let run = parse_duration(record.get("RunTime")?)?;
    Some(Lead {
        time: limit.saturating_sub(run),
        source: LeadSource::TimeLeft,
    })
}

/// A partition's `GraceTime` (seconds), as `scontrol show partition` says.
fn grace_time(partition: &str) -> Option<Duration> {
    let text = scontrol(&["show", "partition", "-o", partition]).ok()?;
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("GraceTime="))
        .and_then(|v| v.parse().ok())
        .map(Duration::from_secs)
}

/// `[DAYS-][[HH:]MM:]SS` as Slurm prints times; `None` for `UNLIMITED` or
/// anything else.
pub fn parse_duration(s: &str) -> Option<Duration> {
    if s == UNLIMITED {
        return None;
    }
    let (days, clock) = match s.split_once('-') {
        Some((d, c)) => (d.parse::<u64>().ok()?, c),
        None => (0, s),
    };
    let parts: Vec<u64> = clock
        .split(':')
        .map(|p| p.parse().ok())
        .collect::<Option<_>>()?;
    if parts.is_empty() || parts.len() > 3 {
        return None;
    }
    let secs = parts.iter().fold(0u64, |acc, p| acc * 60 + p);
    Some(Duration::from_secs(days * 86_400 + secs))
}

/// At a start: reports a dump the job was killed during, and a last
/// checkpoint that took longer than the lead this run will have.
pub fn check_at_start(dir: &Path, committed: Option<&str>, flag: Option<Duration>, warn: Warn<'_>) {
    let attempt = dir.join(ATTEMPT);
    if let Some(text) = read_small(&attempt) {
        let ago = value(&text, BEGAN_KEY).map_or_else(String::new, |t| {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            format!(", begun {} s ago,", now.saturating_sub(t))
        });
        warn(&format!(
            "the last checkpoint{ago} never committed: the job was ended during the dump, which does not fit the time Slurm gives (give more lead or GraceTime)"
        ));
        let _ = std::fs::remove_file(&attempt);
    }
    let Some(name) = committed else { return };
    let Some(timing) = Timing::read(dir, name) else {
        return;
    };
    let lead = match flag {
        Some(time) => Some(Lead {
            time,
            source: LeadSource::Flag,
        }),
        None => {
            let grace = std::env::var("SLURM_JOB_PARTITION")
                .ok()
                .filter(|p| !p.is_empty())
                .and_then(|partition| {
                    let time = grace_time(&partition).filter(|t| !t.is_zero())?;
                    Some(Lead {
                        time,
                        source: LeadSource::GraceTime { partition },
                    })
                });
            let recorded = timing.lead.map(|time| Lead {
                time,
                source: LeadSource::Recorded,
            });
            [grace, recorded]
                .into_iter()
                .flatten()
                .min_by_key(|l| l.time)
        }
    };
    if let Some(l) = lead
        && timing.took > l.time
    {
        warn(&format!(
            "the last checkpoint ({name}) took {:.1} s, more than the {l}: the next one may not commit before Slurm kills the job",
            timing.took.as_secs_f64()
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_durations() {
        assert_eq!(parse_duration("00:05:00"), Some(Duration::from_secs(300)));
        assert_eq!(
            parse_duration("1-00:00:02"),
            Some(Duration::from_secs(86_402))
        );
        assert_eq!(parse_duration("4:33"), Some(Duration::from_secs(273)));
        assert_eq!(parse_duration("UNLIMITED"), None);
        assert_eq!(parse_duration("1:2:3:4"), None);
        assert_eq!(parse_duration("x"), None);
    }

    #[test]
    fn timing_round_trips() {
        let d = tempfile::tempdir().unwrap();
        let t = Timing {
            took: Duration::from_millis(1234),
            lead: Some(Duration::from_secs(20)),
        };
        t.write(d.path(), "ckpt-3").unwrap();
        assert_eq!(Timing::read(d.path(), "ckpt-3"), Some(t));
        assert_eq!(Timing::read(d.path(), "ckpt-4"), None);
    }
}
