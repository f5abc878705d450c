//! `ckpt`: checkpoint and restore Linux processes.
//!
//! Each subcommand lives in `commands/<name>.rs`, turns its arguments into a
//! library call and prints the result; errors are printed once by
//! [`report`], as one line (or a JSON object with `--json`), with an exit
//! code per class of error.

// The pre_exec hooks the CLI's children need live in `ckpt_job::sys`.
#![forbid(unsafe_code)]

mod commands;
#[cfg(test)]
mod docs_check;
mod logger;
mod report;
mod scripts;

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
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(commands::docs::CompletionsArgs),
    /// Write man pages for ckpt and every subcommand into a directory.
    Man(commands::docs::ManArgs),
}

fn main() -> ExitCode {
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
    // A running coordinator's log is what it is watched for: its lines (info) show
    // without -v.
    let verbose = match &cli.command {
        Command::Coord(a) if a.serves() => cli.verbose.max(1),
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
        Command::Completions(a) => commands::docs::completions(a, Cli::command()),
        Command::Man(a) => commands::docs::man(a, Cli::command()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let r = report::ErrorReport::from_error(&e);
            logger::file_only(log::Level::Error, &format!("ckpt: error: {}", r.message));
            r.emit(json)
        }
    }
}
