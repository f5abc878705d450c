//! ckpt's own logger behind the `log` facade.
//!
//! The libraries only say what they do through `log` (the ecosystem's
//! standard facade: one small, well-kept crate, and a library never decides
//! where its lines go); this binary decides. A framework (env_logger,
//! tracing) would bring features ckpt does not use and dependencies to
//! audit for a tool that runs as root, so the sink is these few lines.
//!
//! Every line reads like CRIU's log: seconds since ckpt started, the level,
//! the message: `(   0.012) INFO  freeze: 1 processes, 1 threads`.
//! Three sinks, each with its own level:
//! - stderr: warnings only by default, `-v` adds info (phases with
//!   timings, each process), `-vv` debug (each object, each refusal);
//! - `--log-file PATH`: always at least debug, written line by line so a
//!   killed ckpt still leaves what it did;
//! - an in-memory capture (dump only) at debug level, which the dumper
//!   stores as `dump.log` next to the images.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use anyhow::Context;
use ckpt_image::TrustedParent;
use log::{Level, LevelFilter, Log, Metadata, Record};

/// The level of the log file and of `dump.log`: every object and refusal.
const FULL_LEVEL: LevelFilter = LevelFilter::Debug;

/// Where log lines go, and from which level on.
struct Logger {
    start: Instant,
    stderr: LevelFilter,
    file: Option<(LevelFilter, Mutex<File>)>,
    capture: Option<(LevelFilter, Mutex<Vec<u8>>)>,
}

static LOGGER: OnceLock<Logger> = OnceLock::new();

/// What the command line asked of the log.
#[derive(Debug, Clone, Copy)]
pub struct LogSettings<'a> {
    /// How many `-v` were given.
    pub verbose: u8,
    /// `--log-file PATH`.
    pub file: Option<&'a Path>,
    /// Keep every line in memory for [`captured`] (a dump's `dump.log`).
    pub capture: bool,
}

/// The stderr level for `verbose` times `-v`.
fn stderr_level(verbose: u8) -> LevelFilter {
    match verbose {
        0 => LevelFilter::Warn,
        1 => LevelFilter::Info,
        2 => LevelFilter::Debug,
        _ => LevelFilter::Trace,
    }
}

/// Installs the logger. Fails (naming the path) if `--log-file` cannot be
/// used; nothing is logged anywhere then.
pub fn init(s: LogSettings<'_>) -> anyhow::Result<()> {
    let stderr = stderr_level(s.verbose);
    // -vvv raises the full sinks along with stderr.
    let full = FULL_LEVEL.max(stderr);
    let file = s
        .file
        .map(|p| open_log_file(p).map(|f| (full, Mutex::new(f))))
        .transpose()?;
    let capture = s.capture.then(|| (full, Mutex::new(Vec::new())));
    let max = [
        Some(stderr),
        file.as_ref().map(|f| f.0),
        capture.as_ref().map(|c| c.0),
    ]
    .into_iter()
    .flatten()
    .max()
    .unwrap_or(stderr);
    let logger = LOGGER.get_or_init(|| Logger {
        start: Instant::now(),
        stderr,
        file,
        capture,
    });
    // Only fails if a logger is already set, which main never does twice.
    let _ = log::set_logger(logger);
    log::set_max_level(max);
    Ok(())
}

/// Whether stderr shows more than warnings (then there is no progress bar:
/// its redraws would garble the lines).
pub fn verbose_on_stderr() -> bool {
    LOGGER.get().is_some_and(|l| l.stderr > LevelFilter::Warn)
}

/// Every line logged so far, if capture was asked for (else empty).
pub fn captured() -> Vec<u8> {
    LOGGER
        .get()
        .and_then(|l| l.capture.as_ref())
        .map(|(_, buf)| buf.lock().unwrap_or_else(|e| e.into_inner()).clone())
        .unwrap_or_default()
}

/// Appends `message` at `level` to the log file only, for what the caller
/// already prints on stderr in its own form (the final error, notices).
pub fn file_only(level: Level, message: &str) {
    if let Some(l) = LOGGER.get()
        && let Some((_, f)) = &l.file
    {
        let line = l.format(level, format_args!("{message}"));
        let _ = f
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .write_all(line.as_bytes());
    }
}

/// Opens `--log-file PATH` for writing: created 0600 if missing, in a
/// directory reached without following a symlink a user controls
/// (`ckpt_image::trusted_path`), never through a symlink at the name, and
/// only ever a regular file with no other name (a FIFO would block, a
/// device be clobbered, a hard link could be root's file). An existing
/// file is truncated, as CRIU's `-o` does.
fn open_log_file(path: &Path) -> anyhow::Result<File> {
    let parent = TrustedParent::resolve(path).context("--log-file")?;
    parent.open_truncated(0o600).context("--log-file")
}

impl Logger {
    fn format(&self, level: Level, args: std::fmt::Arguments<'_>) -> String {
        let t = self.start.elapsed().as_secs_f64();
        let level = match level {
            Level::Error => "ERROR",
            Level::Warn => "WARN ",
            Level::Info => "INFO ",
            Level::Debug => "DEBUG",
            Level::Trace => "TRACE",
        };
        format!("({t:8.3}) {level} {args}\n")
    }
}

impl Log for Logger {
    fn enabled(&self, m: &Metadata<'_>) -> bool {
        // Only ckpt's own crates: a dependency's debug chatter is not
        // ckpt's log.
        m.target().starts_with("ckpt")
            && (m.level() <= self.stderr
                || self.file.as_ref().is_some_and(|f| m.level() <= f.0)
                || self.capture.as_ref().is_some_and(|c| m.level() <= c.0))
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = self.format(record.level(), *record.args());
        let level = record.level();
        if level <= self.stderr {
            // One write per line, so concurrent lines never interleave.
            let _ = std::io::stderr().lock().write_all(line.as_bytes());
        }
        if let Some((max, f)) = &self.file
            && level <= *max
        {
            let _ = f
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .write_all(line.as_bytes());
        }
        if let Some((max, buf)) = &self.capture
            && level <= *max
        {
            buf.lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(line.as_bytes());
        }
    }

    fn flush(&self) {
        if let Some((_, f)) = &self.file {
            let _ = f.lock().unwrap_or_else(|e| e.into_inner()).flush();
        }
    }
}
