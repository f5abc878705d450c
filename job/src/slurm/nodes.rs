//! `ckpt slurm` for a job spanning several nodes: in an allocation of more
//! than one node (`SLURM_JOB_NUM_NODES` > 1) the application runs once per
//! node, as the parts of a `ckpt job` whose job directory is `DIR/job`.
//!
//! First start: one `srun --overlap` step with one task per node runs
//! `ckpt job run --dir DIR/job -- APP` (each part named after its node; the
//! application tells its role from SLURM_NODEID / SLURM_PROCID as any SPMD
//! program does). A checkpoint is `ckpt job dump --launch srun --kill`,
//! which commits an epoch of every part and prunes to `--keep`; a restart
//! is `ckpt job restore --launch srun`, part i on node i of the new
//! allocation, supervised as the first run was. Both are child `ckpt job`
//! commands in process groups of their own, so Slurm's signals to the
//! batch script's group reach only the wrapper.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use ckpt_coord::store::StoreError;
use nix::unistd::Pid;

use super::budget;
use super::{Checkpointing, Then, Warn};
use crate::dir::{DirError, JobDir};
use crate::sys::{ChildSignals, child_signals, close_inherited_fds};

/// This module's results.
type Result<T, E = NodesError> = std::result::Result<T, E>;

/// What went wrong with the parts of a job spanning several nodes.
#[derive(Debug, thiserror::Error)]
pub enum NodesError {
    /// Slurm's node count is no count.
    #[error("{NUM_NODES_VAR}={value}: not a node count")]
    NodeCount {
        /// What Slurm set.
        value: String,
    },
    /// The parts' job directory.
    #[error(transparent)]
    Dir(#[from] DirError),
    /// The parts' epoch records.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The path of this very ckpt, which the parts run, is unknown.
    #[error("cannot find the ckpt executable")]
    OwnExe(#[source] std::io::Error),
    /// A child did not start.
    #[error("{what}")]
    Spawn {
        /// What it was to do ("cannot run ckpt job dump").
        what: &'static str,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
    /// A child's pid does not fit a pid.
    #[error("child pid out of range")]
    PidRange(#[source] std::num::TryFromIntError),
    /// `ckpt job dump` failed; its own errors (the agents') are `output`,
    /// for the job's output.
    #[error("ckpt job dump: {status}: {outcome}")]
    DumpFailed {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The round's outcome, as it reported it.
        outcome: String,
        /// What it wrote on stderr.
        output: String,
    },
    /// `ckpt job dump --json` printed no JSON.
    #[error("ckpt job dump --json printed no JSON")]
    NoJson(#[source] serde_json::Error),
    /// Slurm's tasks a node are not the same on every node.
    #[error(
        "{TASKS_PER_NODE_VAR}={value}: not the same number of tasks on every node, which srun --mpi=pmix under ckpt needs"
    )]
    UnevenTasks {
        /// What Slurm set.
        value: String,
    },
    /// `ckpt job dump --json` printed no epoch.
    #[error("ckpt job dump --json printed no epoch: {json}")]
    NoEpoch {
        /// What it printed.
        json: serde_json::Value,
    },
}

/// The allocation's node count, as Slurm gives it to the batch script.
const NUM_NODES_VAR: &str = "SLURM_JOB_NUM_NODES";
/// The allocation's tasks on each node (`2(x3),1`), as Slurm gives it
/// to the batch script.
const TASKS_PER_NODE_VAR: &str = "SLURM_TASKS_PER_NODE";
/// The job directory of the parts, relative to `DIR`.
pub(crate) const JOB_SUBDIR: &str = "job";
/// Prefix of an epoch's name in `DIR`'s records (its timing file).
const EPOCH_PREFIX: &str = "epoch-";
/// `srun`, looked up on PATH.
const SRUN: &str = "srun";
/// How long a start or restart may take until every part runs (srun's
/// step creation on every node, a restore's whole round).
const PARTS_START: Duration = Duration::from_secs(120);
/// How often the parts' records are looked at meanwhile.
const PARTS_POLL: Duration = Duration::from_millis(100);
/// File times come from the kernel's coarse clock, which may be a tick
/// behind the time read before the parts started.
const CLOCK_SLACK: Duration = Duration::from_secs(1);

/// How many nodes the job has (1 when Slurm does not say).
pub fn allocation_nodes() -> Result<u32> {
    match std::env::var(NUM_NODES_VAR) {
        Ok(s) if !s.is_empty() => match s.parse().ok().filter(|&n| n >= 1) {
            Some(n) => Ok(n),
            None => Err(NodesError::NodeCount { value: s }),
        },
        _ => Ok(1),
    }
}

/// How many tasks the allocation has on each node (1 when Slurm does not
/// say); an error if that differs between nodes.
pub fn allocation_tasks_per_node() -> Result<u32> {
    match std::env::var(TASKS_PER_NODE_VAR) {
        Ok(s) if !s.is_empty() => {
            uniform_tasks_per_node(&s).ok_or(NodesError::UnevenTasks { value: s })
        }
        _ => Ok(1),
    }
}

/// The one count of Slurm's compressed list of tasks a node (`2(x3)`,
/// `2,2`), if every node has the same.
fn uniform_tasks_per_node(list: &str) -> Option<u32> {
    let mut counts = list.split(',').map(|entry| {
        let count = entry.split_once('(').map_or(entry, |(count, _)| count);
        count.trim().parse::<u32>().ok().filter(|&n| n >= 1)
    });
    let first = counts.next()??;
    counts.all(|c| c == Some(first)).then_some(first)
}

/// The name `DIR`'s records give epoch `e`.
fn epoch_name(e: u64) -> String {
    format!("{EPOCH_PREFIX}{e}")
}

/// The epoch a record name stands for.
fn epoch_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(EPOCH_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The parts of a job spanning several nodes.
pub struct Parts {
    /// `DIR/job`.
    jobdir: PathBuf,
    /// Nodes of the allocation.
    nodes: u32,
    /// Parts a node: 1, or with `srun --mpi=pmix` the allocation's tasks a
    /// node (each rank a part, named after its task).
    tasks_per_node: u32,
    /// Each part is a rank of `srun --mpi=pmix`, whose PMIx server is the
    /// step's slurmstepd: the parts' step has one, their dumps save the
    /// ranks' links to it and the restore reconnects them to the restore
    /// step's (docs/slurm.md, "MPI launchers").
    srun_pmix: bool,
}

impl std::fmt::Display for Parts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the job's {} parts", self.count())
    }
}

impl Parts {
    /// Creates (or opens) `DIR/job` here, before any part starts, so the
    /// parts on all nodes find it with its secret.
    pub fn open(dir: &Path, nodes: u32) -> Result<Parts> {
        let jobdir = dir.join(JOB_SUBDIR);
        JobDir::create_or_open(&jobdir)?;
        Ok(Parts {
            jobdir,
            nodes,
            tasks_per_node: 1,
            srun_pmix: false,
        })
    }

    /// The parts are the ranks of `srun --mpi=pmix`, `tasks_per_node` a
    /// node (the allocation's).
    pub fn srun_pmix(self, tasks_per_node: u32) -> Parts {
        Parts {
            srun_pmix: true,
            tasks_per_node: tasks_per_node.max(1),
            ..self
        }
    }

    /// How many parts the job has.
    fn count(&self) -> u32 {
        self.nodes.saturating_mul(self.tasks_per_node)
    }

    /// `--tasks-per-node K` for `ckpt job dump|restore`.
    fn tasks_per_node_args(&self) -> [String; 2] {
        ["--tasks-per-node".into(), self.tasks_per_node.to_string()]
    }

    /// The last committed epoch's name (`epoch-E`), if any.
    pub fn committed(&self) -> Result<Option<String>> {
        let dir = JobDir::open(&self.jobdir)?;
        Ok(dir.store()?.last_committed()?.map(|m| epoch_name(m.epoch)))
    }

    /// A `ckpt` child in a process group of its own with the job's stdio
    /// and no other fd (what the batch environment leaked would end up in
    /// the parts), with `signals` blocked.
    fn ckpt(&self, args: &[&str], signals: ChildSignals) -> Result<Command> {
        let exe = std::env::current_exe().map_err(NodesError::OwnExe)?;
        let mut cmd = Command::new(exe);
        cmd.args(args)
            .arg("--dir")
            .arg(&self.jobdir)
            .process_group(0)
            .stdin(Stdio::null());
        close_inherited_fds(&mut cmd);
        child_signals(&mut cmd, signals);
        Ok(cmd)
    }

    /// Starts one part per node: returns the pid of the srun step.
    pub fn start(&self, app: &[OsString]) -> Result<Pid> {
        let exe = std::env::current_exe().map_err(NodesError::OwnExe)?;
        let mut cmd = Command::new(SRUN);
        if self.srun_pmix {
            // The ranks' data store in their own memory, none of
            // slurmstepd's files mapped into them.
            cmd.env("PMIX_MCA_gds", "hash");
        }
        cmd.args([
            "--overlap".to_string(),
            // Otherwise a site's MpiDefault=pmix would put a slurmstepd PMIx
            // server behind every task, outside the job.
            if self.srun_pmix {
                "--mpi=pmix"
            } else {
                "--mpi=none"
            }
            .to_string(),
            format!("--nodes={}", self.nodes),
            format!("--ntasks={}", self.count()),
            format!("--ntasks-per-node={}", self.tasks_per_node),
            // The tasks' order is the parts' (see `AgentPart::resolve`).
            "--distribution=block".to_string(),
        ])
        .arg(exe)
        .args(["job", "run", "--dir"])
        .arg(&self.jobdir);
        if self.srun_pmix {
            // Ranks are tasks: each comes back as the same task of a step
            // with the same layout, which the PMIx server requires.
            cmd.arg("--slurm-task");
        }
        cmd.arg("--")
            .args(app)
            .process_group(0)
            .stdin(Stdio::null());
        close_inherited_fds(&mut cmd);
        child_signals(&mut cmd, ChildSignals::None);
        let child = cmd.spawn().map_err(|source| NodesError::Spawn {
            what: "cannot start the job's parts with srun",
            source,
        })?;
        pid_of(&child)
    }

    /// Starts an MPI launcher (`app`) once, here, as this node's part, in a
    /// UTS namespace named after the node and an IPC namespace of its own,
    /// with `env` added (the daemons'
    /// launch through `launch`'s stand-in, [`super::daemons`]): its daemons
    /// become the other nodes' parts. Returns the pid of its `ckpt job
    /// run`.
    pub fn start_launcher(&self, app: &[OsString], env: &[(OsString, OsString)]) -> Result<Pid> {
        let mut cmd = self.ckpt(&["job", "run", "--uts", "--ipcns"], ChildSignals::None)?;
        cmd.arg("--")
            .args(app)
            .envs(env.iter().map(|(k, v)| (k, v)));
        let child = cmd.spawn().map_err(|source| NodesError::Spawn {
            what: "cannot start the MPI launcher's part",
            source,
        })?;
        pid_of(&child)
    }

    /// The job directory of the parts.
    pub fn jobdir(&self) -> &Path {
        &self.jobdir
    }

    /// Restarts every part from the last committed epoch in the
    /// foreground: returns the pid of `ckpt job restore`, which exits with
    /// the worst part's status.
    pub fn restore(&self, image_key: Option<&Path>) -> Result<Pid> {
        let mut cmd = self.ckpt(&["job", "restore", "--launch", "srun"], ChildSignals::None)?;
        cmd.args(self.tasks_per_node_args());
        if self.srun_pmix {
            cmd.arg("--pmix");
        }
        // The job's output file grew since the checkpoint (the parts ran on
        // after a periodic one, and this wrapper writes there too): the
        // parts continue at its end, as on one node.
        for f in super::stdio_files() {
            cmd.arg("--allow-changed").arg(f);
        }
        if let Some(k) = image_key {
            cmd.arg("--image-key").arg(k);
        }
        let child = cmd.spawn().map_err(|source| NodesError::Spawn {
            what: "cannot run ckpt job restore",
            source,
        })?;
        pid_of(&child)
    }

    /// Checkpoints every part (then kills them, or lets them run on);
    /// `ckpt job dump` commits the epoch and prunes to `--keep`. Returns the
    /// epoch's name.
    pub fn checkpoint(&self, a: &Checkpointing<'_>, dir: &Path) -> Result<String> {
        let keep = a.keep.to_string();
        let mut args = vec!["job", "dump", "--launch", "srun", "--json", "--keep", &keep];
        match a.then {
            Then::Kill => args.push("--kill"),
            Then::Resume if a.background => args.push("--background"),
            Then::Resume => {}
        }
        if a.incremental {
            args.push("--incremental");
        }
        if self.srun_pmix {
            args.push("--pmix-reconnect");
        }
        let mut cmd = self.ckpt(&args, ChildSignals::Dump(a.signal))?;
        cmd.args(self.tasks_per_node_args());
        if let Some(k) = a.image_key {
            cmd.arg("--image-key").arg(k);
        }
        let out = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .map_err(|source| NodesError::Spawn {
                what: "cannot run ckpt job dump",
                source,
            })?;
        let parsed = serde_json::from_slice::<serde_json::Value>(&out.stdout);
        if !out.status.success() {
            // The agents' errors are for the job's output; the round's
            // outcome (with --json, on stdout) is the error's message.
            let text = String::from_utf8_lossy(&out.stderr);
            let outcome = parsed
                .ok()
                .and_then(|v| v["error"]["message"].as_str().map(str::to_string))
                .or_else(|| {
                    text.lines()
                        .rfind(|l| !l.trim().is_empty())
                        .map(str::to_string)
                })
                .unwrap_or_default();
            return Err(NodesError::DumpFailed {
                status: out.status,
                outcome,
                output: text.into_owned(),
            });
        }
        let v = parsed.map_err(NodesError::NoJson)?;
        let Some(epoch) = v["epoch"].as_u64() else {
            return Err(NodesError::NoEpoch { json: v });
        };
        self.prune_timings(dir);
        Ok(epoch_name(epoch))
    }

    /// Waits until every part runs (its root recorded since `since`, by
    /// `ckpt job run` or a restore's agent) and no round holds the job
    /// directory, so a warning signal that came early (Slurm's may come at
    /// once) finds a job it can checkpoint. Returns early if `child` (the
    /// srun step or `ckpt job restore`) ended, leaving it for the caller
    /// to reap; after [`PARTS_START`] it warns and returns.
    pub fn wait_running(&self, since: SystemTime, child: Pid, warn: Warn<'_>) {
        let deadline = Instant::now() + PARTS_START;
        let since = since.checked_sub(CLOCK_SLACK).unwrap_or(since);
        let Ok(dir) = JobDir::open(&self.jobdir) else {
            return;
        };
        loop {
            if ended(child) {
                return;
            }
            let running = dir.parts().map_or(0, |parts| {
                parts
                    .iter()
                    .filter(|p| {
                        std::fs::metadata(dir.root_pid_path(&p.name))
                            .and_then(|m| m.modified())
                            .is_ok_and(|t| t >= since)
                    })
                    .count()
            });
            // Taking the lock (and dropping it at once) tells that the
            // restore's round is over.
            if u32::try_from(running).is_ok_and(|r| r >= self.count()) && dir.lock().is_ok() {
                return;
            }
            if Instant::now() >= deadline {
                warn(&format!(
                    "{running} of {} parts recorded as running after {} s; a checkpoint before they all run fails",
                    self.count(),
                    PARTS_START.as_secs()
                ));
                return;
            }
            std::thread::sleep(PARTS_POLL);
        }
    }

    /// How the committed epoch is restored by hand.
    pub fn restore_hint(&self) -> String {
        format!(
            "ckpt job restore --dir {} --launch srun",
            self.jobdir.display()
        )
    }

    /// Where the committed epoch is, for messages.
    pub fn place(&self, name: &str) -> String {
        format!("{} {name}", self.jobdir.display())
    }

    /// Removes the timing records of epochs `ckpt job dump` pruned.
    fn prune_timings(&self, dir: &Path) {
        let Ok(job) = JobDir::open(&self.jobdir) else {
            return;
        };
        let Ok(epochs) = job.epochs() else { return };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(epoch) = name
                .to_str()
                .and_then(|n| n.strip_suffix(budget::TIMING_SUFFIX))
                .and_then(epoch_of)
            else {
                continue;
            };
            if !epochs.iter().any(|i| i.epoch == epoch) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// A child's pid.
fn pid_of(child: &std::process::Child) -> Result<Pid> {
    let pid = i32::try_from(child.id()).map_err(NodesError::PidRange)?;
    Ok(Pid::from_raw(pid))
}

/// Whether our child `pid` has ended (a zombie waiting to be reaped).
fn ended(pid: Pid) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        // The state follows the command name, which ends with the last ')'.
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|state| state == "Z")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_names() {
        assert_eq!(epoch_name(7), "epoch-7");
        assert_eq!(epoch_of("epoch-7"), Some(7));
        for bad in ["epoch-", "epoch-x", "ckpt-7", "epoch--1"] {
            assert_eq!(epoch_of(bad), None, "{bad}");
        }
    }

    #[test]
    fn slurms_tasks_a_node_are_read_when_the_same_everywhere() {
        assert_eq!(uniform_tasks_per_node("2(x2)"), Some(2));
        assert_eq!(uniform_tasks_per_node("4"), Some(4));
        assert_eq!(uniform_tasks_per_node("3,3(x2)"), Some(3));
        for uneven in ["2,1", "2(x3),1", "", "x", "0"] {
            assert_eq!(uniform_tasks_per_node(uneven), None, "{uneven}");
        }
    }
}
