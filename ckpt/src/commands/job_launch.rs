//! How `ckpt job dump|restore` starts one agent per part on the part's
//! node, without ssh: one `srun --overlap` step inside a Slurm allocation,
//! `ip netns exec` into a network namespace per node, or a site's own
//! command template for a given host list.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, bail};

/// The placeholder for the node in `--via`.
const HOST_PLACEHOLDER: &str = "{host}";
/// `ip`, for `--launch netns`.
const IP: &str = "ip";
/// `srun`, looked up on PATH.
const SRUN: &str = "srun";

/// How agents reach the nodes.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
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

/// The launcher options of `ckpt job dump` and `ckpt job restore`.
#[derive(clap::Args, Debug, Clone)]
pub struct LaunchOpts {
    /// How agents reach the nodes: srun, netns or exec.
    #[arg(long, value_enum, value_name = "HOW")]
    pub launch: LaunchKind,
    /// The nodes, comma-separated, in part order (parts sorted by name):
    /// part i's agent runs on node i. Default: where each part runs now
    /// (as its JOBDIR/parts/PART/node says); with srun, the allocation.
    #[arg(long, value_delimiter = ',', value_name = "N1,N2,...")]
    pub nodes: Vec<String>,
    /// With `--launch exec`: the command that runs a program on `{host}`,
    /// e.g. `srun --overlap --nodes=1 --ntasks=1 --nodelist={host}` (split on spaces, no shell).
    #[arg(long, value_name = "CMD")]
    pub via: Option<String>,
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
    pub fn wait(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        if let Some(s) = self.exit {
            return Ok(s);
        }
        let s = self
            .child
            .wait()
            .with_context(|| format!("waiting for {}", self.label))?;
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
pub fn launch(
    o: &LaunchOpts,
    agent: &[OsString],
    placements: &[Placement],
) -> anyhow::Result<Vec<Launched>> {
    let me = std::env::current_exe().context("finding the ckpt executable")?;
    match o.launch {
        LaunchKind::Srun => Ok(vec![srun(&me, agent, placements)?]),
        LaunchKind::Netns | LaunchKind::Exec => {
            let mut out = Vec::new();
            for p in placements {
                let Some(node) = &p.node else {
                    bail!(
                        "part {}: no node to run its agent on (give --nodes)",
                        p.part
                    );
                };
                let mut cmd = match o.launch {
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
fn via_command(via: Option<&str>, node: &str) -> anyhow::Result<Command> {
    let Some(via) = via else {
        bail!("--launch exec needs --via 'CMD {HOST_PLACEHOLDER}'");
    };
    let words: Vec<String> = via
        .split_whitespace()
        .map(|w| w.replace(HOST_PLACEHOLDER, node))
        .collect();
    if !via.contains(HOST_PLACEHOLDER) || words.is_empty() {
        bail!("--via {via:?}: must be a command naming {HOST_PLACEHOLDER}");
    }
    let mut c = Command::new(&words[0]);
    c.args(&words[1..]);
    Ok(c)
}

/// One `srun --overlap` step with one agent task per node.
fn srun(me: &PathBuf, agent: &[OsString], placements: &[Placement]) -> anyhow::Result<Launched> {
    let k = placements.len();
    let mut cmd = Command::new(SRUN);
    cmd.args([
        "--overlap".to_string(),
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
            bail!(
                "--launch srun runs one agent per node, but the parts' nodes are {}: use --launch netns or exec",
                nodes.join(",")
            );
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

fn spawn(mut cmd: Command, label: String) -> anyhow::Result<Launched> {
    // The agents' output is the user's: errors on stderr, and a restored
    // tree's terminal fds are rebound to the agent's.
    cmd.stdin(Stdio::null());
    log::info!("job: starting {label}: {cmd:?}");
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {label}: {:?}", cmd.get_program()))?;
    Ok(Launched {
        label,
        child,
        exit: None,
    })
}
