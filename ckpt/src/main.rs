//! `ckpt`: checkpoint and restore Linux processes.
//!
//! Each subcommand lives in `commands/<name>.rs`, turns its arguments into a
//! library call and prints the result; errors are printed once, as one
//! line, with a non-zero exit.

#![forbid(unsafe_code)]

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Transparent checkpoint/restart for Linux processes.
#[derive(Parser, Debug)]
#[command(name = "ckpt", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Checkpoint a running process into a directory.
    Dump(commands::dump::DumpArgs),
    /// Restore a process from a checkpoint directory.
    Restore(commands::restore::RestoreArgs),
    /// Summarize a checkpoint directory.
    Show(commands::show::ShowArgs),
    /// Report which kernel features ckpt needs are present.
    Check(commands::check::CheckArgs),
    /// Run a multi-node checkpoint coordinator, or trigger/query one.
    Coord(Box<commands::coord::CoordArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Dump(a) => commands::dump::run(a),
        Command::Restore(a) => commands::restore::run(a),
        Command::Show(a) => commands::show::run(a),
        Command::Check(a) => commands::check::run(a),
        Command::Coord(a) => commands::coord::run(*a).map(|()| ExitCode::SUCCESS),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ckpt: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
