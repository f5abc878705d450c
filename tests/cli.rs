//! The command line as scripts see it: every failure is one line on stderr
//! (or one JSON object on stdout with `--json`) and an exit code per class,
//! as README.md documents.

mod common;

use common::*;
use serde_json::Value;

/// Exit codes README.md promises.
const USAGE: i32 = 2;
const UNSUPPORTED: i32 = 3;
const TARGET_GONE: i32 = 5;
const IMAGE_INVALID: i32 = 7;

/// `ckpt dump --tree PID --dir IMG --json`.
fn dump_json(env: &TestEnv, pid: &str) -> CkptOutput {
    ckpt(
        env,
        &["dump", "--tree", pid, "--dir", path_str(&env.img), "--json"],
        DUMP_TIMEOUT,
    )
}

fn json_error(out: &CkptOutput) -> Value {
    let v: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("`{}` printed no JSON ({e}): {}", out.desc, out.stdout));
    v["error"].clone()
}

#[test]
fn usage_errors_are_one_line_with_code_2() {
    let env = TestEnv::new("cli-usage");
    let out = ckpt(&env, &["dump", "--no-such-flag"], FAIL_TIMEOUT);
    assert_eq!(out.code(), USAGE, "{}", out.stderr);
    assert_eq!(out.stderr.trim().lines().count(), 1, "{}", out.stderr);
    assert!(out.stderr.starts_with("ckpt: error:"), "{}", out.stderr);

    let out = ckpt(&env, &["dump", "--no-such-flag", "--json"], FAIL_TIMEOUT);
    assert_eq!(out.code(), USAGE);
    assert_eq!(json_error(&out)["kind"], "usage", "{}", out.stdout);
    assert!(
        out.stderr.is_empty(),
        "JSON mode writes nothing to stderr: {}",
        out.stderr
    );
}

#[test]
fn missing_process_and_missing_checkpoint_are_classified() {
    let env = TestEnv::new("cli-gone");
    let pid = unused_pid().to_string();
    let out = dump_json(&env, &pid);
    assert_eq!(out.code(), TARGET_GONE, "{}", out.stdout);
    let e = json_error(&out);
    assert_eq!(e["kind"], "target_gone");
    assert_eq!(e["pid"].as_i64().map(|p| p.to_string()), Some(pid));

    let out = restore_outcome(&env);
    assert_eq!(out.code(), IMAGE_INVALID, "{}", out.stderr);
    let line = out.assert_error();
    assert_eq!(
        line.matches("No such file or directory").count(),
        1,
        "the OS error should appear once: {line}"
    );
}

#[test]
fn unsupported_fd_names_pid_and_fd_in_json() {
    let env = TestEnv::new("cli-unsupported");
    // A pipe to outside on fd 10 (a stdio one would be rebound instead).
    let (mut v, w) = spawn_with_outside_pipe(&env);
    let pid = v.pid.to_string();
    let out = dump_json(&env, &pid);
    assert_eq!(out.code(), UNSUPPORTED, "{}", out.stdout);
    let e = json_error(&out);
    assert_eq!(e["kind"], "unsupported");
    assert_eq!(e["pid"].as_i64(), Some(i64::from(v.pid)));
    assert_eq!(e["fd"].as_i64(), Some(10), "{e}");
    assert!(
        e["message"].as_str().is_some_and(|m| m.contains("pipe")),
        "{e}"
    );
    drop(w);
    v.assert_unharmed_and_passes("after a refused dump");
}

#[test]
fn restore_writes_the_pidfile() {
    let env = TestEnv::new("cli-pidfile");
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let pidfile = env.root.join("restored.pid");
    let mut restore = spawn_restore(&env, &["--pidfile", path_str(&pidfile)]);
    wait_restored_and_running(&v, &mut restore);
    // Written right after the tree is resumed, so maybe just after the
    // victim answered.
    assert!(
        wait_until(std::time::Duration::from_secs(10), || pidfile.exists()),
        "no pid file"
    );
    let written = std::fs::read_to_string(&pidfile).expect("pid file written");
    assert_eq!(written.trim(), v.pid.to_string(), "pid file content");
    v.go();
    finish_restore(&v, restore);
}

/// CRIU users create the images directory first: an empty one is used, a
/// non-empty one is never touched (see failures.rs for that side).
#[test]
fn dump_into_existing_empty_directory() {
    let env = TestEnv::new("cli-empty-dir");
    std::fs::create_dir(&env.img).expect("create empty img dir");
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    restore_and_check(&env, &v);
}

/// A tree holding three kinds of unsupported objects (four fds) in two
/// processes: every one is reported in one run (one line each, plus a summary), and
/// the tree keeps running.
#[test]
fn every_blocker_of_the_tree_is_reported_at_once() {
    let env = TestEnv::new("cli-blockers");
    let mut v = Victim::spawn(&env, "blockers", &[]);
    v.wait_ready();
    let pid = v.pid.to_string();
    let out = ckpt(
        &env,
        &["dump", "--tree", &pid, "--dir", path_str(&env.img)],
        DUMP_TIMEOUT,
    );
    assert_eq!(out.code(), UNSUPPORTED, "{}", out.stderr);
    let lines: Vec<&str> = out.stderr.trim().lines().collect();
    assert_eq!(
        lines.len(),
        5,
        "four blockers and a summary: {}",
        out.stderr
    );
    for what in ["netlink socket", "memfd", "fanotify"] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("ckpt: error: pid ") && l.contains(what)),
            "no line for the {what}: {}",
            out.stderr
        );
    }
    assert!(
        lines[4].contains("4 things") && lines[4].contains("2 processes"),
        "summary: {}",
        lines[4]
    );
    assert!(!env.img.exists(), "failed dump left {}", env.img.display());

    let out = dump_json(&env, &pid);
    assert_eq!(out.code(), UNSUPPORTED);
    let e = json_error(&out);
    let blockers = e["blockers"].as_array().expect("blockers array");
    assert_eq!(blockers.len(), 4, "{e}");
    assert!(
        blockers
            .iter()
            .all(|b| b["pid"].is_i64() && b["fd"].is_i64()),
        "{e}"
    );
    v.assert_unharmed_and_passes("after a dump refused for four reasons");
}

/// README's list of file kinds names every kind of the dumper's registry
/// and every refused thing (`ckpt check --kinds --json` prints both).
#[test]
fn readme_lists_every_file_kind() {
    let env = TestEnv::new("cli-kinds");
    let out = ckpt(&env, &["check", "--kinds", "--json"], FAIL_TIMEOUT);
    out.assert_success();
    let v: Value = serde_json::from_str(&out.stdout).expect("JSON");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("read README.md");
    let mut names = 0;
    for list in ["supported", "refused"] {
        for k in v[list].as_array().expect(list) {
            let name = k["name"].as_str().expect("name");
            assert!(
                readme.contains(&format!("`{name}`")),
                "README.md does not mention {list} kind `{name}`"
            );
            names += 1;
        }
    }
    assert!(names >= 10, "{v}");
}

/// Completions and man pages come from the parser's own definitions.
#[test]
fn completions_and_man_pages_match_the_options() {
    let env = TestEnv::new("cli-docs");
    let out = ckpt(&env, &["completions", "bash"], FAIL_TIMEOUT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    assert!(
        out.stdout.contains("dump") && out.stdout.contains("--tree"),
        "bash completion lacks dump --tree"
    );
    let man = env.root.join("man");
    let out = ckpt(&env, &["man", path_str(&man)], FAIL_TIMEOUT);
    assert_eq!(out.code(), 0, "{}", out.stderr);
    let page = std::fs::read_to_string(man.join("ckpt-dump.1")).expect("ckpt-dump.1 written");
    assert!(
        page.contains("tree"),
        "ckpt-dump.1 does not document --tree"
    );
    assert!(man.join("ckpt-restore.1").exists(), "no ckpt-restore.1");
}
