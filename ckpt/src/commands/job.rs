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
//! one agent per part (`ckpt job agent`, hidden, through `ckpt_job::launch`), and
//! report the round's outcome. The agents run the coordinated code paths of
//! `ckpt dump --coord` and `ckpt restore --coord` (`dump.rs`, `restore.rs`).
//! Layout and checks of the job directory: `ckpt_job::dir`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use ckpt_coord::protocol::{AfterCommit, Outcome, RoundKind};

use ckpt_job::dir::{EpochInfo, JOB_ID, JobDir, is_ckpt_init};
use ckpt_job::launch::{LaunchKind, Launcher, Placement, exit_code, launch};
use ckpt_job::part::{self, AgentPart, PartChoice};
use ckpt_job::round::{EpochPin, Round, RoundConfig};

/// Where the coordinator listens unless told: every address, a free port.
const DEFAULT_LISTEN: &str = "0.0.0.0:0";

/// How agents reach the nodes (`--launch`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LaunchHow {
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
struct LaunchOpts {
    /// How agents reach the nodes: srun, netns or exec.
    #[arg(long, value_enum, value_name = "HOW")]
    launch: LaunchHow,
    /// The nodes, comma-separated, in part order (parts sorted by name):
    /// part i's agent runs on node i. Default: where each part runs now
    /// (as its JOBDIR/parts/PART/node says); with srun, the allocation.
    #[arg(long, value_delimiter = ',', value_name = "N1,N2,...")]
    nodes: Vec<String>,
    /// With `--launch exec`: the command that runs a program on `{host}`,
    /// e.g. `srun --overlap --nodes=1 --ntasks=1 --nodelist={host}` (split on spaces, no shell).
    #[arg(long, value_name = "CMD")]
    via: Option<String>,
    /// With `--launch srun`: agents a node, on consecutive parts (as
    /// `srun --ntasks-per-node` lays out tasks: parts of `ckpt job run
    /// --slurm-task` started so).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..), value_name = "K")]
    tasks_per_node: u32,
}

impl LaunchOpts {
    /// The library's launcher for these options.
    fn launcher(&self) -> Launcher {
        let kind = match self.launch {
            LaunchHow::Srun => LaunchKind::Srun,
            LaunchHow::Netns => LaunchKind::Netns,
            LaunchHow::Exec => LaunchKind::Exec,
        };
        Launcher {
            kind,
            nodes: self.nodes.clone(),
            via: self.via.clone(),
            srun_pmix: false,
            tasks_per_node: self.tasks_per_node,
        }
    }
}

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
    #[arg(long, value_name = "NAME", conflicts_with = "slurm_task")]
    part: Option<String>,
    /// Started by srun with several tasks a node: the part is this task's,
    /// named `task-` and its SLURM_PROCID (zero-padded), so that a restore
    /// step of the same layout brings each task back as itself.
    #[arg(long)]
    slurm_task: bool,
    /// This node's name (default: $SLURMD_NODENAME, else the named network
    /// namespace this runs in, else the host name).
    #[arg(long, value_name = "NAME")]
    node: Option<String>,
    /// Run the part in a UTS namespace of its own whose host name is the
    /// node's name: on nodes that share a host (or a part restored on
    /// another node) `gethostname()` still names the part's node, which
    /// MPI launchers match against the allocation's node list.
    #[arg(long)]
    uts: bool,
    /// Run the part in an IPC namespace of its own: its SysV objects (MPI
    /// shared-memory transports make them) are saved with their ids and
    /// recreated at restore whatever ids the node uses meanwhile, as on a
    /// node of its own.
    #[arg(long)]
    ipcns: bool,
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
    /// Dump ranks of `srun --mpi=pmix` (`ckpt dump --pmix-reconnect`), to
    /// be restored with `ckpt job restore --pmix`.
    #[arg(long)]
    pmix_reconnect: bool,
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
    /// With `--launch srun`: the agents' step is `srun --mpi=pmix`, whose
    /// PMIx servers the ranks dumped with `ckpt job dump --pmix-reconnect`
    /// are reconnected to; it must be the requeued job's first step, with
    /// the dumped task layout (one task a node).
    #[arg(long)]
    pmix: bool,
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
    /// Passed on to `ckpt dump`.
    #[arg(long)]
    pmix_reconnect: bool,
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

/// For an ordinary user: runs `ckpt ARGV` as a child, which hands the
/// command to the ckpt service (it needs root; the service's worker acts
/// for the user), passes on the signals a job is asked to stop with, and
/// returns its exit code. `None` for root, who runs it in this process.
fn delegated(argv: &[OsString]) -> Option<anyhow::Result<u8>> {
    if nix::unistd::geteuid().is_root() {
        return None;
    }
    let run = || -> anyhow::Result<u8> {
        let exe = std::env::current_exe().context("finding the ckpt executable")?;
        let mut child = std::process::Command::new(&exe)
            .args(argv)
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        let pid = i32::try_from(child.id()).context("child pid out of range")?;
        ckpt_restorer::run::forward_to(pid).context("passing signals on")?;
        let status = child
            .wait()
            .with_context(|| format!("waiting for {}", exe.display()))?;
        Ok(u8::try_from(ckpt_restorer::run::exit_code(status)).unwrap_or(u8::MAX))
    };
    Some(run())
}

/// For an ordinary user: whether the ckpt service answers here, before
/// any agent starts (each agent hands its part to its node's service): a
/// user without one is told in one line what is missing and how a site
/// grants it, rather than by every agent.
fn service_answers(command: &'static str) -> anyhow::Result<()> {
    if nix::unistd::geteuid().is_root() {
        return Ok(());
    }
    let socket = crate::service::socket_path();
    crate::service::client::probe(&socket).map_err(|reason| {
        crate::service::ServiceError::Unavailable {
            command,
            socket,
            reason,
        }
        .into()
    })
}

fn os(words: &[&str]) -> Vec<OsString> {
    words.iter().map(OsString::from).collect()
}

fn run_part(a: RunArgs) -> anyhow::Result<ExitCode> {
    let task_part = a.slurm_task.then(part::slurm_task_part).transpose()?;
    let claimed = part::claim(
        &a.dir,
        task_part.as_deref().or(a.part.as_deref()),
        a.node.as_deref(),
    )?;
    let mut argv = os(&["run", "--pidns", "--pidfile"]);
    argv.push(claimed.pidfile.clone().into_os_string());
    if a.uts {
        argv.push("--hostname".into());
        argv.push(claimed.node.clone().into());
    }
    if a.ipcns {
        argv.push("--ipcns".into());
    }
    argv.push("--".into());
    argv.extend(a.command);
    let code = match delegated(&argv) {
        Some(code) => code?,
        None => super::run::status(parse_as(&argv)?)?,
    };
    record_exit(&claimed.dir, &claimed.part, code);
    Ok(ExitCode::from(code))
}

/// Records how a part's tree ended (a launcher's wrapper waits for its
/// daemons' parts by it); a failure is only logged, the exit stands.
fn record_exit(dir: &JobDir, part: &str, code: u8) {
    if let Err(e) = dir.record_exit(part, i32::from(code)) {
        log::warn!("part {part}: cannot record its exit {code}: {e}");
    }
}

// ---------------------------------------------------------------------------
// The round: in-process coordinator and its control client
// ---------------------------------------------------------------------------

impl CoordOpts {
    /// The coordinator of a round of `kind` for `expect` parts, its
    /// records in `state_dir`.
    fn round(&self, state_dir: PathBuf, expect: usize, kind: RoundKind) -> RoundConfig {
        RoundConfig {
            listen: self.listen.clone(),
            phase_deadline: self.phase_deadline,
            state_dir,
            expect,
            kind,
            emit_log: crate::logger::verbose_on_stderr(),
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
    service_answers("job dump")?;
    let dir = JobDir::create_or_open(&a.dir)?;
    let _lock = dir.lock()?;
    let placed = a.common.launch.launcher().placements(&dir, true)?;
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
    let round = a
        .common
        .coord
        .round(dir.coord_state_dir(), placed.len(), kind);
    let mut round = Round::start(&dir, &round)?;
    let mut argv = os(&["job", "agent", "dump"]);
    argv.extend(agent_common(&dir, &round.agent_addr, &a.common.coord));
    if a.compress {
        argv.push("--compress".into());
    }
    if a.incremental {
        argv.push("--incremental".into());
    }
    if a.pmix_reconnect {
        argv.push("--pmix-reconnect".into());
    }
    let mut agents = launch(&a.common.launch.launcher(), &argv, &placed)?;
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
        super::print_stdout(&format!(
            "{}\n",
            serde_json::json!({
                "epoch": over.epoch,
                "committed": true,
                "killed": a.kill,
                "parts": parts,
                "pruned": pruned,
                "error": note,
            })
        ))?;
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
    service_answers("job restore")?;
    let dir = JobDir::create_or_open(&a.dir)?;
    let lock = dir.lock()?;
    let placed = a.common.launch.launcher().placements(&dir, false)?;
    let pin = a.epoch.map(|e| EpochPin::new(&dir, e)).transpose()?;
    let state = pin
        .as_ref()
        .map_or_else(|| dir.coord_state_dir(), |p| p.state_dir().to_path_buf());
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
    let round = a
        .common
        .coord
        .round(state, placed.len(), RoundKind::Restart);
    let mut round = Round::start(&dir, &round)?;
    let argv = restore_agent_argv(&dir, &round.agent_addr, &a);
    let launcher = Launcher {
        srun_pmix: a.pmix,
        ..a.common.launch.launcher()
    };
    let mut agents = launch(&launcher, &argv, &placed)?;
    let over = round.wait("job restore", &mut agents, register);
    let over = match over {
        Ok(o) => o,
        Err(e) => {
            for ag in agents.iter_mut() {
                ag.wait()?;
            }
            return Err(e.into());
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
        super::print_stdout(&format!(
            "{}\n",
            serde_json::json!({
                "epoch": epoch,
                "parts": placed.iter().map(|p| serde_json::json!({"part": p.part, "node": p.node})).collect::<Vec<_>>(),
                "detached": a.detach,
                "exits": codes,
            })
        ))?;
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
    let here = part::this_node();
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
        super::print_stdout(&format!("{v}\n"))?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut out = String::new();
    if with_parts {
        out += &format!("job {}\n", dir.path().display());
        for (p, al) in parts.iter().zip(&alive) {
            let state = match al {
                Some(true) => "alive",
                Some(false) => "gone",
                None => "not checkable from this node",
            };
            out += &format!(
                "part {:<16} node {:<16} root {:<8} {state}\n",
                p.name,
                p.node.as_deref().unwrap_or("?"),
                p.root_pid
                    .map_or_else(|| "?".to_string(), |r| r.to_string())
            );
        }
        match last {
            Some(e) => out += &format!("last committed epoch {e}\n"),
            None => out += "last committed epoch none\n",
        }
    }
    out += &format!(
        "{:>8}  {:<9}  {:<24}  {:>12}  parts\n",
        "epoch", "state", "committed (UTC)", "bytes"
    );
    for e in &epochs {
        out += &format!(
            "{:>8}  {:<9}  {:<24}  {:>12}  {}{}\n",
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
    super::print_stdout(&out)?;
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

impl AgentCommon {
    /// The part this agent takes and its node.
    fn resolve(&self, by_node: bool) -> anyhow::Result<AgentPart> {
        let dir = JobDir::open(&self.dir)?;
        let choice = PartChoice {
            part: self.part.clone(),
            node: self.node.clone(),
            slurm_nodes: self.slurm_nodes.clone(),
        };
        Ok(AgentPart::resolve(dir, &choice, by_node)?)
    }
}

/// `--coord ... --job ... --node PART --secret-file ...`: the part is the
/// agent's name at the coordinator (unique in the job, wherever it runs).
fn coord_args(r: &AgentPart, c: &AgentCommon) -> Vec<OsString> {
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
    let r = a.common.resolve(true)?;
    let pid = r.dump_root()?;
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
    if a.pmix_reconnect {
        argv.push("--pmix-reconnect".into());
    }
    if let Some(code) = delegated(&argv) {
        return code.map(ExitCode::from);
    }
    super::dump::run(parse_as(&argv)?)
}

fn agent_restore(a: AgentRestoreArgs) -> anyhow::Result<ExitCode> {
    let r = a.common.resolve(false)?;
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
    r.dir.clear_exit(&r.part)?;
    let code = match delegated(&argv) {
        Some(code) => code?,
        None => super::restore::status(parse_as(&argv)?)?,
    };
    if !a.detach {
        record_exit(&r.dir, &r.part, code);
    }
    Ok(ExitCode::from(code))
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
