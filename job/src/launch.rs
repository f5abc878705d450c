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
    /// srun places the same number of agents on every node, in part
    /// order, and these parts' nodes are not laid out so.
    #[error(
        "--launch srun runs {per_node} agent(s) a node on consecutive parts, but the parts' nodes are {}: use --tasks-per-node, or --launch netns or exec",
        nodes.join(",")
    )]
    SharedNodes {
        /// The parts' nodes, in part order.
        nodes: Vec<String>,
        /// The agents a node asked for.
        per_node: u32,
    },
    /// A number of parts srun cannot split evenly over the nodes.
    #[error("--launch srun with {per_node} agent(s) a node cannot run {parts} parts")]
    UnevenTasks {
        /// How many parts.
        parts: usize,
        /// The agents a node asked for.
        per_node: u32,
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
    /// With [`LaunchKind::Srun`]: agents a node (at least 1), the parts
    /// laid out on the nodes as Slurm's block distribution lays out tasks
    /// (`srun --ntasks-per-node`): consecutive parts on one node.
    pub tasks_per_node: u32,
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
        LaunchKind::Srun => Ok(vec![srun(&me, agent, placements, o)?]),
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

/// One `srun --overlap` step of agents, `o.tasks_per_node` a node, in
/// block distribution; with `o.srun_pmix`, a step with slurmstepd's PMIx
/// server.
fn srun(
    me: &PathBuf,
    agent: &[OsString],
    placements: &[Placement],
    o: &Launcher,
) -> Result<Launched> {
    let k = placements.len();
    let per_node = o.tasks_per_node.max(1);
    let per = per_node as usize;
    if !k.is_multiple_of(per) {
        return Err(LaunchError::UnevenTasks { parts: k, per_node });
    }
    let mut cmd = Command::new(SRUN);
    cmd.args([
        "--overlap".to_string(),
        // Otherwise a site's MpiDefault=pmix would put a slurmstepd PMIx
        // server behind every agent, outside the job.
        if o.srun_pmix {
            "--mpi=pmix"
        } else {
            "--mpi=none"
        }
        .to_string(),
        format!("--nodes={}", k / per),
        format!("--ntasks={k}"),
        format!("--ntasks-per-node={per_node}"),
        // Task i on the (i / per)-th node: how the agents find their part.
        "--distribution=block".to_string(),
    ]);
    let nodes: Vec<&str> = placements
        .iter()
        .filter_map(|p| p.node.as_deref())
        .collect();
    let mut distinct: Vec<&str> = Vec::new();
    if !nodes.is_empty() {
        let chunks: Vec<&[&str]> = nodes.chunks(per).collect();
        let laid_out = nodes.len() == k && chunks.iter().all(|c| c.iter().all(|n| *n == c[0])) && {
            distinct = chunks.iter().map(|c| c[0]).collect();
            let mut sorted = distinct.clone();
            sorted.sort_unstable();
            sorted.dedup();
            sorted.len() == distinct.len()
        };
        if !laid_out {
            let nodes = nodes.iter().map(|n| n.to_string()).collect();
            return Err(LaunchError::SharedNodes { nodes, per_node });
        }
        cmd.arg(format!("--nodelist={}", distinct.join(",")));
    }
    cmd.arg(me).args(agent).arg("--slurm");
    if !distinct.is_empty() {
        // Slurm numbers the step's nodes in its own order: the agents find
        // their part by their node's place in ours.
        cmd.arg(format!("--slurm-nodes={}", distinct.join(",")));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn placed(nodes: &[&str]) -> Vec<Placement> {
        nodes
            .iter()
            .enumerate()
            .map(|(i, n)| Placement {
                part: format!("task-{i:06}"),
                node: Some(n.to_string()),
            })
            .collect()
    }

    fn srun_launcher(tasks_per_node: u32) -> Launcher {
        Launcher {
            kind: LaunchKind::Srun,
            nodes: Vec::new(),
            via: None,
            srun_pmix: false,
            tasks_per_node,
        }
    }

    /// srun's block distribution puts consecutive tasks on one node: parts
    /// laid out otherwise, or not filling every node alike, are refused
    /// before any step starts.
    #[test]
    fn an_srun_step_needs_the_parts_laid_out_as_its_tasks() {
        let me = PathBuf::from("/nonexistent/ckpt");
        for (nodes, per_node) in [
            (&["n1", "n2", "n1", "n2"][..], 2),
            (&["n1", "n1", "n1", "n2"][..], 2),
            (&["n1", "n1"][..], 1),
            (&["n1", "n1", "n2", "n2", "n1", "n1"][..], 2),
        ] {
            let err = srun(&me, &[], &placed(nodes), &srun_launcher(per_node)).unwrap_err();
            assert!(
                matches!(err, LaunchError::SharedNodes { .. }),
                "{nodes:?}: {err}"
            );
        }
        let err = srun(&me, &[], &placed(&["n1", "n1", "n2"]), &srun_launcher(2)).unwrap_err();
        assert!(
            matches!(
                err,
                LaunchError::UnevenTasks {
                    parts: 3,
                    per_node: 2
                }
            ),
            "{err}"
        );
    }
}
