//! How `ckpt job dump|restore` starts one agent per part on the part's
//! node, without ssh: one `srun --overlap` step inside a Slurm allocation,
//! `ip netns exec` into a network namespace per node, or a site's own
//! command template for a given host list.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::dir::{DirError, JobDir, check_name};

/// This module's results.
type Result<T, E = LaunchError> = std::result::Result<T, E>;

/// The placeholder for the node in `--via`.
const HOST_PLACEHOLDER: &str = "{host}";
/// `ip`, for `--launch netns`.
const IP: &str = "ip";
/// `srun`, looked up on PATH.
const SRUN: &str = "srun";

/// What went wrong starting or waiting for the agents; each names the
/// part, node or launcher it is about.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The path of this very ckpt, which the agents run, is unknown.
    #[error("finding the ckpt executable")]
    OwnExe(#[source] std::io::Error),
    /// A part with no node to start its agent on.
    #[error("part {part}: no node to run its agent on (give --nodes)")]
    NoNode {
        /// The part.
        part: String,
    },
    /// `--launch exec` without `--via`.
    #[error("--launch exec needs --via 'CMD {HOST_PLACEHOLDER}'")]
    NoVia,
    /// A `--via` that names no host.
    #[error("--via {via:?}: must be a command naming {HOST_PLACEHOLDER}")]
    BadVia {
        /// The template given.
        via: String,
    },
    /// srun places one task per node, and these parts share nodes.
    #[error(
        "--launch srun runs one agent per node, but the parts' nodes are {}: use --launch netns or exec",
        nodes.join(",")
    )]
    SharedNodes {
        /// The parts' nodes, in part order.
        nodes: Vec<String>,
    },
    /// A launcher did not start.
    #[error("starting {label}: {program:?}")]
    Spawn {
        /// What it was to start.
        label: String,
        /// The program run.
        program: std::ffi::OsString,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
    /// The job directory cannot say where the parts are.
    #[error(transparent)]
    Dir(#[from] DirError),
    /// A job directory without parts.
    #[error("{}: the job has no parts (start them with `ckpt job run`)", dir.display())]
    NoParts {
        /// The job directory.
        dir: PathBuf,
    },
    /// `--nodes` lists another number of nodes than the job has parts.
    #[error("--nodes names {nodes} nodes for {} parts ({})", parts.len(), parts.join(","))]
    NodeCount {
        /// How many nodes `--nodes` lists.
        nodes: usize,
        /// The job's parts.
        parts: Vec<String>,
    },
    /// A part that must run where it is, with no node recorded.
    #[error("part {part}: no node recorded: give --nodes")]
    NoRecordedNode {
        /// The part.
        part: String,
    },
    /// Waiting for a launcher failed.
    #[error("waiting for {label}")]
    Wait {
        /// What it is.
        label: String,
        /// Its error.
        #[source]
        source: std::io::Error,
    },
}

/// How agents reach the nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaunchKind {
    /// One `srun --overlap` job step with one task per node (inside a Slurm
    /// allocation); each agent finds its part from SLURM_NODEID /
    /// SLURMD_NODENAME.
    Srun,
    /// `ip netns exec NODE`: every node is a named network namespace of
    /// this host.
    Netns,
    /// `--via 'CMD {host}'` for each node of `--nodes` (split on spaces,
    /// no shell; `{host}` replaced by the node name).
    Exec,
}

/// How `ckpt job dump|restore` starts its agents (`--launch`, `--nodes`,
/// `--via`).
#[derive(Debug, Clone)]
pub struct Launcher {
    /// How agents reach the nodes.
    pub kind: LaunchKind,
    /// The nodes in part order (parts sorted by name), or empty: where
    /// each part runs now; with srun, the allocation.
    pub nodes: Vec<String>,
    /// With [`LaunchKind::Exec`]: the command template naming `{host}`.
    pub via: Option<String>,
    /// With [`LaunchKind::Srun`]: the agents' step has slurmstepd's PMIx
    /// server (`--mpi=pmix`), for restoring ranks of `srun --mpi=pmix`
    /// dumped with `--pmix-reconnect` (the step must be the requeued job's
    /// first, with the dumped task layout, to serve their namespace).
    pub srun_pmix: bool,
}

impl Launcher {
    /// Where each part's agent runs: node i of `nodes` for part i, else
    /// the part's recorded node (`fixed`: a dump, which must run where the
    /// part is), else (srun restore) wherever Slurm puts it.
    pub fn placements(&self, dir: &JobDir, fixed: bool) -> Result<Vec<Placement>> {
        let parts = dir.parts()?;
        if parts.is_empty() {
            let dir = dir.path().to_path_buf();
            return Err(LaunchError::NoParts { dir });
        }
        if !self.nodes.is_empty() && self.nodes.len() != parts.len() {
            return Err(LaunchError::NodeCount {
                nodes: self.nodes.len(),
                parts: parts.into_iter().map(|p| p.name).collect(),
            });
        }
        parts
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let node = match self.nodes.get(i) {
                    Some(n) => {
                        check_name("node", n)?;
                        Some(n.clone())
                    }
                    None if self.kind == LaunchKind::Srun && !fixed => None,
                    None => match p.node {
                        Some(n) => Some(n),
                        None => return Err(LaunchError::NoRecordedNode { part: p.name }),
                    },
                };
                Ok(Placement { part: p.name, node })
            })
            .collect()
    }
}

/// One part's agent and where it runs.
#[derive(Debug, Clone)]
pub struct Placement {
    /// Part name.
    pub part: String,
    /// Node name; `None`: the node Slurm gives it (srun restore).
    pub node: Option<String>,
}

/// A started launcher process (one agent, or the srun step of all).
#[derive(Debug)]
pub struct Launched {
    /// What it is, for messages ("part a on node n1", "srun step").
    pub label: String,
    /// The process.
    pub child: Child,
    /// Its exit status once seen.
    pub exit: Option<std::process::ExitStatus>,
}

impl Launched {
    /// Polls for its exit; true once it has exited.
    pub fn poll(&mut self) -> bool {
        if self.exit.is_none()
            && let Ok(Some(s)) = self.child.try_wait()
        {
            self.exit = Some(s);
        }
        self.exit.is_some()
    }

    /// Kills it if it still runs (our own child, by its pid) and reaps it.
    pub fn stop(&mut self) {
        if !self.poll() {
            let _ = self.child.kill();
            self.exit = self.child.wait().ok();
        }
    }

    /// Waits for its exit.
    pub fn wait(&mut self) -> Result<std::process::ExitStatus> {
        if let Some(s) = self.exit {
            return Ok(s);
        }
        let s = self.child.wait().map_err(|source| LaunchError::Wait {
            label: self.label.clone(),
            source,
        })?;
        self.exit = Some(s);
        Ok(s)
    }
}

/// The exit code a launcher's status stands for (128+signal if killed).
pub fn exit_code(s: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

/// Starts the agents: `agent` is `ckpt job agent VERB ...` without the
/// part selection, which is added here (`--part P --node N`, or
/// `--slurm` for srun, where each task finds its own).
pub fn launch(o: &Launcher, agent: &[OsString], placements: &[Placement]) -> Result<Vec<Launched>> {
    let me = std::env::current_exe().map_err(LaunchError::OwnExe)?;
    match o.kind {
        LaunchKind::Srun => Ok(vec![srun(&me, agent, placements, o.srun_pmix)?]),
        LaunchKind::Netns | LaunchKind::Exec => {
            let mut out = Vec::new();
            for p in placements {
                let Some(node) = &p.node else {
                    let part = p.part.clone();
                    return Err(LaunchError::NoNode { part });
                };
                let mut cmd = match o.kind {
                    LaunchKind::Netns => {
                        let mut c = Command::new(IP);
                        c.args(["netns", "exec", node]);
                        c
                    }
                    _ => via_command(o.via.as_deref(), node)?,
                };
                cmd.arg(&me)
                    .args(agent)
                    .args(["--part", &p.part, "--node", node]);
                let label = format!("part {} on node {node}", p.part);
                out.push(spawn(cmd, label)?);
            }
            Ok(out)
        }
    }
}

/// The `--via` template for `node`.
fn via_command(via: Option<&str>, node: &str) -> Result<Command> {
    let Some(via) = via else {
        return Err(LaunchError::NoVia);
    };
    let words: Vec<String> = via
        .split_whitespace()
        .map(|w| w.replace(HOST_PLACEHOLDER, node))
        .collect();
    if !via.contains(HOST_PLACEHOLDER) || words.is_empty() {
        let via = via.to_string();
        return Err(LaunchError::BadVia { via });
    }
    let mut c = Command::new(&words[0]);
    c.args(&words[1..]);
    Ok(c)
}

/// One `srun --overlap` step with one agent task per node; with `pmix`,
/// a step with slurmstepd's PMIx server.
fn srun(
    me: &PathBuf,
    agent: &[OsString],
    placements: &[Placement],
    pmix: bool,
) -> Result<Launched> {
    let k = placements.len();
    let mut cmd = Command::new(SRUN);
    cmd.args([
        "--overlap".to_string(),
        // Otherwise a site's MpiDefault=pmix would put a slurmstepd PMIx
        // server behind every agent, outside the job.
        if pmix { "--mpi=pmix" } else { "--mpi=none" }.to_string(),
        format!("--nodes={k}"),
        format!("--ntasks={k}"),
        "--ntasks-per-node=1".to_string(),
    ]);
    let nodes: Vec<&str> = placements
        .iter()
        .filter_map(|p| p.node.as_deref())
        .collect();
    if !nodes.is_empty() {
        let mut distinct = nodes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != nodes.len() || nodes.len() != k {
            let nodes = nodes.iter().map(|n| n.to_string()).collect();
            return Err(LaunchError::SharedNodes { nodes });
        }
        cmd.arg(format!("--nodelist={}", nodes.join(",")));
    }
    cmd.arg(me).args(agent).arg("--slurm");
    if !nodes.is_empty() {
        // Slurm numbers the step's nodes in its own order: the agents find
        // their part by their node's place in ours.
        cmd.arg(format!("--slurm-nodes={}", nodes.join(",")));
    }
    spawn(cmd, format!("srun step of {k} agents"))
}

/// Starts one launcher, its stdin closed.
fn spawn(mut cmd: Command, label: String) -> Result<Launched> {
    // The agents' output is the user's: errors on stderr, and a restored
    // tree's terminal fds are rebound to the agent's.
    cmd.stdin(Stdio::null());
    log::info!("job: starting {label}: {cmd:?}");
    let child = match cmd.spawn() {
        Ok(c) => c,
        Err(source) => {
            let program = cmd.get_program().to_os_string();
            return Err(LaunchError::Spawn {
                label,
                program,
                source,
            });
        }
    };
    Ok(Launched {
        label,
        child,
        exit: None,
    })
}
