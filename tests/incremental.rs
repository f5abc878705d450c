//! Incremental dumps: `ckpt dump --pre-dump` leaves write tracking in the
//! processes and saves their memory while they run; a later dump with
//! `--prev` takes the chunks nobody wrote since from the pre-dump and reads
//! only the rest from the tree. Victim: tests/c/incremental.c, which
//! between the pre-dump and the dump rewrites part of its memory, moves a
//! region (mremap) and drops another (MADV_DONTNEED), and after the
//! restore checks every page of all of it.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

fn json_of(out: &CkptOutput) -> serde_json::Value {
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

fn pre_dump(env: &TestEnv, v: &Victim, dir: &Path, extra: &[&str]) -> serde_json::Value {
    let pid = v.pid.to_string();
    let mut args = vec![
        "dump",
        "--tree",
        &pid,
        "--dir",
        path_str(dir),
        "--pre-dump",
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = ckpt(env, &args, Duration::from_secs(120));
    out.assert_success();
    json_of(&out)
}

fn incremental_cycle(test: &str, compress: &str) {
    let env = TestEnv::new(test);
    let mut v = Victim::spawn(&env, "incremental", &[]);
    v.wait_ready();
    let first = env.root.join("pre1");
    let second = env.root.join("pre2");
    let report = pre_dump(&env, &v, &first, &[compress]);
    // 64 + 1 + 4 + 4 MiB of the victim's own, and more (stack, libc).
    let planned = report["stats"]["pages_planned_bytes"].as_u64().unwrap();
    assert!(planned >= 73 << 20, "{report}");
    assert!(
        v.ping(Duration::from_secs(10)),
        "the tree runs after a pre-dump"
    );
    // A second pre-dump on top of the first: nothing big changed.
    let report = pre_dump(&env, &v, &second, &[compress, "--prev", path_str(&first)]);
    let reused = report["stats"]["reused_bytes"].as_u64().unwrap_or(0);
    assert!(
        reused >= 60 << 20,
        "second pre-dump reused only {reused}: {report}"
    );
    // A pre-dump is no checkpoint.
    let out = ckpt(
        &env,
        &["restore", "--dir", path_str(&second)],
        Duration::from_secs(30),
    );
    assert!(out.assert_error().contains("a pre-dump"), "{}", out.stderr);

    write_atomic(&v.path("stage1"), "stage1");
    assert!(
        wait_for_file(&v.path("mutated"), Duration::from_secs(20)),
        "{}",
        v.diag()
    );
    let out = dump(
        &env,
        &v,
        &["--prev", path_str(&second), compress, "--kill", "--json"],
    );
    let report = json_of(&out);
    let reused = report["stats"]["reused_bytes"].as_u64().unwrap_or(0);
    // The untouched 56 MiB come from the pre-dump; the rewritten 8 MiB,
    // the moved region and the hot one from the tree.
    assert!(
        (50 << 20..=64 << 20).contains(&reused),
        "reused {reused} bytes: {report}"
    );
    v.reap_killed(Duration::from_secs(10));
    // The checkpoint stands alone.
    std::fs::remove_dir_all(&first).unwrap();
    std::fs::remove_dir_all(&second).unwrap();
    restore_and_check(&env, &v);
}

#[test]
fn incremental_dump_after_pre_dumps_lz4() {
    incremental_cycle("incremental-lz4", "--compress=lz4");
}

#[test]
fn incremental_dump_after_pre_dumps_raw() {
    incremental_cycle("incremental-raw", "--compress=none");
}
