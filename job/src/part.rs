//! Which part of the job a process is, and on which node: the node's
//! name, a part started on it (`ckpt job run`), and the part an agent of
//! `ckpt job dump|restore` takes.

use std::path::{Path, PathBuf};

use crate::dir::{DirError, JobDir, check_name, is_ckpt_init};

/// This module's results.
type Result<T, E = PartError> = std::result::Result<T, E>;

/// What went wrong finding a part; each names the part or node.
#[derive(Debug, thiserror::Error)]
pub enum PartError {
    /// The job directory.
    #[error(transparent)]
    Dir(#[from] DirError),
    /// The part already runs on this node.
    #[error("part {part} already runs on node {node} (pid {pid})")]
    Running {
        /// The part.
        part: String,
        /// This node.
        node: String,
        /// Its tree root.
        pid: i32,
    },
    /// A dump agent on a node where no part runs.
    #[error("node {node}: no part of the job runs here")]
    NoPartHere {
        /// This node.
        node: String,
    },
    /// A restore agent on a node its srun step does not list.
    #[error("node {node} is not one of the step's nodes {}", nodes.join(","))]
    NotStepNode {
        /// This node.
        node: String,
        /// The step's nodes.
        nodes: Vec<String>,
    },
    /// `--slurm` outside a Slurm step.
    #[error("--slurm: {var} is not set")]
    NoStepVar {
        /// The variable Slurm sets for a task.
        var: &'static str,
    },
    /// A task's variable that is no number.
    #[error("{var}={value}: not a number")]
    StepVarNotNumber {
        /// The variable.
        var: &'static str,
        /// What Slurm set.
        value: String,
    },
    /// A task's place beyond the parts.
    #[error("this agent is task {index} of its step, but the job has {parts} parts")]
    TaskBeyond {
        /// The agent's place in the step.
        index: usize,
        /// How many parts the job has.
        parts: usize,
    },
    /// More agents on a node than parts recorded there.
    #[error("node {node}: agent {local} of this node, but {parts} parts run here")]
    LocalBeyond {
        /// This node.
        node: String,
        /// The agent's place on the node (SLURM_LOCALID).
        local: usize,
        /// How many parts run on the node.
        parts: usize,
    },
    /// A dump agent on another node than its part's.
    #[error(
        "part {part}: runs on node {}, not on this node {node}, refused",
        recorded.as_deref().unwrap_or("?")
    )]
    Elsewhere {
        /// The part.
        part: String,
        /// The node it runs on, as recorded.
        recorded: Option<String>,
        /// This node.
        node: String,
    },
}

/// The name of the named network namespace (`ip netns`) this process is
/// in, if any: a site's per-job namespaces, or the tests' nodes.
fn netns_name() -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let me = std::fs::metadata("/proc/self/ns/net").ok()?;
    let init = std::fs::metadata("/proc/1/ns/net").ok();
    if init.is_some_and(|i| (i.dev(), i.ino()) == (me.dev(), me.ino())) {
        return None;
    }
    std::fs::read_dir("/run/netns")
        .ok()?
        .flatten()
        .find_map(|e| {
            let m = std::fs::metadata(e.path()).ok()?;
            ((m.dev(), m.ino()) == (me.dev(), me.ino()))
                .then(|| e.file_name().into_string().ok())
                .flatten()
        })
}

/// This node's name: $SLURMD_NODENAME, else the named network namespace,
/// else the host name.
pub fn this_node() -> String {
    std::env::var("SLURMD_NODENAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(netns_name)
        .unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "node".to_string())
        })
}

/// The prefix of a part named after its Slurm task (`ckpt job run
/// --slurm-task`).
const TASK_PART_PREFIX: &str = "task-";

/// The part of this Slurm task: `task-` and SLURM_PROCID, zero-padded so
/// that the parts' order (by name) is the tasks' order, which a restore
/// step with the same layout reproduces (a rank of `srun --mpi=pmix` must
/// come back as the same task).
pub fn slurm_task_part() -> Result<String> {
    let id = step_var("SLURM_PROCID")?.ok_or(PartError::NoStepVar {
        var: "SLURM_PROCID",
    })?;
    Ok(format!("{TASK_PART_PREFIX}{id:06}"))
}

/// A number Slurm sets for each task of a step, if set.
fn step_var(var: &'static str) -> Result<Option<usize>> {
    match std::env::var(var) {
        Ok(value) => value
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| PartError::StepVarNotNumber { var, value }),
        Err(_) => Ok(None),
    }
}

/// This task's place among its node's tasks in the step (0 outside one).
fn local_id() -> Result<usize> {
    Ok(step_var("SLURM_LOCALID")?.unwrap_or(0))
}

/// A part that starts on this node now (`ckpt job run`).
#[derive(Debug, Clone)]
pub struct Claimed {
    /// The job directory.
    pub dir: JobDir,
    /// The part.
    pub part: String,
    /// This node.
    pub node: String,
    /// Where the part's root pid is to be written.
    pub pidfile: PathBuf,
}

/// Records that a part starts on this node now (`ckpt job run`), unless
/// it already runs there: `part` (default: named after the node) on
/// `node` (default: [`this_node`]) in the job directory `root` (created
/// if this is the job's first command). How it ended before is forgotten.
pub fn claim(root: &Path, part: Option<&str>, node: Option<&str>) -> Result<Claimed> {
    let node = node.map_or_else(this_node, str::to_string);
    check_name("node", &node)?;
    let part = part.unwrap_or(&node).to_string();
    let dir = JobDir::create_or_open(root)?;
    dir.ensure_part(&part)?;
    if dir.node_of(&part)?.as_deref() == Some(node.as_str())
        && let Some(pid) = dir.root_of(&part)?
        && is_ckpt_init(pid)?
    {
        return Err(PartError::Running { part, node, pid });
    }
    dir.set_node(&part, &node)?;
    dir.clear_exit(&part)?;
    let pidfile = dir.root_pid_path(&part);
    Ok(Claimed {
        dir,
        part,
        node,
        pidfile,
    })
}

/// How an agent of `ckpt job dump|restore` finds its part.
#[derive(Debug, Clone, Default)]
pub struct PartChoice {
    /// `--part`, if given.
    pub part: Option<String>,
    /// `--node`, if given (default: [`this_node`]).
    pub node: Option<String>,
    /// The srun step's nodes in part order, if the launcher gave them.
    pub slurm_nodes: Vec<String>,
}

/// The part an agent takes, and its node.
#[derive(Debug, Clone)]
pub struct AgentPart {
    /// The job directory.
    pub dir: JobDir,
    /// The part.
    pub part: String,
    /// This node.
    pub node: String,
}

impl AgentPart {
    /// Resolves the agent's part: `--part`, or under srun, with
    /// SLURM_LOCALID the agent's place among its node's agents: that
    /// place among the parts on this node (`by_node`: a dump), or the
    /// part at the agent's place in the step (a restore: parts may move).
    pub fn resolve(dir: JobDir, c: &PartChoice, by_node: bool) -> Result<AgentPart> {
        let node = c.node.clone().unwrap_or_else(this_node);
        check_name("node", &node)?;
        let part = match &c.part {
            Some(p) => p.clone(),
            None if by_node => {
                let here: Vec<String> = dir
                    .parts()?
                    .into_iter()
                    .filter(|p| p.node.as_deref() == Some(node.as_str()))
                    .map(|p| p.name)
                    .collect();
                if here.is_empty() {
                    return Err(PartError::NoPartHere { node });
                }
                let local = local_id()?;
                let parts = here.len();
                here.into_iter().nth(local).ok_or(PartError::LocalBeyond {
                    node: node.clone(),
                    local,
                    parts,
                })?
            }
            None => {
                let index = step_index(c, &node)?;
                let parts = dir.parts()?;
                let n = parts.len();
                let nth = parts.into_iter().nth(index).map(|p| p.name);
                nth.ok_or(PartError::TaskBeyond { index, parts: n })?
            }
        };
        dir.ensure_part(&part)?;
        Ok(AgentPart { dir, part, node })
    }

    /// The root pid of a dump agent's part: it must run on this very node.
    pub fn dump_root(&self) -> Result<i32> {
        let recorded = self.dir.node_of(&self.part)?;
        if recorded.as_deref() != Some(self.node.as_str()) {
            return Err(PartError::Elsewhere {
                part: self.part.clone(),
                recorded,
                node: self.node.clone(),
            });
        }
        Ok(self.dir.checked_root(&self.part)?)
    }
}

/// This agent's place in the srun step: its node's place in the
/// launcher's node list (else SLURM_NODEID) times the step's agents a
/// node, plus its place on the node. Slurm's block distribution numbers
/// the tasks the same way, so with one agent a node this is SLURM_NODEID
/// and with several, SLURM_PROCID of the task that ran the part.
fn step_index(c: &PartChoice, node: &str) -> Result<usize> {
    let node_index = if let Some(i) = c.slurm_nodes.iter().position(|n| n == node) {
        i
    } else if !c.slurm_nodes.is_empty() {
        return Err(PartError::NotStepNode {
            node: node.to_string(),
            nodes: c.slurm_nodes.clone(),
        });
    } else {
        step_var("SLURM_NODEID")?.ok_or(PartError::NoStepVar {
            var: "SLURM_NODEID",
        })?
    };
    let tasks = step_var("SLURM_STEP_NUM_TASKS")?.unwrap_or(1);
    let nodes = step_var("SLURM_STEP_NUM_NODES")?.unwrap_or(1).max(1);
    let per_node = (tasks / nodes).max(1);
    Ok(node_index * per_node + local_id()?)
}
