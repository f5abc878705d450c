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
    #[error("--slurm: SLURM_NODEID is not set")]
    NoNodeId(#[source] std::env::VarError),
    /// A node index that is no number.
    #[error("SLURM_NODEID={id}: not a number")]
    NodeIdNotNumber {
        /// What Slurm set.
        id: String,
        /// The parse error.
        #[source]
        source: std::num::ParseIntError,
    },
    /// A node index beyond the parts.
    #[error("SLURM_NODEID={index}, but the job has {parts} parts")]
    NodeIdBeyond {
        /// The node's index in the step.
        index: usize,
        /// How many parts the job has.
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
    /// Resolves the agent's part: `--part`, or under srun the part on this
    /// node (`by_node`: a dump) or the SLURM_NODEID-th part (a restore:
    /// parts may move).
    pub fn resolve(dir: JobDir, c: &PartChoice, by_node: bool) -> Result<AgentPart> {
        let node = c.node.clone().unwrap_or_else(this_node);
        check_name("node", &node)?;
        let part = match &c.part {
            Some(p) => p.clone(),
            None if by_node => dir
                .parts()?
                .into_iter()
                .find(|p| p.node.as_deref() == Some(node.as_str()))
                .map(|p| p.name)
                .ok_or_else(|| PartError::NoPartHere { node: node.clone() })?,
            None => {
                let index = step_index(c, &node)?;
                let parts = dir.parts()?;
                let n = parts.len();
                let nth = parts.into_iter().nth(index).map(|p| p.name);
                nth.ok_or(PartError::NodeIdBeyond { index, parts: n })?
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

/// This node's index in the srun step: its place in the launcher's node
/// list, else SLURM_NODEID.
fn step_index(c: &PartChoice, node: &str) -> Result<usize> {
    if let Some(i) = c.slurm_nodes.iter().position(|n| n == node) {
        return Ok(i);
    }
    if !c.slurm_nodes.is_empty() {
        return Err(PartError::NotStepNode {
            node: node.to_string(),
            nodes: c.slurm_nodes.clone(),
        });
    }
    let id = std::env::var("SLURM_NODEID").map_err(PartError::NoNodeId)?;
    id.parse()
        .map_err(|source| PartError::NodeIdNotNumber { id, source })
}
