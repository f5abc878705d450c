//! `ckpt coord`: run a checkpoint coordinator (root or sub-coordinator), or talk to one.
//!
//! ```text
//! ckpt coord --listen 0.0.0.0:7420 --job J --expect 64 [--state-dir D] [--phase-deadline 60]
//! ckpt coord --listen 0.0.0.0:7421 --job J --expect 16 --parent head:7420     # sub-coordinator
//!            [--listen-unix /run/ckpt/J.sock]       # local agents: --coord unix:/run/ckpt/J.sock
//! ckpt coord trigger --connect head:7420 --job J [--restart | --kill]
//! ckpt coord status  --connect head:7420 --job J
//! ```

use std::net::ToSocketAddrs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use ckpt_coord::protocol::{AfterCommit, Outcome, RoundKind};
use ckpt_coord::server::CoordConfig;
use ckpt_coord::{Control, Secret};

/// Arguments of `ckpt coord`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct CoordArgs {
    /// Talk to a running coordinator instead of running one.
    #[command(subcommand)]
    pub action: Option<CoordAction>,
    /// Address to listen on, e.g. 0.0.0.0:7420.
    #[arg(long)]
    pub listen: Option<String>,
    /// Also listen on a Unix stream socket at PATH for the agents on this node
    /// (`--coord unix:PATH`): cheaper than loopback TCP. Created mode 0600 (only
    /// root connects) in a directory that must be ours and not writable by
    /// others; a stale socket of ours there is replaced; removed on exit.
    #[arg(long, value_name = "PATH", requires = "listen")]
    pub listen_unix: Option<PathBuf>,
    /// Job id; agents and control clients must name the same job.
    #[arg(long, default_value = "default")]
    pub job: String,
    /// Number of nodes (agents) expected; at a sub-coordinator, its local agents.
    #[arg(long, default_value_t = 1)]
    pub expect: u32,
    /// Parent coordinator: run as a node-level sub-coordinator of that one.
    #[arg(long)]
    pub parent: Option<String>,
    /// Where the root commits epoch records (and keeps the job secret by default).
    #[arg(long, default_value = "/var/lib/ckpt/coord")]
    pub state_dir: PathBuf,
    /// Job secret file (hex, mode 0600). Default: STATE_DIR/JOB.secret, created by the
    /// root at first use. CKPT_COORD_SECRET overrides it.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Seconds every node has to finish each phase before the epoch is aborted.
    #[arg(long, default_value_t = 60.0)]
    pub phase_deadline: f64,
    /// Name in logs and, for a sub-coordinator, towards its parent (default: hostname).
    #[arg(long)]
    pub name: Option<String>,
}

/// Client actions of `ckpt coord`.
#[derive(clap::Subcommand, Debug)]
pub enum CoordAction {
    /// Start a round as soon as every node is registered, and wait for its outcome.
    Trigger(ClientArgs),
    /// Print the coordinator's state.
    Status(ClientArgs),
}

/// Arguments shared by the client actions.
#[derive(clap::Args, Debug)]
pub struct ClientArgs {
    /// Coordinator address: host:port, or unix:PATH for its --listen-unix socket.
    #[arg(long)]
    pub connect: String,
    /// Job id.
    #[arg(long, default_value = "default")]
    pub job: String,
    /// Job secret file. Default: /var/lib/ckpt/coord/JOB.secret; CKPT_COORD_SECRET
    /// overrides it.
    #[arg(long)]
    pub secret_file: Option<PathBuf>,
    /// Trigger a restart round instead of a checkpoint.
    #[arg(long, conflicts_with = "kill")]
    pub restart: bool,
    /// Kill the processes once the checkpoint is committed instead of resuming them.
    #[arg(long)]
    pub kill: bool,
    /// Give up waiting for the outcome after this many seconds.
    #[arg(long)]
    pub timeout: Option<f64>,
}

impl CoordArgs {
    /// Whether this runs a coordinator (rather than talking to one).
    pub fn serves(&self) -> bool {
        self.action.is_none()
    }
}

impl ClientArgs {
    fn secret_path(&self) -> PathBuf {
        self.secret_file
            .clone()
            .unwrap_or_else(|| Path::new(DEFAULT_STATE_DIR).join(format!("{}.secret", self.job)))
    }
}

const DEFAULT_STATE_DIR: &str = "/var/lib/ckpt/coord";

fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "coord".to_string())
}

fn client_secret(path: &Path) -> anyhow::Result<Secret> {
    Secret::load_client(path).with_context(|| format!("reading the job secret {}", path.display()))
}

/// Runs `ckpt coord`.
pub fn run(args: CoordArgs) -> anyhow::Result<()> {
    match args.action {
        Some(CoordAction::Trigger(c)) => return trigger(&c),
        Some(CoordAction::Status(c)) => return status(&c),
        None => {}
    }
    let Some(listen) = args.listen.as_deref() else {
        bail!("ckpt coord needs --listen ADDR (or a `trigger`/`status` subcommand)");
    };
    let listen = listen
        .to_socket_addrs()
        .with_context(|| format!("resolving --listen {listen}"))?
        .next()
        .with_context(|| format!("--listen {listen} resolves to nothing"))?;
    if args.expect == 0 {
        bail!("--expect must be at least 1");
    }
    let secret_path = args
        .secret_file
        .clone()
        .unwrap_or_else(|| args.state_dir.join(format!("{}.secret", args.job)));
    let secret = if args.parent.is_none() {
        std::fs::create_dir_all(&args.state_dir)
            .with_context(|| format!("creating {}", args.state_dir.display()))?;
        Secret::load_or_create(&secret_path)
            .with_context(|| format!("job secret {}", secret_path.display()))?
    } else {
        client_secret(&secret_path)?
    };
    let mut cfg = CoordConfig::new(listen, &args.job, args.expect, secret);
    cfg.parent = args.parent.clone();
    cfg.listen_unix = args.listen_unix.clone();
    cfg.state_dir = args.parent.is_none().then(|| args.state_dir.clone());
    cfg.phase_deadline = Duration::from_secs_f64(args.phase_deadline);
    cfg.name = args.name.clone().unwrap_or_else(host_name);
    if cfg.listen_unix.is_some() {
        return run_until_signal(cfg, &args.job);
    }
    ckpt_coord::server::run(cfg).with_context(|| format!("coordinator for job {}", args.job))
}

/// Runs the coordinator until it fails or SIGTERM, SIGINT or SIGHUP arrives, then stops
/// it so that it removes its Unix socket file (a signal's default action would leave the
/// file behind; the next start would replace it, but nothing should be left to guess).
fn run_until_signal(cfg: CoordConfig, job: &str) -> anyhow::Result<()> {
    use nix::sys::signal::{SigSet, Signal};
    let mut signals = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        signals.add(s);
    }
    // Blocked before the coordinator's thread starts, so it inherits the mask and the
    // signals wait for `sigwait` below.
    signals
        .thread_block()
        .context("blocking SIGTERM/SIGINT/SIGHUP")?;
    let handle = ckpt_coord::spawn(cfg).with_context(|| format!("coordinator for job {job}"))?;
    let stopper = handle.stopper();
    std::thread::Builder::new()
        .name("coord-signals".into())
        .spawn(move || {
            if let Ok(sig) = signals.wait() {
                log::info!("coordinator: {sig}: stopping");
                stopper.stop();
            }
        })
        .context("starting the signal thread")?;
    handle
        .join()
        .with_context(|| format!("coordinator for job {job}"))
}

/// `ckpt coord trigger`: starts a round and reports how it ended; fails if it aborted.
pub fn trigger(c: &ClientArgs) -> anyhow::Result<()> {
    let secret = client_secret(&c.secret_path())?;
    let mut ctl = Control::connect(&c.connect, &c.job, secret, &format!("ctl@{}", host_name()))
        .with_context(|| format!("connecting to coordinator {}", c.connect))?;
    let kind = if c.restart {
        RoundKind::Restart
    } else {
        RoundKind::Checkpoint {
            then: if c.kill {
                AfterCommit::Kill
            } else {
                AfterCommit::Resume
            },
        }
    };
    let r = ctl
        .trigger(kind, c.timeout.map(Duration::from_secs_f64))
        .context("waiting for the round")?;
    let text = match r.outcome {
        Outcome::Committed => format!("epoch {} committed\n", r.epoch),
        Outcome::Restarted => format!("restart (round {}) complete\n", r.epoch),
        Outcome::CommittedWithErrors { node, reason } => {
            format!(
                "epoch {} committed; node {node} then failed: {reason}\n",
                r.epoch
            )
        }
        Outcome::Aborted {
            phase,
            node,
            reason,
        } => bail!(
            "epoch {} aborted in {phase}: node {node}: {reason}",
            r.epoch
        ),
    };
    super::print_stdout(&text)?;
    Ok(())
}

/// `ckpt coord status`.
pub fn status(c: &ClientArgs) -> anyhow::Result<()> {
    let secret = client_secret(&c.secret_path())?;
    let mut ctl = Control::connect(&c.connect, &c.job, secret, &format!("ctl@{}", host_name()))
        .with_context(|| format!("connecting to coordinator {}", c.connect))?;
    let s = ctl.status().context("asking for status")?;
    let mut text = format!("registered     {}/{}\n", s.registered, s.expect);
    match s.last_committed {
        Some(e) => text += &format!("last committed epoch {e}\n"),
        None => text += "last committed none\n",
    }
    match s.running {
        Some((e, p)) => text += &format!("running        epoch {e}, {p}\n"),
        None => text += "running        nothing\n",
    }
    text += &format!(
        "traffic        {} B in, {} B out, {} connections refused\n",
        s.bytes_in, s.bytes_out, s.refused
    );
    super::print_stdout(&text)?;
    Ok(())
}
