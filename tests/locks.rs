//! File locks come back: a flock (one open file description shared with a
//! child), a POSIX write lock on a byte range (also held through a dup) and
//! an OFD read lock are saved once each and re-taken at restore, so another
//! process still cannot take conflicting locks (and F_GETLK names the
//! restored pid), while the victim can unlock and relock; a conflicting
//! lock taken by someone else since the dump fails the restore naming pid,
//! fd, path, the lock and its holder (victim: tests/c/locks.c).

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::common::*;

const FD_FLOCK: i32 = 10;
const FD_POSIX: i32 = 11;

/// The lock descriptions `ckpt show --json` gives fd `fd` of every process.
fn locks_on(json: &serde_json::Value, fd: i32) -> Vec<String> {
    json["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .flat_map(|p| p["fds"].as_array().cloned().unwrap_or_default())
        .filter(|f| f["fd"] == fd)
        .flat_map(|f| f["locks"].as_array().cloned().unwrap_or_default())
        .map(|l| l.as_str().expect("lock string").to_string())
        .collect()
}

fn open_rw(path: &std::path::Path) -> File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// Takes a POSIX write lock on `len` bytes from `start` through `f`
/// (released when the test closes `f`).
fn posix_write_lock(f: &File, start: i64, len: i64) {
    // SAFETY: a zeroed struct flock is a valid value.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as i16;
    fl.l_whence = libc::SEEK_SET as i16;
    fl.l_start = start;
    fl.l_len = len;
    // SAFETY: f is an open fd and fl a valid struct flock for F_SETLK.
    let rc = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_SETLK, &fl) };
    assert_eq!(rc, 0, "F_SETLK: {}", std::io::Error::last_os_error());
}

fn flock_exclusive(f: &File) {
    // SAFETY: f is an open fd.
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(rc, 0, "flock: {}", std::io::Error::last_os_error());
}

fn restore_error(env: &TestEnv) -> String {
    spawn_restore(env, &[])
        .wait(Duration::from_secs(60))
        .assert_error()
}

fn assert_gone(v: &Victim) {
    assert!(
        wait_until(Duration::from_secs(5), || victim_gone(
            v.pid, &v.bin, &v.work
        )),
        "a process is left at pid {} after a failed restore",
        v.pid
    );
}

#[test]
fn locks_are_held_again_and_conflicts_fail_the_restore() {
    let env = TestEnv::new("locks");
    let mut v = Victim::spawn_as(&env, "locks", &[], test_user());
    v.wait_ready();
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("2 processes"), "{}", out.stderr);
    v.reap_killed(Duration::from_secs(10));

    // Each lock once, with its range, on the fd it was taken through.
    let json = show_json(&env);
    assert_eq!(locks_on(&json, FD_FLOCK), ["FLOCK WRITE"], "{json}");
    assert_eq!(locks_on(&json, FD_POSIX), ["POSIX WRITE 100-199"], "{json}");
    assert_eq!(locks_on(&json, 12), ["OFD READ 0-49"], "{json}");
    assert!(
        locks_on(&json, 13).is_empty(),
        "the dup repeats the lock: {json}"
    );

    // Someone took a conflicting POSIX lock meanwhile: refused, naming it.
    let ranged = open_rw(&v.path("ranged"));
    posix_write_lock(&ranged, 150, 1);
    let line = restore_error(&env);
    for w in [
        &v.pid.to_string(),
        &format!("fd {FD_POSIX}"),
        "ranged",
        "POSIX WRITE 100-199",
        &format!("held by pid {}", std::process::id()),
    ] {
        assert!(line.contains(w), "error should name {w:?}: {line}");
    }
    assert_gone(&v);
    drop(ranged);

    // The same for the flock, which names no holder.
    let flocked = open_rw(&v.path("flocked"));
    flock_exclusive(&flocked);
    let line = restore_error(&env);
    for w in [
        &v.pid.to_string(),
        &format!("fd {FD_FLOCK}"),
        "flocked",
        "FLOCK WRITE",
    ] {
        assert!(line.contains(w), "error should name {w:?}: {line}");
    }
    assert_gone(&v);
    drop(flocked);

    restore_and_check(&env, &v);
}
