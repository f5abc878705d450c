//! `ckpt show`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

/// Arguments of `ckpt show`.
#[derive(clap::Args, Debug)]
pub struct ShowArgs {
    /// Checkpoint directory.
    dir: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `ckpt show`.
pub fn run(a: ShowArgs) -> anyhow::Result<ExitCode> {
    let dir = ckpt_image::ImageDir::open(&a.dir)
        .with_context(|| format!("cannot read checkpoint {}", a.dir.display()))?;
    let v = ckpt_image::summary::summarize(&dir)?;
    if a.json {
        println!("{v}");
    } else {
        print!("{}", ckpt_image::summary::render_text(&v));
    }
    Ok(ExitCode::SUCCESS)
}
