//! One module per subcommand.

pub mod agent;
pub mod check;
pub mod coord;
pub mod docs;
pub mod dump;
pub mod gc;
pub mod job;
pub mod job_dir;
pub mod job_launch;
pub mod restore;
pub mod run;
pub mod show;
pub mod slurm;

/// The directory of an output file ckpt writes as root (`--pidfile`,
/// `--stats-file`), resolved before any work starts, so a path through a
/// user's symbolic link fails the command, not the job; `option` names the
/// flag in the error.
pub fn output_parent(
    path: Option<&std::path::Path>,
    option: &str,
) -> anyhow::Result<Option<ckpt_image::TrustedParent>> {
    use anyhow::Context;
    path.map(ckpt_image::TrustedParent::resolve)
        .transpose()
        .with_context(|| option.to_string())
}

/// A byte progress bar on stderr when it is a terminal; none otherwise, so
/// scripts and logs stay quiet.
pub fn progress_bar(what: &str) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal().then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(&format!(
                "{what} {{bar:40}} {{bytes}}/{{total_bytes}} {{bytes_per_sec}}"
            ))
            .expect("valid template"),
        );
        b
    })
}
