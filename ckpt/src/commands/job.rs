//! `ckpt job`: one command for a whole multi-node job.
//!
//! ```text
//! ckpt job run     --dir JOBDIR [--part NAME] -- CMD...          # on each node, by the launcher
//! ckpt job dump    --dir JOBDIR --launch srun|netns|exec [--kill] [--keep N] [--background | --incremental]
//! ckpt job restore --dir JOBDIR --launch srun|netns|exec [--nodes N1,N2] [--epoch E] [--detach]
//! ckpt job status  --dir JOBDIR        ckpt job list --dir JOBDIR
//! ```
//!
//! `dump` and `restore` run the coordinator in this process (its epoch
//! records in JOBDIR/coord), trigger one round as its control client, start
//! one agent per part (`ckpt job agent`, hidden, through `job_launch`), and
//! report the round's outcome. The agents run the coordinated code paths of
//! `ckpt dump --coord` and `ckpt restore --coord` (`dump.rs`, `restore.rs`).
//! Layout and checks of the job directory: `job_dir.rs`.

use std::ffi::OsString;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ckpt_coord::client::{AgentOptions, ClientError, Link};
use ckpt_coord::protocol::{
    AfterCommit, Message, Outcome, Role, RoundKind, RoundOver, StatusQuery, Trigger,
};
use ckpt_coord::{CoordConfig, CoordHandle, Secret};

use super::job_dir::{EpochInfo, JOB_ID, JobDir, check_name, is_ckpt_init};
use super::job_launch::{LaunchOpts, Launched, Placement, exit_code, launch};

/// Where the coordinator listens unless told: every address, a free port.
const DEFAULT_LISTEN: &str = "0.0.0.0:0";
/// How often the round's wait looks at the agents.
const POLL: Duration = Duration::from_millis(100);
/// The control client's name at the coordinator.
const CONTROL_NAME: &str = "ckpt-job";
/// How long the control client tries to reach the in-process coordinator.
const CONTROL_CONNECT: Duration = Duration::from_secs(10);
/// Mode of the scratch state directory of `restore --epoch`.
const PIN_DIR_MODE: u32 = 0o700;

/// Arguments of `ckpt job`.
#[derive(clap::Args, Debug)]
pub struct JobArgs {
    #[command(subcommand)]
    cmd: JobCommand,
}

impl JobArgs {
    /// Whether this command writes a dump (whose log goes next to its images).
    pub fn captures_log(&self) -> bool {
        matches!(
            &self.cmd,
            JobCommand::Agent(AgentArgs {
                verb: AgentVerb::Dump(_)
            })
        )
    }
}

#[derive(clap::Subcommand, Debug)]
enum JobCommand {
    /// Start this node's part of the job (what a batch script or launcher
    /// runs per node): the command runs under `ckpt run --pidns`, its root
    /// pid and node recorded in JOBDIR/parts/PART.
    Run(RunArgs),
    /// Checkpoint the whole job: start the coordinator and one agent per
    /// part on its node, print the committed epoch (or the failed part
    /// and why), then prune old epochs.
    Dump(DumpArgs),
    /// Restart the whole job from its last committed epoch (or --epoch):
    /// part i's agent runs on node i of the launch's nodes, so parts can
    /// move or swap nodes. Waits until every part's tree exits (exit code:
    /// the worst) unless --detach.
    Restore(RestoreArgs),
    /// Show the parts, their nodes and roots, and the epochs on disk.
    Status(ListArgs),
    /// List the epochs on disk: committed (time, size; the last committed
    /// marked), aborted and partial.
    List(ListArgs),
    /// Internal: one part's agent, started by `ckpt job dump|restore`.
    #[command(hide = true)]
    Agent(AgentArgs),
}

/// Arguments of `ckpt job run`.
#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The job directory, on storage every node sees (created 0700 with
    /// the job secret by the first `ckpt job` command).
    #[arg(long, short = 'D', value_name = "JOBDIR")]
    dir: PathBuf,
    /// This part's name, unique in the job (default: the node name).
    #[arg(long, value_name = "NAME")]
    part: Option<String>,
    /// This node's name (default: $SLURMD_NODENAME, else the named network
    /// namespace this runs in, else the host name).
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// The command and its arguments.
    #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// The coordinator options of `ckpt job dump|restore`.
#[derive(clap::Args, Debug)]
struct CoordOpts {
    /// Where the coordinator listens (the agents must reach it); with an
    /// unspecified address the agents are told this host's name.
    #[arg(long, default_value = DEFAULT_LISTEN, value_name = "ADDR")]
    listen: String,
    /// Seconds every part has to finish each phase before the round aborts.
    #[arg(long, default_value_t = 60.0, value_name = "SECS")]
    phase_deadline: f64,
    /// Seconds the agents have to start and register (a launcher waiting
    /// for resources, a node that is down) before the command gives up.
    #[arg(long, default_value_t = 120.0, value_name = "SECS")]
    register_timeout: f64,
    /// The site's image key file (default: $CKPT_IMAGE_KEY, else
    /// /var/lib/ckpt/image.key).
    #[arg(long, value_name = "PATH")]
    image_key: Option<PathBuf>,
}

/// What `ckpt job dump` and `ckpt job restore` both take, after their own options (so
/// `--help` lists them in the same place): how the result is printed and how the round
/// is coordinated and launched.
#[derive(clap::Args, Debug)]
struct RoundOpts {
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    coord: CoordOpts,
    #[command(flatten)]
    launch: LaunchOpts,
}

/// Arguments of `ckpt job dump`.
#[derive(clap::Args, Debug)]
struct DumpArgs {
    /// The job directory.
    #[arg(long, short = 'D', value_name = "JOBDIR")]
    dir: PathBuf,
    /// Kill every part once the epoch is committed.
    #[arg(long)]
    kill: bool,
    /// Keep the newest N committed epochs (the last committed always).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    keep: u32,
    /// Store page data LZ4-compressed.
    #[arg(long)]
    compress: bool,
    /// Freeze every part only to capture its registers, files and
    /// write-protect its memory; all thaw together once every part has,
    /// and the pages are written while the job runs (a background round).
    #[arg(long, conflicts_with_all = ["kill", "incremental"])]
    background: bool,
    /// Read from each part only the pages written since its images of the
    /// last committed epoch (every epoch stays complete on its own).
    #[arg(long)]
    incremental: bool,
    #[command(flatten)]
    common: RoundOpts,
}

/// Arguments of `ckpt job restore`.
#[derive(clap::Args, Debug)]
struct RestoreArgs {
    /// The job directory.
    #[arg(long, short = 'D', value_name = "JOBDIR")]
    dir: PathBuf,
    /// Restore this committed epoch instead of the last committed one.
    #[arg(long, value_name = "E")]
    epoch: Option<u64>,
    /// Return once every part runs instead of waiting for them.
    #[arg(long, short = 'd')]
    detach: bool,
    /// Accept that this open file of the parts changed since the dump
    /// (repeatable; `ckpt restore --allow-changed`): a job's output file,
    /// which grows while the job runs on after a checkpoint.
    #[arg(long = "allow-changed", value_name = "PATH")]
    allow_changed: Vec<PathBuf>,
    #[command(flatten)]
    common: RoundOpts,
}

/// Arguments of `ckpt job status` and `ckpt job list`.
#[derive(clap::Args, Debug)]
struct ListArgs {
    /// The job directory.
    #[arg(long, short = 'D', value_name = "JOBDIR")]
    dir: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Arguments of the hidden `ckpt job agent`.
#[derive(clap::Args, Debug)]
struct AgentArgs {
    #[command(subcommand)]
    verb: AgentVerb,
}

#[derive(clap::Subcommand, Debug)]
enum AgentVerb {
    /// This part's coordinated dump.
    Dump(AgentDumpArgs),
    /// This part's coordinated restore.
    Restore(AgentRestoreArgs),
}

/// What every agent is told.
#[derive(clap::Args, Debug)]
struct AgentCommon {
    /// The job directory.
    #[arg(long, value_name = "JOBDIR")]
    dir: PathBuf,
    /// The coordinator.
    #[arg(long, value_name = "ADDR")]
    coord: String,
    /// The part to take.
    #[arg(long, required_unless_present = "slurm", conflicts_with = "slurm")]
    part: Option<String>,
    /// This node's name (default as `ckpt job run`).
    #[arg(long)]
    node: Option<String>,
    /// Started by srun: find the part from SLURM_NODEID / SLURMD_NODENAME.
    #[arg(long)]
    slurm: bool,
    /// With --slurm: the step's nodes in part order (`--nodes`): the part
    /// is the one at this node's place (else at SLURM_NODEID).
    #[arg(
        long,
        value_delimiter = ',',
        requires = "slurm",
        value_name = "N1,N2,..."
    )]
    slurm_nodes: Vec<String>,
    /// The image key file.
    #[arg(long, value_name = "PATH")]
    image_key: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct AgentDumpArgs {
    #[command(flatten)]
    common: AgentCommon,
    /// Store page data LZ4-compressed.
    #[arg(long)]
    compress: bool,
    /// Chain this part's epochs (`ckpt dump --incremental`).
    #[arg(long)]
    incremental: bool,
}

#[derive(clap::Args, Debug)]
struct AgentRestoreArgs {
    #[command(flatten)]
    common: AgentCommon,
    /// Return once the tree runs.
    #[arg(long)]
    detach: bool,
    /// Passed on to `ckpt restore`.
    #[arg(long = "allow-changed", value_name = "PATH")]
    allow_changed: Vec<PathBuf>,
}

/// Runs `ckpt job`.
pub fn run(a: JobArgs) -> anyhow::Result<ExitCode> {
    match a.cmd {
        JobCommand::Run(r) => run_part(r),
        JobCommand::Dump(d) => dump(d),
        JobCommand::Restore(r) => restore(r),
        JobCommand::Status(l) => status(l, true),
        JobCommand::List(l) => status(l, false),
        JobCommand::Agent(AgentArgs { verb }) => match verb {
            AgentVerb::Dump(d) => agent_dump(d),
            AgentVerb::Restore(r) => agent_restore(r),
        },
    }
}

// ---------------------------------------------------------------------------
// Node names
// ---------------------------------------------------------------------------

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
fn this_node() -> String {
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

// ---------------------------------------------------------------------------
// ckpt job run
// ---------------------------------------------------------------------------

/// Parses `argv` (its first word the command's name) as a ckpt command's
/// arguments, so the job commands run the very code paths of `ckpt run`,
/// `ckpt dump` and `ckpt restore`.
fn parse_as<T: clap::Args + clap::FromArgMatches>(argv: &[OsString]) -> anyhow::Result<T> {
    let m = T::augment_args(clap::Command::new("ckpt"))
        .try_get_matches_from(argv)
        .map_err(|e| anyhow::anyhow!("internal arguments: {}", e.render()))?;
    Ok(T::from_arg_matches(&m)?)
}

fn os(words: &[&str]) -> Vec<OsString> {
    words.iter().map(OsString::from).collect()
}

fn run_part(a: RunArgs) -> anyhow::Result<ExitCode> {
    let node = a.node.clone().unwrap_or_else(this_node);
    check_name("node", &node)?;
    let part = a.part.clone().unwrap_or_else(|| node.clone());
    let dir = JobDir::create_or_open(&a.dir)?;
    dir.ensure_part(&part)?;
    if dir.node_of(&part)?.as_deref() == Some(node.as_str())
        && let Some(pid) = dir.root_of(&part)?
        && is_ckpt_init(pid)?
    {
        bail!("part {part} already runs on node {node} (pid {pid})");
    }
    dir.set_node(&part, &node)?;
    let pidfile = dir.root_pid_path(&part);
    let mut argv = os(&["run", "--pidns", "--pidfile"]);
    argv.push(pidfile.into_os_string());
    argv.push("--".into());
    argv.extend(a.command);
    super::run::run(parse_as(&argv)?)
}

// ---------------------------------------------------------------------------
// The round: in-process coordinator and its control client
// ---------------------------------------------------------------------------

/// A coordinator of one round, running in this process, and our control
/// connection to it with the round already triggered.
struct Round {
    _coord: CoordHandle,
    link: Link,
    /// The address agents are given.
    agent_addr: String,
}

impl Round {
    /// Starts the coordinator for `expect` parts, with its records in
    /// `state_dir`, and triggers a round of `kind` before any agent
    /// exists, so it is that round that starts once every part registered.
    fn start(
        dir: &JobDir,
        o: &CoordOpts,
        state_dir: &Path,
        expect: usize,
        kind: RoundKind,
    ) -> anyhow::Result<Round> {
        let listen: SocketAddr = o
            .listen
            .to_socket_addrs()
            .with_context(|| format!("resolving --listen {}", o.listen))?
            .next()
            .with_context(|| format!("--listen {} resolves to nothing", o.listen))?;
        let secret = Secret::load_client(&dir.secret_path())
            .with_context(|| format!("job secret {}", dir.secret_path().display()))?;
        let expect = u32::try_from(expect).context("too many parts")?;
        let mut cfg = CoordConfig::new(listen, JOB_ID, expect, secret.clone());
        cfg.state_dir = Some(state_dir.to_path_buf());
        cfg.phase_deadline = Duration::try_from_secs_f64(o.phase_deadline)
            .ok()
            .filter(|d| !d.is_zero())
            .with_context(|| format!("--phase-deadline {}: not a duration", o.phase_deadline))?;
        cfg.name = "job".to_string();
        cfg.emit_log = crate::logger::verbose_on_stderr();
        let coord = ckpt_coord::spawn(cfg).context("starting the job's coordinator")?;
        let bound = coord.local_addr();
        let agent_addr = if bound.ip().is_unspecified() {
            format!("{}:{}", this_node_host(), bound.port())
        } else {
            bound.to_string()
        };
        let local = SocketAddr::new(
            if bound.ip().is_unspecified() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                bound.ip()
            },
            bound.port(),
        );
        let mut opts = AgentOptions::new(&local.to_string(), JOB_ID, secret, CONTROL_NAME)
            .connect_timeout(CONTROL_CONNECT);
        opts.role = Role::Control;
        opts.expect = 0;
        let mut link = Link::open(&opts).context("connecting to the job's coordinator")?;
        link.send(&Message::Trigger(Trigger { kind }))?;
        // Messages of one connection are handled in order: once the
        // status comes back, the trigger is pending at the coordinator.
        link.send(&Message::StatusQuery(StatusQuery {}))?;
        loop {
            match link.recv(Some(CONTROL_CONNECT), "the coordinator's status")? {
                Message::Status(_) => break,
                m => log::debug!("job: ignoring {m:?} while triggering"),
            }
        }
        log::info!("job: coordinator on {bound}, agents connect to {agent_addr}");
        Ok(Round {
            _coord: coord,
            link,
            agent_addr,
        })
    }

    /// Waits for the round's outcome while watching the agents. The round
    /// starts once every agent registered; if instead an agent exits, or
    /// `register` passes first, the remaining agents (which hold nothing
    /// yet) are stopped and the error says which parts failed or how many
    /// registered. Once the round runs, the coordinator's phase deadline
    /// and disconnect detection decide.
    fn wait(
        &mut self,
        what: &str,
        agents: &mut [Launched],
        register: Duration,
    ) -> anyhow::Result<RoundOver> {
        let deadline = Instant::now() + register;
        // A status query is in flight; its answer says whether a round runs.
        let mut probing = false;
        let mut started = false;
        loop {
            match self.link.recv(Some(POLL), "the round to end") {
                Ok(Message::RoundOver(r)) => return Ok(r),
                Ok(Message::Status(s)) if probing => {
                    probing = false;
                    started = s.running.is_some();
                    let exited = agents.iter().any(|a| a.exit.is_some());
                    if !started && (exited || Instant::now() >= deadline) {
                        // No round runs and none ended: it never started.
                        for a in agents.iter_mut() {
                            a.stop();
                        }
                        if exited {
                            bail!("{what}: the round did not start: {}", failures(agents));
                        }
                        bail!(
                            "{what}: the round did not start: {} of {} agents registered within {} s (--register-timeout)",
                            s.registered,
                            s.expect,
                            register.as_secs_f64()
                        );
                    }
                }
                Ok(m) => log::debug!("job: ignoring {m:?}"),
                Err(ClientError::Timeout { .. }) => {}
                Err(e) => return Err(e).with_context(|| format!("{what}: the job's coordinator")),
            }
            let before = agents.iter().filter(|a| a.exit.is_some()).count();
            let after = agents
                .iter_mut()
                .map(|a| a.poll())
                .filter(|&exited| exited)
                .count();
            let late = !started && Instant::now() >= deadline;
            if (after > before || late) && !probing {
                self.link.send(&Message::StatusQuery(StatusQuery {}))?;
                probing = true;
            }
        }
    }
}

/// `--register-timeout` as a duration.
fn register_timeout(o: &CoordOpts) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(o.register_timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("--register-timeout {}: not a duration", o.register_timeout))
}

/// The host name agents on other nodes reach this one by.
fn this_node_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}

/// "part a on node n1 exited with 3; ..." for the agents that failed.
fn failures(agents: &[Launched]) -> String {
    let v: Vec<String> = agents
        .iter()
        .filter_map(|a| {
            let s = a.exit?;
            (!s.success()).then(|| format!("{} exited with {}", a.label, exit_code(s)))
        })
        .collect();
    if v.is_empty() {
        "no agent registered".to_string()
    } else {
        format!("{} (its error is above)", v.join("; "))
    }
}

/// The part names' nodes for messages: "part a (node n1)".
fn part_label(placements: &[Placement], part: &str) -> String {
    match placements
        .iter()
        .find(|p| p.part == part)
        .and_then(|p| p.node.as_deref())
    {
        Some(node) => format!("part {part} (node {node})"),
        None => format!("part {part}"),
    }
}

/// Where each part's agent runs: node i of `--nodes` for part i, else the
/// part's recorded node (`fixed`: a dump, which must run where the part
/// is), else (srun restore) wherever Slurm puts it.
fn placements(dir: &JobDir, o: &LaunchOpts, fixed: bool) -> anyhow::Result<Vec<Placement>> {
    let parts = dir.parts()?;
    if parts.is_empty() {
        bail!(
            "{}: the job has no parts (start them with `ckpt job run`)",
            dir.path().display()
        );
    }
    if !o.nodes.is_empty() && o.nodes.len() != parts.len() {
        bail!(
            "--nodes names {} nodes for {} parts ({})",
            o.nodes.len(),
            parts.len(),
            parts
                .iter()
                .map(|p| p.name.as_str())
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    parts
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let node =
                match o.nodes.get(i) {
                    Some(n) => {
                        check_name("node", n)?;
                        Some(n.clone())
                    }
                    None if o.launch == super::job_launch::LaunchKind::Srun && !fixed => None,
                    None => Some(p.node.clone().with_context(|| {
                        format!("part {}: no node recorded: give --nodes", p.name)
                    })?),
                };
            Ok(Placement { part: p.name, node })
        })
        .collect()
}

/// The agent's arguments shared by dump and restore (before the part).
fn agent_common(dir: &JobDir, addr: &str, c: &CoordOpts) -> Vec<OsString> {
    // The agents log as this command does.
    let mut v = if crate::logger::verbose_on_stderr() {
        os(&["-v", "--dir"])
    } else {
        os(&["--dir"])
    };
    v.push(dir.path().into());
    v.extend(os(&["--coord", addr]));
    if let Some(k) = &c.image_key {
        v.push("--image-key".into());
        v.push(k.into());
    }
    v
}

// ---------------------------------------------------------------------------
// ckpt job dump
// ---------------------------------------------------------------------------

/// How long `part` was frozen for `epoch`, as its dump recorded with its
/// images (`stats-dump.json`): the whole freeze of a background round; of a
/// frozen round, until its images were committed. `None` if unreadable
/// (the figure is informative only).
fn part_frozen_ms(dir: &JobDir, part: &str, epoch: u64) -> Option<f64> {
    let path = super::agent::epoch_dir(&dir.part_dir(part), epoch).join(ckpt_dumper::STATS_NAME);
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?["frozen_ms"].as_f64()
}

fn dump(a: DumpArgs) -> anyhow::Result<ExitCode> {
    let register = register_timeout(&a.common.coord)?;
    let dir = JobDir::create_or_open(&a.dir)?;
    let _lock = dir.lock()?;
    let placed = placements(&dir, &a.common.launch, true)?;
    let kind = if a.background {
        RoundKind::BackgroundCheckpoint
    } else {
        RoundKind::Checkpoint {
            then: if a.kill {
                AfterCommit::Kill
            } else {
                AfterCommit::Resume
            },
        }
    };
    let mut round = Round::start(
        &dir,
        &a.common.coord,
        &dir.coord_state_dir(),
        placed.len(),
        kind,
    )?;
    let mut argv = os(&["job", "agent", "dump"]);
    argv.extend(agent_common(&dir, &round.agent_addr, &a.common.coord));
    if a.compress {
        argv.push("--compress".into());
    }
    if a.incremental {
        argv.push("--incremental".into());
    }
    let mut agents = launch(&a.common.launch, &argv, &placed)?;
    let over = round.wait("job dump", &mut agents, register);
    for ag in agents.iter_mut() {
        ag.wait()?;
    }
    let over = over?;
    // Every epoch up to this round's is over: prune by the retention rule.
    let pruned = dir.prune(a.keep as usize, over.epoch);
    let (ok, note) = match &over.outcome {
        Outcome::Committed => (true, None),
        Outcome::CommittedWithErrors { node, reason } => (
            false,
            Some(format!(
                "{} then failed: {reason}",
                part_label(&placed, node)
            )),
        ),
        Outcome::Aborted {
            phase,
            node,
            reason,
        } => {
            if let Err(e) = &pruned {
                log::warn!("job: pruning after the abort: {e:#}");
            }
            bail!(
                "job dump: epoch {} aborted in {phase}: {}: {reason}; the job keeps running, epoch {} stays the last committed",
                over.epoch,
                part_label(&placed, node),
                last_committed_text(&dir)
            );
        }
        Outcome::Restarted => bail!("job dump: the coordinator ran a restart round"),
    };
    let pruned = pruned?;
    dir.mark_last_committed(over.epoch)?;
    let parts: Vec<serde_json::Value> = placed
        .iter()
        .map(|p| {
            let frozen_ms = part_frozen_ms(&dir, &p.part, over.epoch);
            serde_json::json!({ "part": p.part, "node": p.node, "frozen_ms": frozen_ms })
        })
        .collect();
    if a.common.json {
        println!(
            "{}",
            serde_json::json!({
                "epoch": over.epoch,
                "committed": true,
                "killed": a.kill,
                "parts": parts,
                "pruned": pruned,
                "error": note,
            })
        );
    } else {
        let pruned_text = if pruned.is_empty() {
            String::new()
        } else {
            let v: Vec<String> = pruned.iter().map(u64::to_string).collect();
            format!(", pruned epoch {}", v.join(","))
        };
        eprintln!(
            "ckpt: job epoch {} committed ({}{}){pruned_text}",
            over.epoch,
            parts_text(placed.len()),
            if a.kill { ", killed" } else { "" }
        );
        if let Some(n) = &note {
            eprintln!("ckpt: job epoch {}: {n}", over.epoch);
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// "1 part", "3 parts".
fn parts_text(n: usize) -> String {
    if n == 1 {
        "1 part".to_string()
    } else {
        format!("{n} parts")
    }
}

/// The last committed epoch for messages ("3", or "none").
fn last_committed_text(dir: &JobDir) -> String {
    dir.epochs()
        .ok()
        .and_then(|v| v.into_iter().find(|e| e.last_committed))
        .map_or_else(|| "none".to_string(), |e| e.epoch.to_string())
}

// ---------------------------------------------------------------------------
// ckpt job restore
// ---------------------------------------------------------------------------

/// A coordinator state directory holding only epoch E's record, so the
/// restart round restores E rather than the last committed epoch (the
/// job's own records are left alone). Removed on drop.
struct EpochPin {
    dir: PathBuf,
}

impl EpochPin {
    fn new(job: &JobDir, epoch: u64) -> anyhow::Result<EpochPin> {
        let store = job.store()?;
        let Some(m) = store.load(epoch) else {
            bail!("epoch {epoch} is not a committed epoch of the job (see `ckpt job list`)");
        };
        let dir = job
            .coord_state_dir()
            .join(format!(".restore-{epoch}.{}", std::process::id()));
        let pin = EpochPin { dir };
        std::fs::DirBuilder::new()
            .mode(PIN_DIR_MODE)
            .create(&pin.dir)
            .with_context(|| format!("{}: cannot create", pin.dir.display()))?;
        ckpt_coord::EpochStore::open(&pin.dir, JOB_ID)?.commit(&m)?;
        Ok(pin)
    }
}

impl Drop for EpochPin {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The `ckpt job agent restore` argv, built here only.
fn restore_agent_argv(dir: &JobDir, addr: &str, a: &RestoreArgs) -> Vec<OsString> {
    let mut argv = os(&["job", "agent", "restore"]);
    argv.extend(agent_common(dir, addr, &a.common.coord));
    if a.detach {
        argv.push("--detach".into());
    }
    for p in &a.allow_changed {
        argv.push("--allow-changed".into());
        argv.push(p.into());
    }
    argv
}

fn restore(a: RestoreArgs) -> anyhow::Result<ExitCode> {
    let register = register_timeout(&a.common.coord)?;
    let dir = JobDir::create_or_open(&a.dir)?;
    let lock = dir.lock()?;
    let placed = placements(&dir, &a.common.launch, false)?;
    let pin = a.epoch.map(|e| EpochPin::new(&dir, e)).transpose()?;
    let state = pin
        .as_ref()
        .map_or_else(|| dir.coord_state_dir(), |p| p.dir.clone());
    let epoch = match a.epoch {
        Some(e) => e,
        None => dir
            .store()?
            .last_committed()?
            .map(|m| m.epoch)
            .with_context(|| {
                format!(
                    "{}: the job has no committed epoch to restore",
                    dir.path().display()
                )
            })?,
    };
    let mut round = Round::start(
        &dir,
        &a.common.coord,
        &state,
        placed.len(),
        RoundKind::Restart,
    )?;
    let argv = restore_agent_argv(&dir, &round.agent_addr, &a);
    let mut agents = launch(&a.common.launch, &argv, &placed)?;
    let over = round.wait("job restore", &mut agents, register);
    let over = match over {
        Ok(o) => o,
        Err(e) => {
            for ag in agents.iter_mut() {
                ag.wait()?;
            }
            return Err(e);
        }
    };
    if let Outcome::Aborted {
        phase,
        node,
        reason,
    } = &over.outcome
    {
        for ag in agents.iter_mut() {
            ag.wait()?;
        }
        bail!(
            "job restore: epoch {epoch}: aborted in {phase}: {}: {reason}; no part runs",
            part_label(&placed, node)
        );
    }
    // The round is over and every part runs: while this waits for them,
    // the job may be checkpointed (`ckpt job dump`, e.g. by `ckpt slurm`
    // at its warning signal), which takes the lock and the records.
    drop(round);
    drop(lock);
    if !a.common.json {
        eprintln!(
            "ckpt: job restored from epoch {epoch} ({})",
            parts_text(placed.len())
        );
    }
    // Each agent exits with its tree's code (at once with --detach).
    let mut worst = 0;
    let mut codes = Vec::new();
    for ag in agents.iter_mut() {
        let code = exit_code(ag.wait()?);
        codes.push(serde_json::json!({ "agent": ag.label, "exit": code }));
        worst = worst.max(code);
    }
    if a.common.json {
        println!(
            "{}",
            serde_json::json!({
                "epoch": epoch,
                "parts": placed.iter().map(|p| serde_json::json!({"part": p.part, "node": p.node})).collect::<Vec<_>>(),
                "detached": a.detach,
                "exits": codes,
            })
        );
    }
    Ok(ExitCode::from(u8::try_from(worst).unwrap_or(u8::MAX)))
}

// ---------------------------------------------------------------------------
// ckpt job status / list
// ---------------------------------------------------------------------------

fn epoch_json(e: &EpochInfo) -> serde_json::Value {
    serde_json::json!({
        "epoch": e.epoch,
        "state": e.state.name(),
        "last_committed": e.last_committed,
        "committed_unix_ms": e.committed_unix_ms,
        "bytes": e.bytes,
        "parts": e.parts,
    })
}

fn status(a: ListArgs, with_parts: bool) -> anyhow::Result<ExitCode> {
    let dir = JobDir::open(&a.dir)?;
    let epochs = dir.epochs()?;
    let last = epochs.iter().find(|e| e.last_committed).map(|e| e.epoch);
    let here = this_node();
    let parts = if with_parts { dir.parts()? } else { Vec::new() };
    // A root can only be checked on its own node.
    let alive: Vec<Option<bool>> = parts
        .iter()
        .map(|p| match (p.node.as_deref(), p.root_pid) {
            (Some(n), Some(pid)) if n == here => is_ckpt_init(pid).ok(),
            _ => None,
        })
        .collect();
    if a.json {
        let mut v = serde_json::json!({
            "dir": dir.path(),
            "last_committed": last,
            "epochs": epochs.iter().map(epoch_json).collect::<Vec<_>>(),
        });
        if with_parts {
            v["parts"] = parts
                .iter()
                .zip(&alive)
                .map(|(p, al)| {
                    serde_json::json!({
                        "part": p.name, "node": p.node, "root_pid": p.root_pid, "alive": al,
                    })
                })
                .collect();
        }
        println!("{v}");
        return Ok(ExitCode::SUCCESS);
    }
    if with_parts {
        println!("job {}", dir.path().display());
        for (p, al) in parts.iter().zip(&alive) {
            let state = match al {
                Some(true) => "alive",
                Some(false) => "gone",
                None => "not checkable from this node",
            };
            println!(
                "part {:<16} node {:<16} root {:<8} {state}",
                p.name,
                p.node.as_deref().unwrap_or("?"),
                p.root_pid
                    .map_or_else(|| "?".to_string(), |r| r.to_string())
            );
        }
        match last {
            Some(e) => println!("last committed epoch {e}"),
            None => println!("last committed epoch none"),
        }
    }
    println!(
        "{:>8}  {:<9}  {:<24}  {:>12}  parts",
        "epoch", "state", "committed (UTC)", "bytes"
    );
    for e in &epochs {
        println!(
            "{:>8}  {:<9}  {:<24}  {:>12}  {}{}",
            e.epoch,
            e.state.name(),
            e.committed_unix_ms.map_or_else(|| "-".to_string(), utc),
            e.bytes,
            e.parts.join(","),
            if e.last_committed {
                "  <- last committed"
            } else {
                ""
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DD HH:MM:SS`, UTC.
fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

// ---------------------------------------------------------------------------
// ckpt job agent
// ---------------------------------------------------------------------------

/// The part this agent takes and its node.
struct Resolved {
    dir: JobDir,
    part: String,
    node: String,
}

/// Resolves the agent's part: `--part`, or under srun the part on this
/// node (dump) or the SLURM_NODEID-th part (restore: parts may move).
fn resolve(c: &AgentCommon, by_node: bool) -> anyhow::Result<Resolved> {
    let dir = JobDir::open(&c.dir)?;
    let node = c.node.clone().unwrap_or_else(this_node);
    check_name("node", &node)?;
    let part = match &c.part {
        Some(p) => p.clone(),
        None if by_node => dir
            .parts()?
            .into_iter()
            .find(|p| p.node.as_deref() == Some(node.as_str()))
            .map(|p| p.name)
            .with_context(|| format!("node {node}: no part of the job runs here"))?,
        None => {
            let i = match c.slurm_nodes.iter().position(|n| *n == node) {
                Some(i) => i,
                None if !c.slurm_nodes.is_empty() => bail!(
                    "node {node} is not one of the step's nodes {}",
                    c.slurm_nodes.join(",")
                ),
                None => {
                    let id = std::env::var("SLURM_NODEID")
                        .context("--slurm: SLURM_NODEID is not set")?;
                    id.parse()
                        .with_context(|| format!("SLURM_NODEID={id}: not a number"))?
                }
            };
            let parts = dir.parts()?;
            let n = parts.len();
            parts
                .into_iter()
                .nth(i)
                .map(|p| p.name)
                .with_context(|| format!("SLURM_NODEID={i}, but the job has {n} parts"))?
        }
    };
    dir.ensure_part(&part)?;
    Ok(Resolved { dir, part, node })
}

/// `--coord ... --job ... --node PART --secret-file ...`: the part is the
/// agent's name at the coordinator (unique in the job, wherever it runs).
fn coord_args(r: &Resolved, c: &AgentCommon) -> Vec<OsString> {
    let mut v = vec!["--dir".into(), r.dir.part_dir(&r.part).into_os_string()];
    v.extend(os(&[
        "--coord", &c.coord, "--job", JOB_ID, "--node", &r.part,
    ]));
    v.push("--secret-file".into());
    v.push(r.dir.secret_path().into_os_string());
    if let Some(k) = &c.image_key {
        v.push("--image-key".into());
        v.push(k.into());
    }
    v
}

fn agent_dump(a: AgentDumpArgs) -> anyhow::Result<ExitCode> {
    let r = resolve(&a.common, true)?;
    let recorded = r.dir.node_of(&r.part)?;
    if recorded.as_deref() != Some(r.node.as_str()) {
        bail!(
            "part {}: runs on node {}, not on this node {}, refused",
            r.part,
            recorded.as_deref().unwrap_or("?"),
            r.node
        );
    }
    let pid = r.dir.checked_root(&r.part)?;
    let mut argv = os(&["dump", "--tree", &pid.to_string()]);
    argv.extend(coord_args(&r, &a.common));
    // The job's parts talk to each other: their connections are inside
    // the job, saved with both ends frozen.
    argv.push("--tcp-established".into());
    if a.compress {
        argv.push("--compress".into());
    }
    if a.incremental {
        argv.push("--incremental".into());
    }
    super::dump::run(parse_as(&argv)?)
}

fn agent_restore(a: AgentRestoreArgs) -> anyhow::Result<ExitCode> {
    let r = resolve(&a.common, false)?;
    r.dir.set_node(&r.part, &r.node)?;
    let mut argv = os(&["restore"]);
    argv.extend(coord_args(&r, &a.common));
    // Every part's agent publishes where its part was and is now, so
    // parts restored on other nodes keep their connections.
    let parts: Vec<String> = r.dir.parts()?.into_iter().map(|p| p.name).collect();
    argv.extend(os(&["--peers", &parts.join(",")]));
    argv.push("--pidfile".into());
    argv.push(r.dir.root_pid_path(&r.part).into_os_string());
    if a.detach {
        argv.push("--detach".into());
    }
    for p in &a.allow_changed {
        argv.push("--allow-changed".into());
        argv.push(p.into());
    }
    super::restore::run(parse_as(&argv)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utc_dates() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_795_000_000_123), "2026-11-18 11:06:40");
    }
}
