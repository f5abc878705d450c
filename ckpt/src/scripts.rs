//! Action scripts (`--action-script PATH`, CRIU's hooks): site programs
//! run between the engine's phases, e.g. to lock a job's network before a
//! dump or to register a restored job with a scheduler. They live here,
//! not in the libraries, because the phased engine APIs already give the
//! moments; this is only the loop that calls the scripts.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long one script may run before it is killed (with every process it
/// started) and the operation aborted: long enough for a scheduler call,
/// short enough that a hung script does not hold a frozen job for ever.
pub const SCRIPT_TIMEOUT: Duration = Duration::from_secs(60);

/// How often a running script is checked for its exit.
const POLL: Duration = Duration::from_millis(10);

/// A moment at which action scripts run; the name is what the script sees
/// in `CKPT_SCRIPT_ACTION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before the tree is frozen.
    PreDump,
    /// The images are committed; the tree is still frozen (before it is
    /// resumed or killed).
    PostDump,
    /// Before anything of the checkpoint is read.
    PreRestore,
    /// Every process is rebuilt and still stopped.
    PostRestore,
    /// Right before the restored tree runs (right after post-restore: both
    /// see the tree stopped).
    PreResume,
}

impl Phase {
    /// The name scripts see, CRIU's.
    pub fn name(self) -> &'static str {
        match self {
            Phase::PreDump => "pre-dump",
            Phase::PostDump => "post-dump",
            Phase::PreRestore => "pre-restore",
            Phase::PostRestore => "post-restore",
            Phase::PreResume => "pre-resume",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a script failed.
#[derive(Debug)]
pub enum Failure {
    /// It could not be started.
    Spawn(std::io::Error),
    /// It exited non-zero or was killed by a signal.
    Status(ExitStatus),
    /// It ran longer than [`SCRIPT_TIMEOUT`] and was killed.
    Timeout,
    /// Waiting for it failed.
    Wait(std::io::Error),
}

/// An action script that vetoed the operation.
#[derive(Debug)]
pub struct ScriptFailed {
    /// The script.
    pub script: PathBuf,
    /// When it ran.
    pub phase: Phase,
    /// What went wrong.
    pub failure: Failure,
}

impl fmt::Display for ScriptFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "action script {} failed at {}: ",
            self.script.display(),
            self.phase
        )?;
        match &self.failure {
            Failure::Spawn(e) => write!(f, "cannot run it: {e}"),
            Failure::Status(s) => write!(f, "{s}"),
            Failure::Timeout => write!(
                f,
                "still running after {} s, killed",
                SCRIPT_TIMEOUT.as_secs()
            ),
            Failure::Wait(e) => write!(f, "waiting for it: {e}"),
        }
    }
}

impl std::error::Error for ScriptFailed {}

/// The scripts of one `ckpt dump` or `ckpt restore`, in command-line order.
pub struct ActionScripts {
    scripts: Vec<PathBuf>,
    images_dir: PathBuf,
}

impl ActionScripts {
    /// The scripts for an operation on the checkpoint `images_dir`.
    pub fn new(scripts: Vec<PathBuf>, images_dir: &Path) -> ActionScripts {
        // Scripts may change directory; give them a path that still works.
        let images_dir = std::path::absolute(images_dir).unwrap_or_else(|_| images_dir.into());
        ActionScripts {
            scripts,
            images_dir,
        }
    }

    /// Runs every script for `phase`, one after the other; the first that
    /// fails stops the rest and is returned. `pid` is the tree's root, when
    /// known at that moment.
    pub fn run(&self, phase: Phase, pid: Option<i32>) -> Result<(), ScriptFailed> {
        for script in &self.scripts {
            let failed = |failure| ScriptFailed {
                script: script.clone(),
                phase,
                failure,
            };
            let child = self.command(script, phase, pid).spawn();
            let status = wait_bounded(child.map_err(|e| failed(Failure::Spawn(e)))?);
            match status {
                Ok(s) if s.success() => {}
                Ok(s) => return Err(failed(Failure::Status(s))),
                Err(f) => return Err(failed(f)),
            }
        }
        Ok(())
    }

    fn command(&self, script: &Path, phase: Phase, pid: Option<i32>) -> Command {
        let mut cmd = Command::new(script);
        for name in ["CKPT_SCRIPT_ACTION", "CRTOOLS_SCRIPT_ACTION"] {
            cmd.env(name, phase.name());
        }
        for name in ["CKPT_IMAGES_DIR", "CRTOOLS_IMAGE_DIR"] {
            cmd.env(name, &self.images_dir);
        }
        for name in ["CKPT_PID", "CRTOOLS_INIT_PID"] {
            match pid {
                Some(p) => cmd.env(name, p.to_string()),
                None => cmd.env_remove(name),
            };
        }
        // Its output goes to our stderr so `--json` keeps stdout clean.
        let stdout = std::os::fd::AsFd::as_fd(&std::io::stderr())
            .try_clone_to_owned()
            .map_or_else(|_| Stdio::null(), Stdio::from);
        cmd.stdin(Stdio::null())
            .stdout(stdout)
            .stderr(Stdio::inherit());
        // Its own group, so a timeout kills whatever it started too.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        ckpt_job::sys::close_inherited_fds(&mut cmd);
        cmd
    }
}

/// Waits for `child` at most [`SCRIPT_TIMEOUT`], then kills its process
/// group.
fn wait_bounded(mut child: Child) -> Result<ExitStatus, Failure> {
    let deadline = Instant::now() + SCRIPT_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(POLL),
            Ok(None) => {
                let group = nix::unistd::Pid::from_raw(child.id() as i32);
                let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
                let _ = child.wait();
                return Err(Failure::Timeout);
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Failure::Wait(e));
            }
        }
    }
}
