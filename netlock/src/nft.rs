//! Runs the `nft` program: the lock's one place that executes a command.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::{LockError, Result, Table};

/// Where `nft` is: the first executable `nft` in PATH, or in the sbin
/// directories a root shell has (PATH may lack them under sudo or cron),
/// that only root can have put there: ckpt runs it as root, often for
/// another user's job, so a file another user owns or may write (a PATH
/// entry of theirs) is passed over.
pub fn program() -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join("nft"))
        .find(|p| p.metadata().is_ok_and(|m| root_executable(&m)))
        .ok_or(LockError::NftMissing)
}

/// An executable regular file of root's that no one else may write.
fn root_executable(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    const EXECUTABLE: u32 = 0o111;
    const GROUP_OR_OTHER_WRITABLE: u32 = 0o022;
    m.is_file()
        && m.uid() == 0
        && m.mode() & EXECUTABLE != 0
        && m.mode() & GROUP_OR_OTHER_WRITABLE == 0
}

/// Feeds `doc` to `nft -j -f -` in the network namespace `netns` (a
/// `/proc/PID/ns/net`); `what` names the change for errors.
pub(crate) fn run(table: &Table, netns: &Path, what: &'static str, doc: &Value) -> Result<()> {
    let prog = program()?;
    let ns = std::fs::File::open(netns).map_err(|e| LockError::NetNs {
        table: table.to_string(),
        path: netns.to_path_buf(),
        source: e,
    })?;
    let ns_fd = ns.as_raw_fd();
    let spawn_err = |e| LockError::Spawn {
        table: table.to_string(),
        program: prog.clone(),
        source: e,
    };
    let mut cmd = Command::new(&prog);
    // Dies with the thread that runs it: a dumper killed meanwhile has its
    // repair guard delete the lock, which an nft still on its way could
    // otherwise put back after it.
    // The rules must be where the connections' segments pass: the
    // namespace of the tree, which need not be ckpt's.
    // SAFETY: the closure runs in the child between fork and exec and
    // makes async-signal-safe system calls only, on `ns_fd`, which stays
    // open (`ns` lives) until the child is spawned.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0
                || libc::setns(ns_fd, libc::CLONE_NEWNET) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .args(["-j", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    let input = doc.to_string();
    let wrote = child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(input.as_bytes());
    let out = child.wait_with_output().map_err(spawn_err)?;
    if !out.status.success() || wrote.is_err() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stderr = stderr.lines().next().unwrap_or("no message").trim();
        return Err(LockError::Nft {
            table: table.to_string(),
            what,
            stderr: format!("{stderr} ({})", out.status),
        });
    }
    log::debug!("network lock {table}: {what}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_roots_unwritable_executables_are_run() {
        let dir = std::env::temp_dir().join(format!("ckpt-netlock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("nft");
        std::fs::write(&f, b"#!/bin/sh\n").unwrap();
        let with_mode = |mode: u32| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            root_executable(&f.metadata().unwrap())
        };
        // The file is its creator's: root's when the tests run as root.
        let root = {
            use std::os::unix::fs::MetadataExt;
            f.metadata().unwrap().uid() == 0
        };
        assert_eq!(with_mode(0o755), root);
        assert!(!with_mode(0o775), "group-writable");
        assert!(!with_mode(0o757), "world-writable");
        assert!(!with_mode(0o644), "not executable");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
