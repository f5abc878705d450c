//! Shared harness for the ckpt end-to-end tests.
//!
//! The victims are small C programs in `tests/c/` following a zdtm-style
//! protocol (see `tests/c/victim.h`): `victim WORKDIR` sets up its state,
//! writes `WORKDIR/ready`, polls for `WORKDIR/go`, verifies its state and
//! writes `WORKDIR/result` (`PASS` or `FAIL: ...`).
//!
//! Everything here has a timeout: a hung `ckpt` or victim must fail the test,
//! never hang CI.  Processes a test started are killed when their guard is
//! dropped, including when the test panics.

// Each test binary uses a different subset of these helpers (and of the
// files re-exported below).
#![allow(dead_code, unused_imports)]

use std::collections::hash_map::DefaultHasher;
use std::fs::{self, File};
use std::hash::{Hash, Hasher};
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

pub const CKPT: &str = env!("CARGO_BIN_EXE_ckpt");

pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
pub const DUMP_TIMEOUT: Duration = Duration::from_secs(60);
pub const RESTORE_TIMEOUT: Duration = Duration::from_secs(30);
/// For commands that are expected to fail fast (bad images, bad pids).
pub const FAIL_TIMEOUT: Duration = Duration::from_secs(30);
pub const POLL: Duration = Duration::from_millis(10);

/// Flags the victims are built with: optimised a little (so registers
/// carry live values across the checkpoint) and with debug info.
const CFLAGS: &[&str] = &["-O1", "-g", "-Wall"];

/// Image files every dump must produce for its (single) process.
pub fn expected_images(pid: i32) -> Vec<String> {
    vec![
        "manifest.img".to_string(),
        format!("pages-{pid}.img"),
        format!("core-{pid}.img"),
        format!("mm-{pid}.img"),
        format!("fds-{pid}.img"),
        "files.img".to_string(),
    ]
}

/// The workspace's root (where `scripts/` is).
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

mod commands;
mod env;
pub mod guest;
mod inspect;
mod mntns;
mod nodes;
mod poll;
mod procfs;
mod service;
mod victims;

pub use commands::*;
pub use env::*;
pub use inspect::*;
pub use mntns::*;
pub use nodes::*;
pub use poll::*;
pub use procfs::*;
pub use service::*;
pub use victims::*;

/// The verbs layer, `libckpt_ibverbs.so`, beside the ckpt executable
/// (where `ckpt run --ib` looks first), built if it is not there yet:
/// `cargo test` builds the workspace's binaries, not its cdylibs.
pub fn verbs_layer_library() -> PathBuf {
    let dir = Path::new(CKPT).parent().expect("target dir").to_path_buf();
    let lib = dir.join("libckpt_ibverbs.so");
    if !lib.exists() {
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-p", "ckpt-ib-shadow"]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        let out = cmd.output().expect("run cargo build -p ckpt-ib-shadow");
        assert!(
            out.status.success(),
            "cargo build -p ckpt-ib-shadow: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(lib.exists(), "{} not built", lib.display());
    lib
}
