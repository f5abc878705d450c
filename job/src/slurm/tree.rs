//! The application of a single-node `ckpt slurm` job: started under
//! `ckpt run --pidns` (PID 2 of a PID namespace of its own, so a restart
//! on any node gets its pids back even where the host's are taken), and
//! checkpointed by a `ckpt dump --kill` child into the next `ckpt-N`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::unistd::Pid;

use super::checkpoints::committed;
use super::checkpoints::{CheckpointsError, commit, next_number};
use super::{CKPT_PREFIX, Checkpointing, Then};
use crate::sys::{ChildSignals, child_signals, close_inherited_fds};

/// How long `ckpt run` may take to start the namespace's init.
const INIT_START: Duration = Duration::from_secs(10);
/// How often it is looked for meanwhile.
const INIT_POLL: Duration = Duration::from_millis(10);

/// What went wrong starting or checkpointing the application; each names
/// the program, pid or file.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// No application to run.
    #[error("no application given")]
    NoApp,
    /// The path of this very ckpt is unknown.
    #[error("cannot find the ckpt executable")]
    OwnExe(#[source] std::io::Error),
    /// The application did not start.
    #[error("cannot start {app}")]
    Start {
        /// The application.
        app: String,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
    /// A child's pid does not fit a pid.
    #[error("child pid out of range")]
    PidRange(#[source] std::num::TryFromIntError),
    /// `ckpt run` started no init in time.
    #[error("ckpt run (pid {run}) started no PID namespace init within {INIT_START:?}")]
    NoInit {
        /// `ckpt run`'s pid.
        run: i32,
    },
    /// The checkpoint directory.
    #[error(transparent)]
    Checkpoints(#[from] CheckpointsError),
    /// `ckpt dump` did not start.
    #[error("cannot run ckpt dump")]
    DumpSpawn(#[source] std::io::Error),
    /// `ckpt dump` failed.
    #[error("ckpt dump: {status}: {last}")]
    DumpFailed {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Its last line on stderr.
        last: String,
    },
}

/// This module's results.
type Result<T, E = TreeError> = std::result::Result<T, E>;

/// The application as started.
#[derive(Debug, Clone, Copy)]
pub struct Started {
    /// `ckpt run`, the wrapper's child.
    pub run: Pid,
    /// The init of the application's PID namespace: what a checkpoint saves.
    pub tree: Pid,
}

/// Starts `app` under `ckpt run --pidns`, in its own process group (so
/// Slurm's signals to the batch script's group reach only the wrapper)
/// with the job's stdio and no other fd: whatever the batch environment
/// leaked to the wrapper would only make the tree undumpable (a pipe to
/// outside, a daemon's socket).
pub fn start(app: &[OsString]) -> Result<Started> {
    let (prog, _) = app.split_first().ok_or(TreeError::NoApp)?;
    let exe = std::env::current_exe().map_err(TreeError::OwnExe)?;
    let mut cmd = Command::new(exe);
    cmd.args(["run", "--pidns", "--"])
        .args(app)
        .process_group(0);
    close_inherited_fds(&mut cmd);
    child_signals(&mut cmd, ChildSignals::None);
    let child = cmd.spawn().map_err(|source| TreeError::Start {
        app: prog.to_string_lossy().into_owned(),
        source,
    })?;
    let run = i32::try_from(child.id()).map_err(TreeError::PidRange)?;
    let tree = namespace_init(run)?;
    Ok(Started {
        run: Pid::from_raw(run),
        tree,
    })
}

/// The init `ckpt run` (pid `run`) started: its only child.
fn namespace_init(run: i32) -> Result<Pid> {
    let children = format!("/proc/{run}/task/{run}/children");
    let deadline = Instant::now() + INIT_START;
    loop {
        let text = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(init) = text.split_whitespace().next().and_then(|p| p.parse().ok()) {
            return Ok(Pid::from_raw(init));
        }
        if Instant::now() > deadline {
            return Err(TreeError::NoInit { run });
        }
        std::thread::sleep(INIT_POLL);
    }
}

/// Dumps the tree of `tree` with `--kill` into the next `ckpt-N` of `dir`
/// and commits it; returns its name (pruning and reporting are the
/// caller's). On failure nothing is committed and the partial directory
/// is removed.
pub fn checkpoint(dir: &Path, tree: Pid, how: &Checkpointing<'_>) -> Result<String> {
    let name = format!("{CKPT_PREFIX}{}", next_number(dir)?);
    let target = dir.join(&name);
    let exe = std::env::current_exe().map_err(TreeError::OwnExe)?;
    let mut cmd = Command::new(exe);
    cmd.arg("dump")
        .arg("--tree")
        .arg(tree.to_string())
        .arg("--dir")
        .arg(&target);
    match how.then {
        Then::Kill => {
            cmd.arg("--kill");
        }
        Then::Resume if how.background => {
            cmd.arg("--background");
        }
        // Tracking is left for the next one to read only what changed.
        Then::Resume if how.incremental => {
            cmd.arg("--track");
        }
        Then::Resume => {}
    }
    if how.incremental
        && let Some(prev) = committed(dir)?
    {
        cmd.arg("--prev").arg(dir.join(prev));
    }
    if let Some(k) = how.image_key {
        cmd.arg("--image-key").arg(k);
    }
    child_signals(&mut cmd, ChildSignals::Dump(how.signal));
    // Its own process group: a SIGTERM from Slurm during the dump goes to
    // the wrapper, which lets the dump finish within KillWait.
    let out = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(TreeError::DumpSpawn)?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&target);
        let text = String::from_utf8_lossy(&out.stderr);
        let last = text.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("");
        return Err(TreeError::DumpFailed {
            status: out.status,
            last: last.to_string(),
        });
    }
    commit(dir, &name)?;
    Ok(name)
}
