//! The ckpt image format, defined once and shared by the dumper, the
//! restorer and `ckpt show`.
//!
//! A checkpoint is a directory:
//!
//! ```text
//! DIR/manifest.img     header + Manifest: tool/format version, kernel, CPU, processes and
//!                      their owners, size + CRC32C + BLAKE3 of every other file
//! DIR/manifest.mac     HMAC-SHA256 of manifest.img under the site's image key (`seal`)
//! DIR/core-PID.img     header + Core: registers, xstate, signals, credentials, limits, mm fields
//! DIR/mm-PID.img       header + Mm: every VMA and where its saved pages live
//! DIR/fds-PID.img      header + FdTable: fd number -> open file id
//! DIR/files.img        header + Files: every open file description, once
//! DIR/ghost-ID.img     data extents of open-but-unlinked file ID
//! DIR/unix-ID.img      messages queued for UNIX socket (open file) ID
//! DIR/unix-unaccepted-ID.img  messages UNIX socket ID sent on a connection not yet accepted
//! DIR/pipe-ID.img      raw data buffered in pipe ID
//! DIR/ipc.img         header + Ipc: the SysV IPC objects of the job (when it has any)
//! DIR/ipc-shm-ID.img  raw contents of SysV shared memory segment ID (its saved pages)
//! DIR/pages-PID.img    raw page data, 4 KiB aligned, no header, so restore can
//!                      read it straight into place
//! ```
//!
//! Metadata is protobuf. As in CRIU's `images/*.proto`, the schema of every
//! metadata image is written in `image/proto/` (`manifest.proto`,
//! `task.proto`, `mm.proto`, `fd.proto` and one `fd_KIND.proto` per kind
//! of open file; package `ckpt`); `build.rs` compiles it with protox and
//! prost-build (no `protoc` needed), and [`manifest`], [`task`], [`mm`] and
//! [`fd`] re-export the generated types next to their hand-written helpers.
//! Any protobuf tool can read those images once the 32-byte [`header`] is
//! skipped:
//!
//! ```text
//! tail -c +33 DIR/core-123.img | protoc --decode=ckpt.Core -I image/proto image/proto/task.proto
//! ```
//!
//! Compatibility rule, borrowed from CRIU's review practice: new fields are
//! `optional` or repeated, tags are never renumbered or reused, removed tags
//! are `reserved`. A change that old readers cannot ignore bumps
//! [`FORMAT_VERSION`].
//!
//! This crate does no syscalls beyond reading and writing image files and
//! the image key, always through directory fds, and walking the paths ckpt
//! writes as root ([`trusted_path`]) (`sys.rs`).

#![warn(missing_docs)]
// Only `sys.rs` may use `unsafe`, for the one syscall no safe wrapper
// offers (sync_file_range), for mapping ckpt's own page files to hash
// them, and for taking a caller's file access rights (setfsuid).
#![deny(unsafe_code)]

pub mod aio;
pub mod caller;
pub mod digest;
pub mod dir;
pub mod error;
pub mod fd;
pub mod header;
pub mod ib;
pub mod ipc;
pub mod manifest;
pub mod mm;
pub mod pagefile;
mod pb;
pub mod sched;
pub mod seal;
pub mod seccomp;
pub mod shmem;
mod sys;
pub mod task;
pub mod timer;
pub mod trusted_path;

pub use caller::Caller;
pub use dir::{
    BlockChecks, Committed, ImageDir, ImageWriter, StaleTmp, SweepOutcome, sweep_stale_tmp_dirs,
};
pub use error::ImageError;
pub use header::{FORMAT_VERSION, ImageKind};
pub use pagefile::{PageStream, PagesWriter};
pub use seal::{ImageKey, KeyError};
pub use sys::memory_filesystem;
pub use trusted_path::{PathError, TrustedParent};

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

/// File name of a process's fd table.
pub fn fds_name(pid: i32) -> String {
    format!("fds-{pid}.img")
}

/// File name of the image holding every open file description.
pub const FILES_NAME: &str = "files.img";

/// File name of a process's page data.
pub fn pages_name(pid: i32) -> String {
    format!("pages-{pid}.img")
}

/// File name of the saved contents of unlinked open file `file_id`.
pub fn ghost_name(file_id: u64) -> String {
    format!("ghost-{file_id}.img")
}

/// File name of the data buffered in pipe `pipe_id`.
pub fn pipe_data_name(pipe_id: u64) -> String {
    format!("pipe-{pipe_id}.img")
}

/// File name of the messages queued for UNIX socket `file_id` to read.
pub fn unix_queue_name(file_id: u64) -> String {
    format!("unix-{file_id}.img")
}

/// File name of the messages UNIX socket `file_id` sent on a connection
/// its listener had not accepted.
pub fn unix_unaccepted_name(file_id: u64) -> String {
    format!("unix-unaccepted-{file_id}.img")
}

/// File name of the data buffered in the FIFO on device `dev`, inode
/// `ino` (one file per FIFO, whichever descriptions of it the tree holds).
pub fn fifo_data_name(dev: u64, ino: u64) -> String {
    format!("fifo-{dev}-{ino}.img")
}

/// File name of the image listing every shared memory object (written
/// only when the tree maps one).
pub const SHMEM_NAME: &str = "shmem.img";

/// File name of the contents of shared memory object `id`.
pub fn shmem_data_name(id: u64) -> String {
    format!("shmem-{id}.img")
}

/// File name of the SysV IPC image (present only when the job has IPC
/// objects).
pub const IPC_NAME: &str = "ipc.img";

/// File name of the saved pages of SysV shared memory segment `shmid`.
pub fn shm_data_name(shmid: i32) -> String {
    format!("ipc-shm-{shmid}.img")
}

/// File name of the manifest.
pub const MANIFEST_NAME: &str = "manifest.img";
