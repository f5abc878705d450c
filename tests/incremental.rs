//! Incremental dumps: `ckpt dump --pre-dump` leaves write tracking in the
//! processes and saves their memory while they run; a later dump with
//! `--prev` takes the chunks nobody wrote since from the pre-dump and reads
//! only the rest from the tree. Victim: tests/c/incremental.c, which
//! between the pre-dump and the dump rewrites part of its memory, moves a
//! region (mremap) and drops another (MADV_DONTNEED), and after the
//! restore checks every page of all of it.

use std::path::Path;
use std::time::Duration;

use crate::common::*;

fn json_of(out: &CkptOutput) -> serde_json::Value {
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

fn pre_dump(env: &TestEnv, v: &Victim, dir: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--pre-dump"];
    args.extend_from_slice(extra);
    dump_into(env, v, dir, &args)
}

/// `ckpt dump --tree PID --dir DIR --json <extra>`, which must succeed;
/// its JSON report.
fn dump_into(env: &TestEnv, v: &Victim, dir: &Path, extra: &[&str]) -> serde_json::Value {
    let pid = v.pid.to_string();
    let mut args = vec!["dump", "--tree", &pid, "--dir", path_str(dir), "--json"];
    args.extend_from_slice(extra);
    let out = ckpt(env, &args, Duration::from_secs(120));
    out.assert_success();
    json_of(&out)
}

/// `ckpt show --json` of `dir`, after checking that the tracking it
/// records is a userfaultfd at that fd of the running victim.
fn tracked(env: &TestEnv, v: &Victim, dir: &Path) -> serde_json::Value {
    let show = ckpt(
        env,
        &["show", path_str(dir), "--json"],
        Duration::from_secs(30),
    );
    show.assert_success();
    let shown: serde_json::Value = serde_json::from_str(show.stdout.trim()).unwrap();
    let fd = shown["processes"][0]["tracking"]["fd"]
        .as_i64()
        .unwrap_or_else(|| panic!("no tracking recorded: {shown}"));
    assert_eq!(
        std::fs::read_link(format!("/proc/{}/fd/{fd}", v.pid))
            .unwrap()
            .display()
            .to_string(),
        "anon_inode:[userfaultfd]"
    );
    shown
}

fn incremental_cycle(test: &str, compress: &str) {
    incremental_cycle_with(test, compress, false);
}

/// The cycle, the final dump taken with `--background` when `background`:
/// only the pages written since are read frozen, and the tree runs (and
/// is killed afterwards) while the rest is copied from the pre-dump.
fn incremental_cycle_with(test: &str, compress: &str, background: bool) {
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
    let shown = tracked(&env, &v, &first);
    assert_eq!(shown["pre_dump"], true, "{shown}");
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
    let last = if background { "--background" } else { "--kill" };
    let out = dump(
        &env,
        &v,
        &["--prev", path_str(&second), compress, last, "--json"],
    );
    let report = json_of(&out);
    if background {
        assert!(
            v.ping(Duration::from_secs(10)),
            "the tree runs on: {}",
            v.diag()
        );
        v.send(nix::sys::signal::Signal::SIGKILL);
    }
    let reused = report["stats"]["reused_bytes"].as_u64().unwrap_or(0);
    // The untouched 56 MiB come from the pre-dump; the rewritten 8 MiB,
    // the moved region and the hot one from the tree.
    assert!(
        (50 << 20..=64 << 20).contains(&reused),
        "reused {reused} bytes: {report}"
    );
    // In the background, the 8 MiB where one page in 16 was rewritten are
    // rebuilt from the pre-dump's blocks and those pages alone (and maybe
    // a small chunk of the stack or libc's data).
    let patched = report["stats"]["patched_bytes"].as_u64();
    if background {
        assert!(
            patched.is_some_and(|p| (8 << 20..9 << 20).contains(&p)),
            "{report}"
        );
        // What was written since the pre-dump was foreseen before the
        // freeze, and read into memory faulted in then.
        let reserved = report["stats"]["held_reserved_bytes"].as_u64();
        assert!(reserved.is_some_and(|r| r > 0), "{report}");
    } else {
        assert_eq!(patched, None, "{report}");
    }
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

#[test]
fn incremental_background_dump_reads_only_what_changed_frozen() {
    incremental_cycle_with("incremental-bg", "--compress=lz4", true);
}

/// A chain of ten pre-dumps, each on top of the one before (the victim's
/// hot region changes all along), then the final dump: every link reuses
/// the untouched memory, and the result restores byte-exact on its own.
#[test]
fn chain_of_ten_pre_dumps_restores_exactly() {
    let env = TestEnv::new("incremental-chain");
    let mut v = Victim::spawn(&env, "incremental", &[]);
    v.wait_ready();
    let mut prev: Option<std::path::PathBuf> = None;
    for i in 0..10 {
        let dir = env.root.join(format!("pre{i}"));
        let mut extra = vec!["--compress=lz4"];
        if let Some(p) = &prev {
            extra.extend(["--prev", path_str(p)]);
        }
        let report = pre_dump(&env, &v, &dir, &extra);
        if prev.is_some() {
            let reused = report["stats"]["reused_bytes"].as_u64().unwrap_or(0);
            assert!(reused >= 60 << 20, "link {i} reused {reused}: {report}");
        }
        if let Some(p) = prev.replace(dir) {
            // Only the latest link is needed for the next one.
            std::fs::remove_dir_all(p).unwrap();
        }
    }
    write_atomic(&v.path("stage1"), "stage1");
    assert!(
        wait_for_file(&v.path("mutated"), Duration::from_secs(20)),
        "{}",
        v.diag()
    );
    let last = prev.unwrap();
    dump(&env, &v, &["--prev", path_str(&last), "--kill"]);
    v.reap_killed(Duration::from_secs(10));
    std::fs::remove_dir_all(&last).unwrap();
    restore_and_check(&env, &v);
}

/// A pre-dump damaged after it was taken is refused by the dump that
/// builds on it, naming the file, before the tree is frozen: the job runs
/// on untouched and no checkpoint appears.
#[test]
fn damaged_pre_dump_is_refused_by_name() {
    let env = TestEnv::new("incremental-damaged");
    let mut v = Victim::spawn(&env, "incremental", &[]);
    v.wait_ready();
    let pre = env.root.join("pre");
    pre_dump(&env, &v, &pre, &["--compress=lz4"]);
    let pages = std::fs::read_dir(&pre)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("pages-"))
        })
        .expect("a pages file in the pre-dump");
    let mut bytes = std::fs::read(&pages).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&pages, &bytes).unwrap();
    let out = dump_outcome(&env, &v, &["--prev", path_str(&pre)]);
    let err = out.assert_error();
    assert!(
        err.contains(&pages.file_name().unwrap().to_string_lossy().to_string()),
        "the error names the damaged file: {err}"
    );
    assert!(!env.img.exists(), "no checkpoint from a damaged chain");
    assert!(
        v.ping(Duration::from_secs(10)),
        "the job runs on: {}",
        v.diag()
    );
}

/// Periodic checkpoints: each `--track` dump is a complete, restorable
/// checkpoint that leaves write tracking behind, and the next one takes
/// `--prev` on it and reads only what was written since. The tracking
/// userfaultfd is ckpt's, not the job's: no checkpoint holds it.
#[test]
fn tracked_checkpoints_are_whole_and_chain() {
    let env = TestEnv::new("incremental-track");
    let mut v = Victim::spawn(&env, "incremental", &[]);
    v.wait_ready();
    write_atomic(&v.path("stage1"), "stage1");
    assert!(
        wait_for_file(&v.path("mutated"), Duration::from_secs(20)),
        "{}",
        v.diag()
    );
    // The first periodic checkpoint is the one restored at the end.
    let first = env.img.clone();
    let out = dump(&env, &v, &["--track", "--compress=lz4", "--json"]);
    let report = json_of(&out);
    assert!(
        v.ping(Duration::from_secs(10)),
        "the job runs on: {}",
        v.diag()
    );
    let shown = tracked(&env, &v, &first);
    assert_eq!(
        shown["pre_dump"], false,
        "a whole checkpoint: {shown} {report}"
    );
    let fd = shown["processes"][0]["tracking"]["fd"].as_i64().unwrap();
    let saved_fds: Vec<i64> = shown["processes"][0]["fds"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f["fd"].as_i64()).collect())
        .unwrap_or_default();
    assert!(!saved_fds.is_empty(), "fds listed: {shown}");
    assert!(
        !saved_fds.contains(&fd),
        "the tracking fd {fd} is not the job's: {saved_fds:?}"
    );
    // Two more, each on the one before.
    let mut prev = first.clone();
    for (i, last) in [(1, false), (2, true)] {
        let dir = env.root.join(format!("periodic{i}"));
        let then = if last { "--kill" } else { "--track" };
        let report = dump_into(
            &env,
            &v,
            &dir,
            &["--prev", path_str(&prev), "--compress=lz4", then],
        );
        let reused = report["stats"]["reused_bytes"].as_u64().unwrap_or(0);
        assert!(
            reused >= 60 << 20,
            "checkpoint {i} reused only {reused}: {report}"
        );
        prev = dir;
    }
    v.reap_killed(Duration::from_secs(10));
    // The first checkpoint still restores on its own.
    restore_and_check(&env, &v);
}

/// The userfaultfds `pid` holds, by fd.
fn userfaultfds(pid: i32) -> Vec<i32> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let link = std::fs::read_link(e.path()).ok()?;
            (link.as_os_str() == "anon_inode:[userfaultfd]")
                .then(|| e.file_name().to_str()?.parse().ok())
                .flatten()
        })
        .collect()
}

/// A pre-dump on top of another that is killed once it has armed its
/// tracking (ckpt SIGKILLed while it copies pages). The job runs on; the
/// first pre-dump no longer matches any tracker, so a dump on top of it
/// reads everything again, including the pages the job rewrote between
/// the two pre-dumps (taking them from the first would restore stale
/// memory); and the killed pre-dump's tracker, recorded on the host as
/// ckpt's, is closed by that dump instead of being refused as an unknown
/// userfaultfd of the job.
#[test]
fn pre_dump_killed_after_arming_leaves_no_stale_tracking() {
    let env = TestEnv::new("incremental-killed");
    let mut v = Victim::spawn(&env, "incremental", &[]);
    v.wait_ready();
    let first = env.root.join("pre1");
    pre_dump(&env, &v, &first, &["--compress=lz4"]);
    // Written after the first pre-dump and never again.
    write_atomic(&v.path("stage1"), "stage1");
    assert!(
        wait_for_file(&v.path("mutated"), Duration::from_secs(20)),
        "{}",
        v.diag()
    );
    let second = env.root.join("pre2");
    let pid = v.pid.to_string();
    let out = CkptCmd::spawn_with_env(
        &env,
        &[
            "dump",
            "--tree",
            &pid,
            "--dir",
            path_str(&second),
            "--pre-dump",
            "--prev",
            path_str(&first),
        ],
        &[("CKPT_FAULT", Path::new("during-pages"))],
    )
    .wait_with(Duration::from_secs(60), || v.diag());
    assert_eq!(out.code(), 128 + libc::SIGKILL, "{}", out.stderr);
    assert!(!second.exists(), "no pre-dump committed");
    assert!(
        v.ping(Duration::from_secs(10)),
        "the job runs on: {}",
        v.diag()
    );
    let left = userfaultfds(v.pid);
    assert_eq!(left.len(), 1, "the killed pre-dump's tracker: {left:?}");
    let out = dump(&env, &v, &["--prev", path_str(&first), "--kill", "--json"]);
    let report = json_of(&out);
    let reused = report["stats"]["reused_bytes"].as_u64().unwrap_or(0);
    assert_eq!(reused, 0, "nothing trusted from the first: {report}");
    v.reap_killed(Duration::from_secs(10));
    std::fs::remove_dir_all(&first).unwrap();
    restore_and_check(&env, &v);
}
