//! `ckpt run --pidns -- CMD ARGS...`: the command runs as PID 2 of a new
//! PID namespace under ckpt's init (PID 1), see `ckpt_restorer::run`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

/// Arguments of `ckpt run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Run the command in a new PID namespace (and a mount namespace with
    /// its own /proc), under ckpt's init as PID 1: dump it with
    /// `ckpt dump --tree <host pid of the init>`; a restore recreates the
    /// namespace with the same pids inside. Required (the only mode).
    #[arg(long)]
    pidns: bool,
    /// Write the host pid of the namespace's init (the pid to dump) to
    /// this file once it runs.
    #[arg(long, value_name = "PATH")]
    pidfile: Option<PathBuf>,
    /// Internal: this process is the namespace's init.
    #[arg(long, hide = true)]
    pidns_init: bool,
    /// The command and its arguments.
    #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
    command: Vec<OsString>,
}

/// Runs `ckpt run`: exits with the command's status (128+signal if a
/// signal killed it).
pub fn run(a: RunArgs) -> anyhow::Result<ExitCode> {
    if a.pidns_init {
        let code = ckpt_restorer::run::init(&a.command).with_context(|| {
            format!(
                "pid namespace init: starting {}",
                a.command[0].to_string_lossy()
            )
        })?;
        return Ok(ExitCode::from(code as u8));
    }
    if !a.pidns {
        anyhow::bail!("ckpt run needs --pidns (running in a new PID namespace is its only mode)");
    }
    let me = std::env::current_exe().context("finding the ckpt executable")?;
    let mut args: Vec<OsString> = vec!["run".into(), "--pidns-init".into(), "--".into()];
    args.extend(a.command.iter().cloned());
    let mut init = ckpt_restorer::run::spawn_init(&me, &args)
        .context("starting the init of a new PID namespace")?;
    log::info!("run: pid namespace init is host pid {}", init.id());
    if let Some(path) = &a.pidfile {
        // Atomically and never through a symbolic link, as restore's.
        if let Err(e) = super::restore::write_pidfile(path, init.id() as i32) {
            let _ = init.kill();
            let _ = init.wait();
            return Err(e);
        }
    }
    let status = init.wait().context("waiting for the namespace's init")?;
    Ok(ExitCode::from(ckpt_restorer::run::exit_code(status) as u8))
}
