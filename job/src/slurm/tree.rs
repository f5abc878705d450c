//! The application of a single-node `ckpt slurm` job: started under
//! `ckpt run --pidns` (PID 2 of a PID namespace of its own, so a restart
//! on any node gets its pids back even where the host's are taken), and
//! checkpointed by a `ckpt dump --kill` child into the next `ckpt-N`.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::unistd::Pid;

use super::checkpoints::committed;
use super::checkpoints::{CheckpointsError, commit, next_number};
use super::{CKPT_PREFIX, Checkpointing, Then};
use crate::sys::{ChildSignals, child_signals, close_inherited_fds};

/// How long `ckpt run` may take to start the namespace's init.
const INIT_START: Duration = Duration::from_secs(10);
/// How long a `ckpt restore` through the ckpt service may take to name
/// the restored tree in its pid file (it reads the images first, and may
/// wait for a zombie that still holds a dumped pid).
const RESTORE_START: Duration = Duration::from_secs(300);
/// The pid file, in the checkpoint directory, where the ckpt service's
/// worker names the application's tree for an ordinary user's job (the
/// tree is the worker's child, not ours, so it cannot be found among our
/// children).
pub const PIDFILE: &str = "app.pid";
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
    /// The `ckpt run` or `ckpt restore` that was to write the pid file
    /// did not, within its time or before it ended.
    #[error("{command} (pid {pid}) named no tree in {} ({why})", pidfile.display())]
    NoPidfile {
        /// `ckpt run` or `ckpt restore`.
        command: &'static str,
        /// Its pid.
        pid: i32,
        /// The pid file.
        pidfile: PathBuf,
        /// It ended (how), or the time ran out.
        why: String,
    },
    /// The pid file could not be removed before the start.
    #[error("{}: cannot remove the old pid file", path.display())]
    OldPidfile {
        /// The pid file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
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
/// outside, a daemon's socket). For an ordinary user `ckpt run` goes to
/// the ckpt service, and the init is found in [`PIDFILE`] in `dir`.
pub fn start(app: &[OsString], dir: &Path) -> Result<Started> {
    let (prog, _) = app.split_first().ok_or(TreeError::NoApp)?;
    let exe = std::env::current_exe().map_err(TreeError::OwnExe)?;
    let mut cmd = Command::new(exe);
    cmd.args(["run", "--pidns"]);
    let pidfile = (!nix::unistd::geteuid().is_root()).then(|| dir.join(PIDFILE));
    if let Some(p) = &pidfile {
        remove_old_pidfile(p)?;
        cmd.arg("--pidfile").arg(p);
    }
    cmd.arg("--").args(app).process_group(0);
    close_inherited_fds(&mut cmd);
    child_signals(&mut cmd, ChildSignals::None);
    let mut child = cmd.spawn().map_err(|source| TreeError::Start {
        app: prog.to_string_lossy().into_owned(),
        source,
    })?;
    let run = i32::try_from(child.id()).map_err(TreeError::PidRange)?;
    let tree = match &pidfile {
        Some(p) => pid_from_file(&mut child, "ckpt run", p, INIT_START)?,
        None => namespace_init(run)?,
    };
    Ok(Started {
        run: Pid::from_raw(run),
        tree,
    })
}

/// For an ordinary user: restores the checkpoint `ckpt` by a `ckpt
/// restore` child (it goes to the ckpt service, restores the tree as the
/// user's and waits for it, exiting as it does), with the job's stdio and
/// `allow_changed` (the job's output files) accepted as changed. The
/// tree's root is read from [`PIDFILE`] in `dir`.
pub fn restore_through_service(
    ckpt: &Path,
    dir: &Path,
    allow_changed: &[PathBuf],
) -> Result<Started> {
    let exe = std::env::current_exe().map_err(TreeError::OwnExe)?;
    let pidfile = dir.join(PIDFILE);
    remove_old_pidfile(&pidfile)?;
    let mut cmd = Command::new(exe);
    cmd.arg("restore")
        .arg("--dir")
        .arg(ckpt)
        .arg("--pidfile")
        .arg(&pidfile);
    for f in allow_changed {
        cmd.arg("--allow-changed").arg(f);
    }
    cmd.process_group(0);
    close_inherited_fds(&mut cmd);
    child_signals(&mut cmd, ChildSignals::None);
    let mut child = cmd.spawn().map_err(|source| TreeError::Start {
        app: "ckpt restore".into(),
        source,
    })?;
    let run = i32::try_from(child.id()).map_err(TreeError::PidRange)?;
    let tree = pid_from_file(&mut child, "ckpt restore", &pidfile, RESTORE_START)?;
    Ok(Started {
        run: Pid::from_raw(run),
        tree,
    })
}

/// A pid file of an earlier start or restore would name a tree that is
/// gone (or another process since).
fn remove_old_pidfile(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(TreeError::OldPidfile {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// The pid `child` (`command`) writes to `pidfile` (atomically: it is
/// complete once it exists), within `limit` and while the child runs.
fn pid_from_file(
    child: &mut std::process::Child,
    command: &'static str,
    pidfile: &Path,
    limit: Duration,
) -> Result<Pid> {
    let pid = i32::try_from(child.id()).map_err(TreeError::PidRange)?;
    let fail = |why: String| TreeError::NoPidfile {
        command,
        pid,
        pidfile: pidfile.to_path_buf(),
        why,
    };
    let deadline = Instant::now() + limit;
    loop {
        if let Some(tree) = std::fs::read_to_string(pidfile)
            .ok()
            .and_then(|t| t.trim().parse().ok())
        {
            return Ok(Pid::from_raw(tree));
        }
        match child.try_wait() {
            Ok(Some(status)) => return Err(fail(format!("it ended: {status}"))),
            Ok(None) => {}
            Err(e) => return Err(fail(format!("cannot wait for it: {e}"))),
        }
        if Instant::now() > deadline {
            return Err(fail(format!("none within {limit:?}")));
        }
        std::thread::sleep(INIT_POLL);
    }
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
