//! Rebuild a process from a checkpoint image and resume it.
//!
//! Data flows one way: **read** (the manifest's seal is checked with the
//! site's key and the whole image against the manifest's checksums, and
//! every process's credentials against the owner the manifest recorded,
//! before anything is created) → **rebuild** → **resume**.
//!
//! How the address space is rebuilt: the restorer clones a child with the
//! original pid (clone3 `set_tid`), which stops itself under
//! `PTRACE_TRACEME` before running any code. Everything else is driven from
//! outside with the parasite crate's remote syscalls, from a small scratch
//! area placed where neither the child's inherited mappings nor the dumped
//! ones lie: the inherited mappings are unmapped, the kernel's vDSO/vvar are
//! moved to the dumped addresses when the kernel provides the same vDSO
//! (else the dumped vDSO is mapped there as a proxy to this kernel's, as
//! CRIU does: `vdso.rs`), every VMA is recreated and filled from the pages file through
//! `/proc/PID/mem`, then fds, signals, credentials and registers follow. The
//! scratch area is unmapped by the very last syscall, which stops at its exit
//! so the final registers can be set: no trace of ckpt is left in the map.
//!
//! Any error kills and reaps the child (and ptrace's EXITKILL kills it if
//! the restorer itself dies), so no half-restored process is ever left.
//!
//! The phases have a module each: `read.rs` (reading and verifying the
//! images), `rebuild/` (the rebuild as named steps over the restore-wide
//! `RestoreContext` of `context.rs`), `resume.rs` (letting the tree run).

#![warn(missing_docs)]

pub mod error;

mod addresses;
mod aio;
mod caller;
mod context;
mod creds;
mod fd;
mod held;
mod ib;
mod identity;
mod inherit;
mod ipc;
pub mod lazy;
mod loginuid;
mod membarrier;
mod mm;
pub mod ns;
mod options;
mod outcome;
mod pages;
mod pid;
pub mod pmix;
mod prctl;
mod read;
mod rebuild;
mod resume;
pub mod run;
mod sched;
mod seccomp;
mod shapes;
mod shmem;
mod stopped;

mod sys;
mod task;
mod thread;
mod timer;
mod tree;
mod vdso;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;

use ckpt_image::fd::Files;
use ckpt_image::{ImageDir, ImageKey, ImageKind};

pub use addresses::{AddressConflict, AddressMap};
pub use error::{FileUse, RestoreError, Result};
pub use options::{FilePolicy, InheritFd, RestoreOptions};
pub use outcome::{Rebound, RestorePhaseTimes, RestoreStats, Restored};
pub use resume::Stopped;

/// Restores the checkpoint in `opts.dir` (a process tree, root first) and
/// lets it run. The root becomes a child of the caller. The phases
/// [`rebuild`] → [`Stopped::resume`] in one call.
pub fn restore(opts: &RestoreOptions<'_>) -> Result<Restored> {
    rebuild(opts)?.resume()
}

/// The addresses the checkpoint at `dir` was reachable at on its node:
/// the inet sockets' bound addresses, without loopback and link-local
/// ones. A restart on another node maps them to that node's address
/// ([`FilePolicy::addresses`]).
pub fn node_addresses(dir: &Path, key: &ImageKey) -> Result<BTreeSet<IpAddr>> {
    // Only the open files are read: the page data is verified once, by the
    // restore that uses it, not hashed here a first time.
    let images = ImageDir::open_deferring_pages(dir, key)?;
    let files: Files = images.read_meta(ckpt_image::FILES_NAME, ImageKind::Files)?;
    Ok(addresses::node_addresses(&files))
}

/// Reads and verifies the whole checkpoint, then creates every process of
/// the tree and rebuilds it, leaving all of them stopped.
pub fn rebuild(opts: &RestoreOptions<'_>) -> Result<Stopped> {
    rebuild::run(read::read(opts)?, opts)
}
