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
pub mod job_user;
pub mod restore;
pub mod run;
pub mod show;
pub mod slurm;

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
