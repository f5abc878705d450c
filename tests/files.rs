//! Files: fds, offsets, access modes, O_APPEND, FD_CLOEXEC, directory fds,
//! /dev/null, shared open file descriptions and unlinked-but-open files
//! (victim: tests/c/files.c), plus what `ckpt show --json` reports.

use std::fs;

use crate::common::*;
use serde_json::Value;

#[test]
fn files_restored_with_offsets_and_flags() {
    standard_cycle("files", "files", &[]);
}

/// A child's stdio and fds 4 and 5, all shared with its parent, nothing
/// at 3: the restore takes them from the parent together and moves each
/// to its number; each process checks its fds point where they did
/// (tests/c/fdgap.c). Where moving them could drop a copy is a unit test
/// of the restorer (`fd::tests`).
#[test]
fn fds_shared_with_the_parent_above_a_gap_keep_their_files() {
    standard_cycle("fdgap", "fdgap", &[]);
}

/// Fd numbers the victim uses, and the file each must point to.
const FDS: &[(i64, &str)] = &[
    (10, "ro.txt"),
    (11, "wo.txt"),
    (12, "rw.txt"),
    (13, "append.txt"),
    (14, "cloexec.txt"),
    (17, "shared.txt"),
    (40, "shared.txt"),
];

#[test]
fn show_json_describes_the_dump() {
    let env = TestEnv::new("files-show");
    let mut v = Victim::spawn(&env, "files", &[]);
    v.wait_ready();
    let comm = fs::read_to_string(format!("/proc/{}/comm", v.pid))
        .expect("read comm")
        .trim()
        .to_string();
    dump_kill_reap(&env, &mut v);

    let text = ckpt(&env, &["show", path_str(&env.img)], FAIL_TIMEOUT);
    text.assert_success();
    assert!(
        text.stdout.contains(&v.pid.to_string()),
        "`ckpt show` does not mention pid {}:\n{}",
        v.pid,
        text.stdout
    );

    let out = ckpt(&env, &["show", path_str(&env.img), "--json"], FAIL_TIMEOUT);
    out.assert_success();
    let json: Value = serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "`ckpt show --json` is not one JSON value ({e}):\n{}",
            out.stdout
        )
    });
    // The CPU record drives the compatibility refusal on restore: XCR0
    // always has x87 and SSE state on x86_64.
    let xcr0 = json["cpu"]["xcr0"]
        .as_str()
        .and_then(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).ok())
        .unwrap_or_else(|| panic!("no cpu.xcr0: {json}"));
    assert_eq!(xcr0 & 0b11, 0b11, "XCR0 {xcr0:#x} lacks x87/SSE: {json}");
    let procs = json["processes"]
        .as_array()
        .unwrap_or_else(|| panic!("no processes array: {json}"));
    assert_eq!(procs.len(), 1, "expected exactly one process: {json}");
    let p = &procs[0];
    assert_eq!(p["pid"].as_i64(), Some(i64::from(v.pid)), "pid: {p}");
    assert_eq!(p["comm"].as_str(), Some(comm.as_str()), "comm: {p}");
    assert!(
        p["vmas"].as_array().is_some_and(|a| !a.is_empty()),
        "vmas missing or empty: {p}"
    );

    let fds = p["fds"]
        .as_array()
        .unwrap_or_else(|| panic!("fds missing: {p}"));
    let work = fs::canonicalize(&env.work).expect("canonicalize work dir");
    let find = |fd: i64| {
        fds.iter()
            .find(|f| f["fd"].as_i64() == Some(fd))
            .unwrap_or_else(|| panic!("fd {fd} missing from show --json: {p}"))
    };
    for &(fd, name) in FDS {
        let f = find(fd);
        let want = work.join(name);
        assert_eq!(
            f["path"].as_str(),
            Some(path_str(&want)),
            "fd {fd} path: {f}"
        );
        assert!(
            f["kind"].as_str().is_some_and(|k| !k.is_empty()),
            "fd {fd} has no kind: {f}"
        );
    }
    assert_eq!(
        find(15)["path"].as_str(),
        Some(path_str(&work)),
        "directory fd 15"
    );
    assert_eq!(find(16)["path"].as_str(), Some("/dev/null"), "fd 16");
    let deleted = find(18)["path"].as_str().unwrap_or_default().to_string();
    assert!(
        deleted.contains("deleted.txt"),
        "unlinked file fd 18 path {deleted:?} should name deleted.txt"
    );
}
