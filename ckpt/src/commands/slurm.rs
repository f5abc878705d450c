//! `ckpt slurm`: the job wrapper a Slurm batch script `exec`s.
//!
//! First start: run the application (under `ckpt run --pidns`, so its
//! checkpoints restore into a PID namespace of their own wherever the
//! host's pids are taken) and wait for it. On the warning signal
//! (`sbatch --signal=B:USR1@T`): dump the application's tree with `--kill`
//! into `DIR/ckpt-N`, commit it (`DIR/LATEST` replaced atomically), prune
//! old checkpoints, `scontrol requeue` the job and exit 0. When the requeued
//! job comes back (same job id, `SLURM_RESTART_COUNT` > 0) and `DIR` holds a
//! committed checkpoint, restore it in the foreground instead and supervise
//! it the same way.
//!
//! In an allocation of several nodes the application runs once per node
//! instead, as the parts of a `ckpt job` in `DIR/job`, checkpointed and
//! restored as a whole ([`nodes`]); an MPI launcher (`mpirun`) runs once,
//! and the daemons it starts through Slurm are the other nodes' parts
//! ([`daemons`]).
//!
//! Every checkpoint is timed against the lead Slurm gives it
//! ([`budget`]), and the job registers its signal and directory in its
//! comment for the site's hooks ([`site`]: `ckpt slurm trigger` for a
//! controller-side `strigger`, `ckpt slurm epilog` for the node Epilog).
//!
//! Signals are taken synchronously (blocked, then `sigwait`): Slurm sends
//! SIGCONT right after the warning signal, and the warning may come at any
//! time, even while a restore is still running; both simply stay pending
//! until the supervising loop takes them.

use std::ffi::OsString;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use ckpt_restorer::{FilePolicy, RestoreOptions};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, getpgid, getpgrp};

use ckpt_job::slurm::checkpoints::{committed, prune};
use ckpt_job::slurm::client;
use ckpt_job::slurm::client::parse_signal;
use ckpt_job::slurm::daemons::{Daemons, Flavor, LaunchDir, Serve};
use ckpt_job::slurm::nodes;
use ckpt_job::slurm::{Checkpointing, Then, tree};
use ckpt_job::slurm::{budget, nodes::NodesError};

#[path = "slurm_site.rs"]
mod site;

/// How long a restore waits for a zombie that still holds a dumped pid.
const PID_WAIT: Duration = Duration::from_secs(30);

/// Arguments of `ckpt slurm`.
#[derive(clap::Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SlurmArgs {
    /// A site hook instead of the job wrapper.
    #[command(subcommand)]
    hook: Option<Hook>,
    /// Checkpoint directory (created 0700 if missing; default:
    /// $SLURM_SUBMIT_DIR/ckpt-slurm-$SLURM_JOB_ID). It must be reachable
    /// from the node the requeued job runs on (from every node for a job
    /// of several nodes, whose parts' job directory is DIR/job).
    #[arg(long, short = 'D', value_name = "DIR")]
    dir: Option<PathBuf>,
    /// How many committed checkpoints to keep (the newest).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..), value_name = "N")]
    keep: u32,
    /// Also checkpoint the running application every DURATION
    /// (`[DAYS-][[HH:]MM:]SS`, as Slurm prints times: `90` is 90 seconds,
    /// `30:00` half an hour), leaving it running. With --keep the newest
    /// committed checkpoints stay; a requeued job (after the warning, or a
    /// node failure) restores the newest.
    #[arg(long, value_parser = parse_every, value_name = "DURATION")]
    every: Option<Duration>,
    /// Periodic checkpoints in the background: every part is frozen only
    /// to capture its registers and files and write-protect its memory
    /// (all parts thaw together), and the pages are written while it runs.
    #[arg(long, requires = "every", conflicts_with = "incremental")]
    background: bool,
    /// Periodic checkpoints (and the one at the warning) read only the
    /// pages written since the last committed one; each stays complete.
    #[arg(long, requires = "every")]
    incremental: bool,
    /// The warning signal that asks for a checkpoint (as in `sbatch
    /// --signal=B:SIG@T`).
    #[arg(long, default_value = "USR1", value_parser = parse_signal, value_name = "SIG")]
    signal: Signal,
    /// The site's image key file (default: $CKPT_IMAGE_KEY, else
    /// /var/lib/ckpt/image.key).
    #[arg(long, value_name = "PATH")]
    image_key: Option<PathBuf>,
    /// Seconds Slurm gives a checkpoint before it kills the job (default:
    /// asked at each signal: the partition's GraceTime when the job is
    /// preempted, else the time left to its limit). A checkpoint that takes
    /// longer, from the signal to its commit, is reported in one line.
    #[arg(long, value_name = "SECS")]
    lead: Option<u64>,
    /// In an allocation of several nodes: the application is an MPI
    /// launcher, run once as this node's part, whose daemons (started
    /// through Slurm) are the other nodes' parts. The default when it is
    /// Open MPI's mpirun, mpiexec or orterun, or MPICH's mpiexec.hydra
    /// (also an mpirun or mpiexec beside hydra_pmi_proxy, as pip installs
    /// MPICH).
    #[arg(long, conflicts_with = "per_node")]
    launcher: bool,
    /// In an allocation of several nodes: run the application once per
    /// node, even when it is an MPI launcher.
    #[arg(long)]
    per_node: bool,
    /// The application and its arguments (run once per node in an
    /// allocation of several nodes, unless it is an MPI launcher).
    #[arg(last = true, required = true, value_name = "APP")]
    app: Vec<OsString>,
}

/// The site's hooks around the wrapper (see docs/slurm.md, "Site hooks").
#[derive(clap::Subcommand, Debug)]
enum Hook {
    /// strigger program (controller host): ask a running ckpt slurm job to
    /// checkpoint now, by sending its signal to its batch step.
    Trigger(site::TriggerArgs),
    /// Node Epilog: verify the job's committed checkpoint and remove what a
    /// killed dump left (its temporary directories: `ckpt gc`); one line
    /// per action.
    Epilog(site::EpilogArgs),
}

/// The checkpoint directory Slurm job `job` registered in its comment, if
/// it is a `ckpt slurm` job (the site hooks' view of it).
pub fn registered_dir(job: &str) -> anyhow::Result<Option<PathBuf>> {
    match client::JobRecord::query(job)?.registration() {
        None => Ok(None),
        Some(r) => Ok(Some(r.with_context(|| format!("job {job}"))?.dir)),
    }
}

/// One warning line: the job's stderr and ckpt's log file.
fn warn(msg: &str) {
    eprintln!("ckpt slurm: {msg}");
    crate::logger::file_only(log::Level::Warn, &format!("ckpt slurm: {msg}"));
}

/// `--every`: a Slurm duration of at least a second.
fn parse_every(s: &str) -> Result<Duration, String> {
    match budget::parse_duration(s) {
        Some(d) if d >= Duration::from_secs(1) => Ok(d),
        Some(_) => Err(format!("{s}: at least one second")),
        None => Err(format!(
            "{s}: not a duration ([DAYS-][[HH:]MM:]SS, e.g. 90 or 30:00)"
        )),
    }
}

/// Asks for the next periodic checkpoint, as SIGALRM after `--every`.
fn arm_every(a: &SlurmArgs) {
    if let Some(every) = a.every {
        let secs = u32::try_from(every.as_secs()).unwrap_or(u32::MAX).max(1);
        nix::unistd::alarm::set(secs);
    }
}

/// The job as Slurm describes it in the batch environment.
struct Job {
    id: String,
    restart_count: u32,
}

/// srun's options `ckpt slurm -- srun OPTIONS PROG ARGS` takes: the ranks
/// of its step are the parts, the allocation's tasks a node.
const SRUN_PMIX: &str = "--mpi=pmix";

impl SlurmArgs {
    /// `PROG ARGS` of `srun --mpi=pmix PROG ARGS`, if the application is
    /// that; an error for srun with other options (the parts' step is
    /// ckpt's: the allocation's tasks).
    fn srun_pmix_app(&self) -> anyhow::Result<Option<Vec<OsString>>> {
        let Some(first) = self.app.first() else {
            return Ok(None);
        };
        if Path::new(first).file_name() != Some(std::ffi::OsStr::new("srun")) {
            return Ok(None);
        }
        let options: Vec<&OsString> = self.app[1..]
            .iter()
            .take_while(|a| a.to_string_lossy().starts_with('-'))
            .collect();
        if !options.iter().any(|o| *o == SRUN_PMIX) {
            return Ok(None);
        }
        if options.len() != 1 || self.app.len() < 3 {
            anyhow::bail!(
                "ckpt slurm -- srun {SRUN_PMIX} PROG ARGS: srun takes no other option here (ckpt runs the step: the allocation's tasks, each rank a part), got {}",
                self.app
                    .iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
                    .join(" ")
            );
        }
        Ok(Some(self.app[2..].to_vec()))
    }

    /// The MPI launcher to run once, if the application is one (or
    /// `--launcher` says so: then Open MPI's unless its name says hydra).
    fn mpi_launcher(&self) -> Option<Flavor> {
        if self.per_node {
            return None;
        }
        match self.app.first().and_then(|p| Flavor::of(p)) {
            None if self.launcher => Some(Flavor::OpenMpi),
            f => f,
        }
    }
}

impl Job {
    fn from_env() -> anyhow::Result<Job> {
        let id = std::env::var("SLURM_JOB_ID")
            .ok()
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .context("SLURM_JOB_ID is not set to a job id: run ckpt slurm from a Slurm batch script (exec ckpt slurm -- APP)")?;
        let restart_count = match std::env::var("SLURM_RESTART_COUNT") {
            Ok(s) if !s.is_empty() => s
                .parse()
                .with_context(|| format!("SLURM_RESTART_COUNT={s}: not a number"))?,
            _ => 0,
        };
        Ok(Job { id, restart_count })
    }
}

/// The application the wrapper supervises.
struct App {
    /// The wrapper's child it waits for: `ckpt run` on the first run, the
    /// restored init after a restart; for a job of several nodes the srun
    /// step of its parts, or `ckpt job restore`.
    pid: Pid,
    /// What a checkpoint saves.
    target: Target,
    /// An MPI launcher's daemons' launches, served for its stand-in.
    daemons: Option<Daemons>,
}

impl App {
    /// Before a checkpoint: the daemons' ends wait.
    fn hold(&self) {
        if let Some(d) = &self.daemons {
            d.hold();
        }
    }

    /// After it: `ended_job` if it killed the application.
    fn release(&self, ended_job: bool) {
        if let Some(d) = &self.daemons {
            d.release(ended_job);
        }
    }
}

/// What a checkpoint saves.
enum Target {
    /// The tree of the init of the application's PID namespace.
    Tree(Pid),
    /// Every part of a job spanning several nodes.
    Parts(nodes::Parts),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Tree(pid) => write!(f, "pid {pid}"),
            Target::Parts(p) => p.fmt(f),
        }
    }
}

impl Target {
    /// Where the committed checkpoint `name` is, for messages.
    fn place(&self, dir: &Path, name: &str) -> String {
        match self {
            Target::Tree(_) => dir.join(name).display().to_string(),
            Target::Parts(p) => p.place(name),
        }
    }

    /// How a user restores the committed checkpoint `name` by hand.
    fn restore_hint(&self, dir: &Path, name: &str) -> String {
        match self {
            Target::Tree(_) => format!("ckpt restore -D {}", dir.join(name).display()),
            Target::Parts(p) => p.restore_hint(),
        }
    }
}

/// Runs `ckpt slurm`: exits with the application's status (128+signal if
/// killed), or 0 once it is checkpointed and the job requeued.
pub fn run(a: SlurmArgs) -> anyhow::Result<ExitCode> {
    match a.hook {
        Some(Hook::Trigger(t)) => return site::trigger(t),
        Some(Hook::Epilog(e)) => return site::epilog(e),
        None => {}
    }
    // First, before anything can start a thread or a child: from here on the
    // signals wait in the pending set until the loop takes them.
    let mut signals = SigSet::empty();
    for s in [a.signal, Signal::SIGCONT, Signal::SIGTERM, Signal::SIGCHLD] {
        signals.add(s);
    }
    if a.every.is_some() {
        signals.add(Signal::SIGALRM);
    }
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&signals), None).context("block signals")?;

    let job = Job::from_env()?;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            let submit = std::env::var_os("SLURM_SUBMIT_DIR")
                .context("no --dir given and SLURM_SUBMIT_DIR is not set")?;
            Path::new(&submit).join(format!("ckpt-slurm-{}", job.id))
        }
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .with_context(|| format!("{}: cannot create checkpoint directory", dir.display()))?;

    let dir = std::path::absolute(&dir)
        .with_context(|| format!("{}: cannot make it absolute", dir.display()))?;
    site::register(
        &job.id,
        &client::Registration {
            signal: a.signal,
            dir: dir.clone(),
        },
    );

    let node_count = nodes::allocation_nodes()?;
    let srun_pmix = a.srun_pmix_app()?;
    // Ranks of srun --mpi=pmix are parts even on one node: their tree is
    // under slurmstepd, not under this wrapper.
    let parts = match (node_count, &srun_pmix) {
        (1, None) => None,
        (n, None) => Some(nodes::Parts::open(&dir, n)?),
        (n, Some(_)) => {
            let per_node = nodes::allocation_tasks_per_node()?;
            Some(nodes::Parts::open(&dir, n)?.srun_pmix(per_node))
        }
    };
    let committed = match &parts {
        None => committed(&dir)?,
        Some(p) => p.committed()?,
    };
    let lead = a.lead.map(Duration::from_secs);
    budget::check_at_start(&dir, committed.as_deref(), lead, &warn);
    if committed.is_none() && job.restart_count > 0 {
        eprintln!(
            "ckpt slurm: job {} restart {} but no committed checkpoint in {}: starting the application afresh",
            job.id,
            job.restart_count,
            dir.display()
        );
    }
    let restart = committed.filter(|_| job.restart_count > 0);
    let app = match (parts, restart) {
        (None, Some(ckpt)) => restore(&a, &job, &dir.join(&ckpt))?,
        (None, None) => {
            let started = tree::start(&a.app, &dir)?;
            App {
                pid: started.run,
                target: Target::Tree(started.tree),
                daemons: None,
            }
        }
        (Some(p), Some(epoch)) => {
            let since = std::time::SystemTime::now();
            let daemons = match a.mpi_launcher() {
                Some(_) => Some(serve_restored_daemons(&dir, &p, since)?),
                None => None,
            };
            let pid = p.restore(a.image_key.as_deref())?;
            eprintln!(
                "ckpt slurm: job {} restart {}: restoring {p} from {}",
                job.id,
                job.restart_count,
                p.place(&epoch)
            );
            p.wait_running(since, pid, &warn);
            App {
                pid,
                target: Target::Parts(p),
                daemons,
            }
        }
        (Some(p), None) if a.mpi_launcher().is_some() => {
            let since = std::time::SystemTime::now();
            let flavor = a.mpi_launcher().unwrap_or(Flavor::OpenMpi);
            let (pid, daemons) = start_launcher(&a, flavor, &dir, &p)?;
            p.wait_running(since, pid, &warn);
            App {
                pid,
                target: Target::Parts(p),
                daemons: Some(daemons),
            }
        }
        (Some(p), None) => {
            let since = std::time::SystemTime::now();
            if srun_pmix.is_some() {
                eprintln!(
                    "ckpt slurm: srun {SRUN_PMIX}: the allocation's tasks, each rank a part; a checkpoint saves their links to slurmstepd's PMIx servers for the requeued job's first step"
                );
            }
            let pid = p.start(srun_pmix.as_deref().unwrap_or(&a.app))?;
            p.wait_running(since, pid, &warn);
            App {
                pid,
                target: Target::Parts(p),
                daemons: None,
            }
        }
    };
    supervise(&a, &job, &dir, &app, &signals)
}

/// Starts an MPI launcher once, as this node's part, and serves its
/// daemons' launches with the real srun.
fn start_launcher(
    a: &SlurmArgs,
    flavor: Flavor,
    dir: &Path,
    parts: &nodes::Parts,
) -> anyhow::Result<(Pid, Daemons)> {
    let node = ckpt_job::part::this_node();
    let launch = LaunchDir::create(dir, &node)?;
    let srun = launch.real_srun()?;
    let (env, added) = launch.launcher_env(flavor, parts.jobdir())?;
    eprintln!(
        "ckpt slurm: {} ({flavor}) runs once, as node {node}'s part; the daemons it starts on the other nodes are their parts (set: {added})",
        a.app[0].to_string_lossy()
    );
    let jobdir = parts.jobdir().to_path_buf();
    let daemons = Daemons::serve(launch, Serve::Fresh { srun, jobdir }, warn)?;
    let pid = parts.start_launcher(&a.app, &env)?;
    Ok((pid, daemons))
}

/// After a restart of an MPI launcher's job: its stand-in, restored
/// waiting for its daemons, hears of their end from the restored parts.
fn serve_restored_daemons(
    dir: &Path,
    parts: &nodes::Parts,
    since: std::time::SystemTime,
) -> anyhow::Result<Daemons> {
    let launch = LaunchDir::of(dir);
    launch.forget_exits()?;
    let jobdir = ckpt_job::JobDir::open(parts.jobdir())?;
    Ok(Daemons::serve(
        launch,
        Serve::Restored { jobdir, since },
        warn,
    )?)
}

/// Restores `ckpt` as a child of this process. The job's output file is the
/// same path as at the dump but has grown (or was truncated) since: stdio
/// fds on regular files are accepted as changed and reopened at their end,
/// so the output continues where the new run writes.
fn restore(a: &SlurmArgs, job: &Job, ckpt: &Path) -> anyhow::Result<App> {
    if !nix::unistd::geteuid().is_root() {
        return restore_through_service(job, ckpt);
    }
    let key = ckpt_image::ImageKey::load(&ckpt_image::seal::key_path(a.image_key.as_deref()))
        .with_context(|| format!("restore from {} failed", ckpt.display()))?;
    let notice = |msg: &str| eprintln!("ckpt slurm: {msg}");
    let opts = RestoreOptions {
        dir: ckpt.to_path_buf(),
        key: &key,
        pid_wait: PID_WAIT,
        notice: &notice,
        progress: None,
        files: FilePolicy {
            inherit_fds: Vec::new(),
            allow_changed: ckpt_job::slurm::stdio_files(),
            ..FilePolicy::default()
        },
        lazy: false,
        netns: None,
        mntns: None,
        pmix_step: ckpt_restorer::pmix::StepEnv::default(),
    };
    let r = ckpt_restorer::restore(&opts)
        .with_context(|| format!("restore from {} failed", ckpt.display()))?;
    eprintln!(
        "ckpt slurm: job {} restart {}: restored pid {} from {}",
        job.id,
        job.restart_count,
        r.pid,
        ckpt.display()
    );
    Ok(App {
        pid: Pid::from_raw(r.pid),
        target: Target::Tree(Pid::from_raw(r.pid)),
        daemons: None,
    })
}

/// [`restore`] for an ordinary user: a `ckpt restore` child, which the
/// ckpt service runs for them, is what the wrapper waits for; the
/// restored tree (the service's, not ours) is what a checkpoint saves.
fn restore_through_service(job: &Job, ckpt: &Path) -> anyhow::Result<App> {
    let dir = ckpt.parent().unwrap_or(Path::new("."));
    let started = tree::restore_through_service(ckpt, dir, &ckpt_job::slurm::stdio_files())
        .with_context(|| format!("restore from {} failed", ckpt.display()))?;
    eprintln!(
        "ckpt slurm: job {} restart {}: restored pid {} from {} through the ckpt service",
        job.id,
        job.restart_count,
        started.tree,
        ckpt.display()
    );
    Ok(App {
        pid: started.run,
        target: Target::Tree(started.tree),
        daemons: None,
    })
}

/// Waits for the application to end or for a signal.
fn supervise(
    a: &SlurmArgs,
    job: &Job,
    dir: &Path,
    app: &App,
    signals: &SigSet,
) -> anyhow::Result<ExitCode> {
    arm_every(a);
    loop {
        // A child may have ended before SIGCHLD was blocked or between two
        // waits: look first, then wait for the next signal.
        if let Some(code) = reap(app)? {
            return Ok(code);
        }
        let sig = signals.wait().context("sigwait")?;
        if sig == a.signal {
            let lead = a.lead.map(Duration::from_secs);
            let attempt = budget::Attempt::begin(dir, &job.id, lead, &warn);
            app.hold();
            let done = checkpoint(a, dir, app, Then::Kill);
            app.release(done.is_ok());
            match done {
                Ok(name) => {
                    let (took, lead) = attempt.committed(dir, &name, &warn);
                    prune_tree_checkpoints(a, dir, app);
                    eprintln!(
                        "ckpt slurm: {} checkpointed into {} and committed {:.1} s after the signal{}",
                        app.target,
                        app.target.place(dir, &name),
                        took.as_secs_f64(),
                        lead.map_or_else(String::new, |l| {
                            let fit = if took > l.time { "over" } else { "within" };
                            format!(", {fit} its {l}")
                        })
                    );
                    return requeue(job, &app.target, dir, &name);
                }
                Err(e) => {
                    attempt.abandon(dir);
                    let last = match &app.target {
                        Target::Tree(_) => committed(dir).map_err(anyhow::Error::from),
                        Target::Parts(p) => p.committed().map_err(anyhow::Error::from),
                    };
                    eprintln!(
                        "ckpt slurm: checkpoint of {} failed, the application keeps running ({}): {e:#}",
                        app.target,
                        last.ok().flatten().map_or_else(
                            || "no checkpoint committed".to_string(),
                            |n| format!("{} stays committed", app.target.place(dir, &n))
                        )
                    );
                }
            }
        } else if sig == Signal::SIGALRM {
            periodic(a, dir, app);
            arm_every(a);
        } else if sig == Signal::SIGTERM {
            // Slurm's end (time limit without a warning, scancel): the
            // application gets it as it would without the wrapper.
            forward(app, sig);
        }
        // SIGCONT (sent with every warning) and SIGCHLD: nothing to do
        // beyond the look at the top of the loop.
    }
}

/// The application's exit status, if it has ended.
fn reap(app: &App) -> anyhow::Result<Option<ExitCode>> {
    match waitpid(app.pid, Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::Exited(_, code)) => Ok(Some(ExitCode::from(code as u8))),
        Ok(WaitStatus::Signaled(_, sig, _)) => Ok(Some(ExitCode::from(128 + sig as u8))),
        Ok(_) | Err(nix::errno::Errno::EINTR) => Ok(None),
        Err(e) => Err(e).context(format!("waiting for pid {}", app.pid)),
    }
}

/// Sends `sig` to the application's process group (or only to it if it
/// shares ours).
fn forward(app: &App, sig: Signal) {
    let target = match getpgid(Some(app.pid)) {
        Ok(pg) if pg != getpgrp() => Pid::from_raw(-pg.as_raw()),
        _ => app.pid,
    };
    let _ = kill(target, sig);
}

/// Keeps the newest `--keep` checkpoints of a single-node application
/// (`ckpt job dump` prunes a job's epochs itself), one line per one it
/// could not remove.
fn prune_tree_checkpoints(a: &SlurmArgs, dir: &Path, app: &App) {
    if let Target::Tree(_) = app.target {
        for f in prune(dir, a.keep) {
            eprintln!(
                "ckpt slurm: {}: cannot remove old checkpoint: {}",
                f.path.display(),
                f.error
            );
        }
    }
}

/// A periodic checkpoint (`--every`): the application runs on whatever
/// happens; a failure is one line, and the last committed checkpoint stays.
fn periodic(a: &SlurmArgs, dir: &Path, app: &App) {
    let started = std::time::Instant::now();
    app.hold();
    let done = checkpoint(a, dir, app, Then::Resume);
    app.release(false);
    match done {
        Ok(name) => {
            prune_tree_checkpoints(a, dir, app);
            eprintln!(
                "ckpt slurm: {} checkpointed into {} (periodic, {:.1} s), running on",
                app.target,
                app.target.place(dir, &name),
                started.elapsed().as_secs_f64()
            );
        }
        Err(e) => eprintln!(
            "ckpt slurm: periodic checkpoint of {} failed, the application keeps running: {e:#}",
            app.target
        ),
    }
}

/// Checkpoints the application and commits the checkpoint; returns its
/// name. On failure nothing is committed.
fn checkpoint(a: &SlurmArgs, dir: &Path, app: &App, then: Then) -> anyhow::Result<String> {
    let how = Checkpointing {
        keep: a.keep,
        signal: a.signal,
        image_key: a.image_key.as_deref(),
        then,
        background: a.background,
        incremental: a.incremental,
    };
    match &app.target {
        Target::Tree(t) => Ok(tree::checkpoint(dir, *t, &how)?),
        Target::Parts(p) => {
            p.checkpoint(&how, dir).map_err(|e| {
                // The agents' errors go to the job's output.
                if let NodesError::DumpFailed { output, .. } = &e {
                    eprint!("{output}");
                }
                e.into()
            })
        }
    }
}

/// Requeues the job once its checkpoint is committed.
fn requeue(job: &Job, target: &Target, dir: &Path, name: &str) -> anyhow::Result<ExitCode> {
    let out = Command::new("scontrol")
        .arg("requeue")
        .arg(&job.id)
        .stdin(Stdio::null())
        .output()
        .context("cannot run scontrol requeue")?;
    if !out.status.success() {
        bail!(
            "{} is committed but `scontrol requeue {}` failed ({}): {}; restore it with {}",
            target.place(dir, name),
            job.id,
            out.status,
            String::from_utf8_lossy(&out.stderr).trim(),
            target.restore_hint(dir, name)
        );
    }
    eprintln!("ckpt slurm: job {} requeued", job.id);
    Ok(ExitCode::SUCCESS)
}
