//! The ckpt image format, defined once and shared by the dumper, the
//! restorer and `ckpt show`.
//!
//! A checkpoint is a directory:
//!
//! ```text
//! DIR/manifest.img     header + Manifest: tool/format version, kernel, CPU, per-file checksums
//! DIR/core-PID.img     header + Core: registers, xstate, signals, credentials, limits, mm fields
//! DIR/mm-PID.img       header + Mm: every VMA and where its saved pages live
//! DIR/files-PID.img    header + Files: the fd table
//! DIR/ghost-PID-N.img  raw contents of an open-but-unlinked file
//! DIR/pipes.img        header + Pipes: data buffered in the tree's pipes
//! DIR/pages-PID.img    raw page data, 4 KiB aligned, no header, so restore can
//!                      read it straight into place
//! ```
//!
//! Metadata is protobuf. As in CRIU's `images/*.proto`, the schema of the
//! manifest, core and mm images is written in `image/proto/` (`manifest.proto`,
//! `task.proto`, `mm.proto`, package `ckpt`); `build.rs` compiles it with
//! protox and prost-build (no `protoc` needed), and [`manifest`], [`task`] and
//! [`mm`] re-export the generated types next to their hand-written helpers.
//! Any protobuf tool can read those images once the 32-byte [`header`] is
//! skipped:
//!
//! ```text
//! tail -c +33 DIR/core-123.img | protoc --decode=ckpt.Core -I image/proto image/proto/task.proto
//! ```
//!
//! The fd-table and pipes messages ([`files`]) are still prost derive
//! structs with no .proto file.
//!
//! Compatibility rule, borrowed from CRIU's review practice: new fields are
//! `optional` or repeated, tags are never renumbered or reused, removed tags
//! are `reserved`. A change that old readers cannot ignore bumps
//! [`FORMAT_VERSION`].
//!
//! This crate does no syscalls beyond reading and writing image files.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod dir;
pub mod error;
pub mod files;
pub mod header;
pub mod manifest;
pub mod mm;
mod pb;
pub mod summary;
pub mod task;

pub use dir::{ImageDir, ImageWriter, PagesWriter};
pub use error::ImageError;
pub use header::{FORMAT_VERSION, ImageKind};

/// Size of a page on every platform ckpt supports (x86_64).
pub const PAGE_SIZE: u64 = 4096;

/// File name of a process's core image.
pub fn core_name(pid: i32) -> String {
    format!("core-{pid}.img")
}

/// File name of a process's memory-map image.
pub fn mm_name(pid: i32) -> String {
    format!("mm-{pid}.img")
}

/// File name of a process's fd-table image.
pub fn files_name(pid: i32) -> String {
    format!("files-{pid}.img")
}

/// File name of a process's page data.
pub fn pages_name(pid: i32) -> String {
    format!("pages-{pid}.img")
}

/// File name of the saved contents of process `pid`'s `n`th unlinked file.
pub fn ghost_name(pid: i32, n: u32) -> String {
    format!("ghost-{pid}-{n}.img")
}

/// File name of the pipes image (present when the tree has pipes).
pub const PIPES_NAME: &str = "pipes.img";

/// File name of the manifest.
pub const MANIFEST_NAME: &str = "manifest.img";
