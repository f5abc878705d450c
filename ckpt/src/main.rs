//! `ckpt`: checkpoint and restore Linux processes.
//!
//! Each subcommand lives in `commands/<name>.rs`, turns its arguments into a
//! library call and prints the result; errors are printed once by
//! [`report`], as one line (or a JSON object with `--json`), with an exit
//! code per class of error.

// Denied rather than forbidden: the ckpt service's socket layer
// (`service/wire.rs`: fds passed between processes, the peer's groups and
// pidfd) is the CLI's one thin module of raw calls. The pre_exec hooks the
// CLI's children need live in `ckpt_job::sys`.
#![deny(unsafe_code)]

mod commands;
#[cfg(test)]
mod docs_check;
mod logger;
mod report;
mod scripts;
mod service;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// Transparent checkpoint/restart for Linux processes.
#[derive(Parser, Debug)]
#[command(name = "ckpt", version, about)]
struct Cli {
    /// Log more on stderr: -v the phases with timings and each process,
    /// -vv each object (VMA, fd, thread) and the reason for every refusal.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Also write the log, at -vv level at least, to PATH (created 0600; a
    /// symbolic link, a directory symlink another user owns, a hard-linked
    /// file or anything but a regular file is refused).
    #[arg(long = "log-file", value_name = "PATH", global = true)]
    log_file: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Checkpoint a running process into a directory.
    Dump(commands::dump::DumpArgs),
    /// Restore a process from a checkpoint directory.
    Restore(commands::restore::RestoreArgs),
    /// Run a command in new namespaces (PID, under ckpt's init, so it can
    /// be restored where its pids are taken; UTS, IPC, time), which a
    /// restore recreates.
    Run(commands::run::RunArgs),
    /// Summarize a checkpoint directory.
    Show(commands::show::ShowArgs),
    /// Report which kernel features ckpt needs are present.
    Check(commands::check::CheckArgs),
    /// Remove the temporary directories (NAME.tmp.PID) of dumpers that were
    /// killed, where no next dump into the same place will.
    Gc(commands::gc::GcArgs),
    /// Run a multi-node checkpoint coordinator, or trigger/query one.
    Coord(Box<commands::coord::CoordArgs>),
    /// One command for a whole multi-node job: run its parts, checkpoint,
    /// restore, list its epochs.
    Job(Box<commands::job::JobArgs>),
    /// Run a Slurm job's application: checkpoint and requeue on the warning signal, restore on restart.
    Slurm(commands::slurm::SlurmArgs),
    /// Run the service through which ordinary users checkpoint and restore
    /// their own processes (as root, one per node).
    Serve(service::serve::ServeArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(commands::docs::CompletionsArgs),
    /// Write man pages for ckpt and every subcommand into a directory.
    Man(commands::docs::ManArgs),
}

fn main() -> ExitCode {
    // Under an MPI launcher's part, this executable is also its `srun`
    // (Open MPI) or `ssh` (MPICH's hydra).
    let argv0 = std::env::args_os().next().unwrap_or_default();
    if let Some(via) = ckpt_job::slurm::daemons::invoked_as_standin(&argv0) {
        let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        return finish(
            ckpt_job::slurm::daemons::standin(via, &args)
                .map(ExitCode::from)
                .map_err(anyhow::Error::from),
            false,
        );
    }
    // Known before parsing, so even a usage error can be JSON.
    let json = std::env::args().skip(1).any(|a| a == "--json");
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            let message = first.strip_prefix("error: ").unwrap_or(first);
            return report::ErrorReport::usage(format!("{message} (see ckpt --help)")).emit(json);
        }
    };
    // A user's command that needs root goes to the ckpt service.
    if let Some((command, own_key)) = cli.command.needs_root()
        && service::client::wanted(true, own_key)
    {
        return finish(service::client::delegate(command), json);
    }
    // The service's worker acts for its caller from here on, and runs only
    // what the service does for users: checked before anything (even the
    // log file) is touched as root.
    match service::worker::enter() {
        Ok(Some(_)) => {
            if let Some(refused) = cli.command.service_refusal(cli.log_file.is_some()) {
                return finish(Err(refused), json);
            }
        }
        Ok(None) => {}
        Err(e) => return finish(Err(e), json),
    }
    // A running coordinator's log is what it is watched for: its lines (info) show
    // without -v.
    let verbose = match &cli.command {
        Command::Coord(a) if a.serves() => cli.verbose.max(1),
        Command::Serve(_) => cli.verbose.max(1),
        _ => cli.verbose,
    };
    let log = logger::LogSettings {
        verbose,
        file: cli.log_file.as_deref(),
        // A dump keeps its whole log next to its images (dump.log).
        capture: matches!(cli.command, Command::Dump(_))
            || matches!(&cli.command, Command::Job(j) if j.captures_log()),
    };
    if let Err(e) = logger::init(log) {
        let mut r = report::ErrorReport::usage(format!("{e:#}"));
        r.path = cli.log_file.as_ref().map(|p| p.display().to_string());
        return r.emit(json);
    }
    let result = match cli.command {
        Command::Dump(a) => commands::dump::run(a),
        Command::Restore(a) => commands::restore::run(a),
        Command::Run(a) => commands::run::run(a),
        Command::Show(a) => commands::show::run(a),
        Command::Check(a) => commands::check::run(a),
        Command::Gc(a) => commands::gc::run(a),
        Command::Coord(a) => commands::coord::run(*a).map(|()| ExitCode::SUCCESS),
        Command::Job(a) => commands::job::run(*a),
        Command::Slurm(a) => commands::slurm::run(a),
        Command::Serve(a) => service::serve::run(a),
        Command::Completions(a) => commands::docs::completions(a, Cli::command()),
        Command::Man(a) => commands::docs::man(a, Cli::command()),
    };
    finish(result, json)
}

/// The exit of a command: its code, or its error reported.
fn finish(result: anyhow::Result<ExitCode>, json: bool) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            let r = report::ErrorReport::from_error(&e);
            logger::file_only(log::Level::Error, &format!("ckpt: error: {}", r.message));
            r.emit(json)
        }
    }
}

impl Command {
    /// For a command that needs root (to trace, recreate processes or read
    /// the site's key): its name, and whether the user named a key of
    /// their own.
    fn needs_root(&self) -> Option<(&'static str, bool)> {
        match self {
            Command::Dump(a) => Some(("dump", a.has_own_key())),
            Command::Restore(a) => Some(("restore", a.has_own_key())),
            Command::Show(a) => Some(("show", a.has_own_key())),
            Command::Run(a) if a.needs_root() && !a.is_namespace_init() => Some(("run", false)),
            _ => None,
        }
    }

    /// Why the ckpt service's worker does not run this for a user, if it
    /// does not.
    fn service_refusal(&self, log_file: bool) -> Option<anyhow::Error> {
        use service::worker::{ROOT_ONLY_HINT, refuse};
        if log_file {
            return Some(refuse("--log-file", ROOT_ONLY_HINT));
        }
        match self {
            Command::Dump(a) => a.service_refusal(),
            Command::Restore(a) => a.service_refusal(),
            Command::Show(a) => a.service_refusal(),
            Command::Run(_) => None,
            _ => Some(refuse(
                "this command",
                "the service runs dump, restore, show and run for users",
            )),
        }
    }
}
