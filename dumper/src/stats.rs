//! What a dump reports: its figures ([`DumpStats`](crate::DumpStats), also written as
//! `stats-dump.json`) and the [`DumpReport`] of the phased API.

use std::path::PathBuf;
use std::time::Instant;

use crate::BackgroundStats;

/// How long each phase of a dump took, in milliseconds.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PhaseTimes {
    /// Seizing and stopping every task of the tree.
    pub freeze_ms: f64,
    /// Reading registers, memory maps, page maps and fds of every process.
    pub collect_ms: f64,
    /// Copying page data into the pages files.
    pub pages_ms: f64,
    /// Writing the metadata images and file contents.
    pub metadata_ms: f64,
    /// Writing the manifest, syncing and renaming into place; unknown when
    /// `stats-dump.json` is written (just before), so only in the report.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit_ms: Option<f64>,
}

/// The figures of one dump: what `stats-dump.json` holds.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DumpStats {
    /// How long the tree had been frozen, in milliseconds: up to writing
    /// `stats-dump.json` there, up to the resume or kill in the report.
    pub frozen_ms: f64,
    /// Time per phase.
    pub phases: PhaseTimes,
    /// Processes of the tree (zombies included).
    pub processes: usize,
    /// Threads of the live processes (each leader counts as one).
    pub threads: usize,
    /// VMAs saved.
    pub vmas: usize,
    /// Fds saved.
    pub fds: usize,
    /// Bytes of page data planned (the pages that must be saved).
    pub pages_planned_bytes: u64,
    /// Bytes the pages files take on disk (less than planned with
    /// `--compress`).
    pub pages_written_bytes: u64,
    /// Bytes of private and anonymous mappings not saved: never touched,
    /// or file pages never written (restore maps them from the file).
    pub pages_untouched_bytes: u64,
    /// Bytes of every image file written before `stats-dump.json` (pages,
    /// metadata, file contents; not the log, manifest and seal).
    pub disk_bytes: u64,
    /// Planned page bytes per written page byte, with `--compress` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compression_ratio: Option<f64>,
    /// With `--background`: what was saved while the tree ran.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub background: Option<BackgroundStats>,
    /// With `--prev`: bytes of pages taken from the pre-dump (unchanged
    /// since), the rest of `pages_planned_bytes` was read from the tree.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reused_bytes: Option<u64>,
    /// With `--prev --background`: bytes of chunks rebuilt from the
    /// pre-dump's block and the few pages written since (only those read
    /// while frozen).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patched_bytes: Option<u64>,
    /// With `--prev --background`: bytes of what was read while frozen
    /// that went into memory reserved and faulted in before the freeze
    /// ([`HeldMemory`](crate::HeldMemory)); the rest went into memory allocated while frozen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_reserved_bytes: Option<u64>,
}

/// Milliseconds since `t`, as a fraction (short phases take well under one).
pub(crate) fn ms_since(t: Instant) -> f64 {
    ms(t.elapsed())
}

/// Milliseconds of `d`, as a fraction.
pub(crate) fn ms(d: std::time::Duration) -> f64 {
    // Microsecond precision is plenty and keeps the JSON short.
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// What a dump produced.
#[derive(Debug, Clone)]
pub struct DumpReport {
    /// The dumped (root) pid.
    pub pid: i32,
    /// Number of processes in the tree.
    pub processes: usize,
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// Number of VMAs.
    pub vmas: usize,
    /// Bytes of page data saved.
    pub pages_bytes: u64,
    /// Number of fds.
    pub fds: usize,
    /// How long the process was frozen, in milliseconds.
    pub frozen_ms: u64,
    /// Every figure of the dump, phase times included.
    pub stats: DumpStats,
}
