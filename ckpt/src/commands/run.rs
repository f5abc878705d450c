//! `ckpt run [--pidns] [--utsns] [--ipcns] [--timens] [--ib] -- CMD ARGS...`:
//! the command runs in new namespaces of those kinds; with --pidns as PID
//! 2 of a new PID namespace under ckpt's init (PID 1), see
//! `ckpt_restorer::run`; without, ckpt execs it (same pid) once the
//! namespaces are made. With --ib the job runs with the verbs layer
//! preloaded, so its InfiniBand state can be checkpointed.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use ckpt_image::TrustedParent;

/// Arguments of `ckpt run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Run the command in a new PID namespace (and a mount namespace with
    /// its own /proc), under ckpt's init as PID 1: dump it with
    /// `ckpt dump --tree <host pid of the init>`; a restore recreates the
    /// namespace with the same pids inside.
    #[arg(long)]
    pidns: bool,
    /// Run the command in a new UTS namespace: a hostname of its own, saved
    /// and set again at restore.
    #[arg(long)]
    utsns: bool,
    /// With a new UTS namespace (implied): its host name, set before the
    /// command starts (the parts of a job whose nodes share one host tell
    /// their node by it, as MPI launchers do).
    #[arg(long, value_name = "NAME", value_parser = parse_hostname)]
    hostname: Option<ckpt_restorer::run::Hostname>,
    /// Run the command in a new IPC namespace: SysV objects of its own,
    /// saved with their ids and recreated at restore, whatever ids the
    /// host uses meanwhile.
    #[arg(long)]
    ipcns: bool,
    /// Run the command in a new time namespace: its CLOCK_MONOTONIC and
    /// CLOCK_BOOTTIME continue after a restore from where they were at the
    /// dump, on any host.
    #[arg(long)]
    timens: bool,
    /// With --timens: start the job's monotonic and boot clocks this many
    /// seconds ahead of the host's (negative: behind, down to zero).
    #[arg(
        long,
        value_name = "SECONDS",
        requires = "timens",
        allow_negative_numbers = true
    )]
    clock_offset: Option<i64>,
    /// Run the job with the InfiniBand verbs layer (libckpt_ibverbs.so,
    /// from $CKPT_IB_LAYER or beside the ckpt executable) in LD_PRELOAD, so
    /// its verbs resources can be checkpointed and recreated at restart.
    /// A batch script can set LD_PRELOAD to the same file itself.
    #[arg(long)]
    ib: bool,
    /// Write the host pid of the namespace's init (the pid to dump) to
    /// this file once it runs.
    #[arg(long, value_name = "PATH")]
    pidfile: Option<PathBuf>,
    /// Internal: this process is the namespace's init.
    #[arg(long, hide = true)]
    pidns_init: bool,
    /// Internal: the init's command runs with this LD_PRELOAD (--ib).
    #[arg(long, hide = true, value_name = "LIST")]
    preload: Option<OsString>,
    /// The command and its arguments.
    #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

impl RunArgs {
    /// Whether the command needs root: a namespace of its own (`--ib` alone
    /// only preloads a library).
    pub fn needs_root(&self) -> bool {
        self.pidns || self.utsns || self.hostname.is_some() || self.ipcns || self.timens
    }

    /// Whether this process is a namespace's init (started by `ckpt run`
    /// itself, never handed to the service).
    pub fn is_namespace_init(&self) -> bool {
        self.pidns_init
    }
}

/// Runs `ckpt run`: exits with the command's status (128+signal if a
/// signal killed it).
pub fn run(a: RunArgs) -> anyhow::Result<ExitCode> {
    status(a).map(ExitCode::from)
}

/// [`run`]'s exit code.
pub fn status(a: RunArgs) -> anyhow::Result<u8> {
    if a.pidns_init {
        let preload = a.preload.iter().map(|p| ("LD_PRELOAD".into(), p.clone()));
        let caller = ckpt_image::caller::acting_for();
        let env: Vec<(OsString, OsString)> = match caller {
            // The job's own environment, and the init becomes the job's.
            Some(c) => {
                ckpt_restorer::run::become_caller(c)
                    .with_context(|| format!("pid namespace init: becoming {c}"))?;
                crate::service::worker::job_env()
                    .into_iter()
                    .filter(|(k, _)| k != "LD_PRELOAD")
                    .chain(preload)
                    .collect()
            }
            None => preload.collect(),
        };
        let env = match caller {
            Some(_) => ckpt_restorer::run::CommandEnv::Exactly(&env),
            None => ckpt_restorer::run::CommandEnv::Inherited(&env),
        };
        let code = ckpt_restorer::run::init(&a.command, env).with_context(|| {
            format!(
                "pid namespace init: starting {}",
                a.command[0].to_string_lossy()
            )
        })?;
        return Ok(code as u8);
    }
    let ns = ckpt_restorer::run::JobNamespaces {
        uts: a.utsns || a.hostname.is_some(),
        hostname: a.hostname.clone(),
        ipc: a.ipcns,
        time: a.timens.then_some(a.clock_offset.unwrap_or(0)),
    };
    if !a.pidns && !ns.any() && !a.ib {
        anyhow::bail!(
            "ckpt run needs at least one of --pidns, --utsns, --hostname, --ipcns, --timens, --ib"
        );
    }
    // Checked before the job starts: a path through a user's symlink
    // fails the run, not the job once it runs.
    let pidfile = super::output_parent(a.pidfile.as_deref(), "--pidfile")?;
    let me = std::env::current_exe().context("finding the ckpt executable")?;
    let preload = if a.ib {
        let mut list = ib_layer(&me)?.into_os_string();
        if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
            list.push(":");
            list.push(old);
        }
        Some(list)
    } else {
        None
    };
    if !a.pidns {
        ckpt_restorer::run::enter_namespaces(&ns).context("creating the job's namespaces")?;
        return exec_in_place(&a, preload, pidfile);
    }
    let mut args: Vec<OsString> = vec!["run".into(), "--pidns-init".into()];
    if let Some(p) = preload {
        args.push("--preload".into());
        args.push(p);
    }
    args.push("--".into());
    args.extend(a.command.iter().cloned());
    let mut init = ckpt_restorer::run::spawn_init(&me, &args, &ns)
        .context("starting the init of a new PID namespace")?;
    log::info!("run: pid namespace init is host pid {}", init.id());
    if let Some(parent) = &pidfile {
        // Atomically and never through a symbolic link, as restore's.
        if let Err(e) = super::restore::write_pidfile(parent, init.id() as i32) {
            let _ = init.kill();
            let _ = init.wait();
            return Err(e);
        }
    }
    let status = init.wait().context("waiting for the namespace's init")?;
    Ok(ckpt_restorer::run::exit_code(status) as u8)
}

/// `--hostname`: what the kernel takes as a host name.
fn parse_hostname(s: &str) -> Result<ckpt_restorer::run::Hostname, String> {
    ckpt_restorer::run::Hostname::new(s)
        .ok_or_else(|| format!("{s:?}: not a host name (1 to 64 bytes)"))
}

/// The verbs layer's file: $CKPT_IB_LAYER, else libckpt_ibverbs.so beside
/// the ckpt executable (where cargo builds both), else in ../lib/ckpt.
fn ib_layer(me: &std::path::Path) -> anyhow::Result<PathBuf> {
    const FILE: &str = "libckpt_ibverbs.so";
    let candidates: Vec<PathBuf> = match std::env::var_os("CKPT_IB_LAYER") {
        Some(p) => vec![PathBuf::from(p)],
        None => {
            let dir = me.parent().unwrap_or(std::path::Path::new("/"));
            vec![dir.join(FILE), dir.join("../lib/ckpt").join(FILE)]
        }
    };
    for c in &candidates {
        if c.is_file() {
            return std::fs::canonicalize(c).with_context(|| format!("{}", c.display()));
        }
    }
    anyhow::bail!(
        "--ib: the verbs layer is not at {} (build it with `cargo build -p ckpt-ib-shadow`, or set CKPT_IB_LAYER)",
        candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(" or ")
    )
}

/// Without --pidns: the command replaces ckpt (same pid, the one to dump)
/// in the namespaces just made; a time namespace takes effect at the exec.
fn exec_in_place(
    a: &RunArgs,
    preload: Option<OsString>,
    pidfile: Option<TrustedParent>,
) -> anyhow::Result<u8> {
    use std::os::unix::process::CommandExt;
    if let Some(parent) = pidfile {
        super::restore::write_pidfile(&parent, std::process::id() as i32)?;
    }
    let mut cmd = std::process::Command::new(&a.command[0]);
    cmd.args(&a.command[1..]);
    if let Some(c) = ckpt_image::caller::acting_for() {
        // The ckpt service's worker: the command is the caller's, with the
        // caller's environment, never root's.
        ckpt_restorer::run::become_caller(c).with_context(|| format!("becoming {c}"))?;
        cmd.env_clear().envs(crate::service::worker::job_env());
    }
    if let Some(p) = preload {
        cmd.env("LD_PRELOAD", p);
    }
    let err = cmd.exec();
    Err(err).with_context(|| format!("executing {}", a.command[0].to_string_lossy()))
}
