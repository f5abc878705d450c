//! One module per subcommand.

pub mod agent;
pub mod check;
pub mod coord;
pub mod docs;
pub mod dump;
pub mod gc;
pub mod job;
pub mod restore;
pub mod run;
pub mod show;
pub mod slurm;

/// Writes a command's whole output to stdout. A reader that has gone away
/// (`ckpt show DIR | head`) is not an error: nobody is left to read the
/// rest, so the command ends quietly as other tools do.
pub fn print_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.map_err(|e| anyhow::Error::new(e).context("stdout: write")),
    }
}

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

/// What a command does with the image key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyUse {
    /// Seals new images: the site's key is created at first use.
    Seal,
    /// Verifies images: the key must exist.
    Verify,
}

/// The key of this command's images: the site's (`flag`, else
/// `$CKPT_IMAGE_KEY`, else the default path), or, when ckpt acts for a
/// user of the ckpt service, that user's key derived from it.
pub fn image_key(
    flag: Option<&std::path::Path>,
    used: KeyUse,
) -> Result<ckpt_image::ImageKey, ckpt_image::KeyError> {
    let path = ckpt_image::seal::key_path(flag);
    let site = match used {
        KeyUse::Seal => ckpt_image::ImageKey::load_or_create(&path)?,
        KeyUse::Verify => ckpt_image::ImageKey::load(&path)?,
    };
    Ok(match ckpt_image::caller::acting_for() {
        Some(c) => site.for_user(c.uid),
        None => site,
    })
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
