//! `ckpt completions` and `ckpt man`: shell completion scripts and man pages
//! generated from the same clap definitions the parser uses, so they cannot
//! drift from the real options. `scripts/install.sh` installs both.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

/// Arguments of `ckpt completions`.
#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    shell: clap_complete::Shell,
}

/// Arguments of `ckpt man`.
#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Directory to write `ckpt.1` and `ckpt-SUBCOMMAND.1` into (created if
    /// missing).
    dir: PathBuf,
}

/// Prints the completion script for `a.shell` on stdout.
pub fn completions(a: CompletionsArgs, mut cmd: clap::Command) -> anyhow::Result<ExitCode> {
    let mut script = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "ckpt", &mut script);
    super::print_stdout(&String::from_utf8_lossy(&script))?;
    Ok(ExitCode::SUCCESS)
}

/// Writes one man page per command into `a.dir`.
pub fn man(a: ManArgs, cmd: clap::Command) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&a.dir).with_context(|| format!("{}: create", a.dir.display()))?;
    clap_mangen::generate_to(cmd, &a.dir)
        .with_context(|| format!("{}: write man pages", a.dir.display()))?;
    Ok(ExitCode::SUCCESS)
}
