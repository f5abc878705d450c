//! The command line as scripts see it: every failure is one line on stderr
//! (or one JSON object on stdout with `--json`) and an exit code per class,
//! as docs/usage.md documents.

use crate::common::*;
use serde_json::Value;

/// Exit codes docs/usage.md promises.
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

/// `ckpt show DIR | head`: a reader that goes away early ends the command
/// quietly (exit 0, nothing on stderr), not with a panic.
#[test]
fn show_into_a_closed_pipe_exits_quietly() {
    let env = TestEnv::new("cli-show-pipe");
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let mut show = env
        .ckpt_command()
        .args(["show", path_str(&env.img)])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn ckpt show");
    // The reader is gone before ckpt writes its first byte.
    drop(show.stdout.take());
    let out = show.wait_with_output().expect("wait for ckpt show");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{out:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `ckpt job list | head` and `ckpt job status | head`: a reader gone
/// before the table is written ends the command quietly too.
#[test]
fn job_tables_into_a_closed_pipe_exit_quietly() {
    let env = TestEnv::new("cli-job-pipe");
    let jobdir = env.root.join("job");
    let run = env
        .ckpt_command()
        .args(["job", "run", "--dir", path_str(&jobdir), "--part", "a"])
        .args(["--node", "n1", "--", "true"])
        .output()
        .expect("run ckpt job run");
    assert!(
        run.status.success(),
        "{run:?}: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    for verb in ["list", "status"] {
        let mut table = env
            .ckpt_command()
            .args(["job", verb, "--dir", path_str(&jobdir)])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn ckpt job");
        drop(table.stdout.take());
        let out = table.wait_with_output().expect("wait for ckpt job");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "job {verb}: {out:?}: {stderr}");
        assert!(out.stderr.is_empty(), "job {verb}: {stderr}");
    }
}

/// `ckpt check` fails (exit 1) when a required feature is missing: here the
/// capabilities, for an ordinary user.
#[test]
fn check_fails_when_a_required_feature_is_missing() {
    use std::os::unix::process::CommandExt;
    let user = test_user();
    let out = std::process::Command::new(CKPT)
        .arg("check")
        .uid(user.uid)
        .gid(user.gid)
        .output()
        .expect("run ckpt check as the test user");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{out:?}: {stdout}");
    assert!(
        stdout.contains("FAIL") && stdout.contains("Some required features are missing."),
        "{stdout}"
    );
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
    let gc = std::fs::read_to_string(man.join("ckpt-gc.1")).expect("ckpt-gc.1 written");
    assert!(
        gc.contains("<JOB>") && gc.contains("<UID:GID>"),
        "ckpt-gc.1 does not document its options"
    );
}

/// What the root file holds before ckpt is pointed at it.
const ROOT_CONTENT: &str = "root:x:0:0:root:/root:/bin/bash\n";

/// A directory of the test user holding `link`, a symlink of the user's
/// (lchown'd) to a root-only 0700 directory with a root file in it: the
/// user's `/tmp/u/d -> /etc`.
struct UsersLink {
    link: std::path::PathBuf,
    root_dir: std::path::PathBuf,
    root_file: std::path::PathBuf,
}

impl UsersLink {
    fn new(env: &TestEnv) -> UsersLink {
        use std::os::unix::fs::PermissionsExt;
        let user = test_user();
        let theirs = env.root.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(user.uid), Some(user.gid)).unwrap();
        let root_dir = env.root.join("roots");
        std::fs::create_dir(&root_dir).unwrap();
        std::fs::set_permissions(&root_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let root_file = root_dir.join("passwd");
        std::fs::write(&root_file, ROOT_CONTENT).unwrap();
        let link = theirs.join("d");
        std::os::unix::fs::symlink(&root_dir, &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(user.uid), Some(user.gid)).unwrap();
        UsersLink {
            link,
            root_dir,
            root_file,
        }
    }

    /// `ckpt` failed with one line naming `path` and the link's owner, and
    /// the root directory is as it was.
    fn assert_refused(&self, out: &CkptOutput, path: &std::path::Path) {
        let err = out.assert_error();
        assert!(err.contains(path_str(path)), "{err}");
        assert!(
            err.contains(&format!("owned by uid {}", test_user().uid)),
            "{err}"
        );
        assert_eq!(
            out.stderr.trim().lines().count(),
            1,
            "one line: {}",
            out.stderr
        );
        assert_eq!(
            std::fs::read_to_string(&self.root_file).unwrap(),
            ROOT_CONTENT,
            "`{}` wrote the root file",
            out.desc
        );
        let names: Vec<_> = std::fs::read_dir(&self.root_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["passwd"], "`{}` wrote in the root dir", out.desc);
    }
}

/// ckpt runs as root: a user's symlink in a parent component of a path it
/// writes (`dump DIR`, `--pidfile`, `--stats-file`, `--log-file`) is not
/// followed, and the restore or run fails before anything is restored or
/// started. Before: root wrote its pid, stats or log over the root file
/// and put the checkpoint in the root directory.
#[test]
fn root_never_writes_through_a_users_symlink() {
    let env = TestEnv::new("cli-user-link");
    let u = UsersLink::new(&env);
    let mut v = Victim::spawn(&env, "counter", &[]);
    v.wait_ready();
    let pid = v.pid.to_string();
    let img = u.link.join("img");
    let out = ckpt(
        &env,
        &["dump", "--tree", &pid, "--dir", path_str(&img)],
        DUMP_TIMEOUT,
    );
    u.assert_refused(&out, &img);
    assert_running_untouched(v.pid, "after a refused dump");
    dump_kill_reap(&env, &mut v);
    let target = u.link.join("passwd");
    for flag in ["--pidfile", "--stats-file"] {
        let out = ckpt(
            &env,
            &[
                "restore",
                "--dir",
                path_str(&env.img),
                flag,
                path_str(&target),
            ],
            FAIL_TIMEOUT,
        );
        u.assert_refused(&out, &target);
        assert!(!pid_exists(v.pid), "{flag}: restored all the same");
    }
    let out = ckpt(
        &env,
        &["--log-file", path_str(&target), "show", path_str(&env.img)],
        FAIL_TIMEOUT,
    );
    u.assert_refused(&out, &target);
    let out = ckpt(
        &env,
        &[
            "run",
            "--utsns",
            "--pidfile",
            path_str(&target),
            "--",
            "true",
        ],
        FAIL_TIMEOUT,
    );
    u.assert_refused(&out, &target);

    // A link of root's is followed, as Debian's /var/run -> /run.
    let roots_link = env.root.join("run");
    std::os::unix::fs::symlink(&u.root_dir, &roots_link).unwrap();
    let pidfile = roots_link.join("ok.pid");
    let out = ckpt(
        &env,
        &[
            "run",
            "--utsns",
            "--pidfile",
            path_str(&pidfile),
            "--",
            "true",
        ],
        FAIL_TIMEOUT,
    );
    out.assert_success();
    let written = std::fs::read_to_string(u.root_dir.join("ok.pid")).unwrap();
    assert!(written.trim().parse::<i32>().is_ok(), "{written:?}");
}

/// A FIFO of mode 0600 given as a namespace or secret file fails at once
/// with one line naming it. Before: ckpt blocked for ever opening it.
#[test]
fn fifos_given_as_namespace_or_secret_files_fail_fast() {
    use std::os::unix::fs::PermissionsExt;
    let quick = std::time::Duration::from_secs(10);
    let env = TestEnv::new("cli-fifo-paths");
    // A valid key, so restore gets as far as the namespace files.
    std::fs::write(env.image_key(), [7u8; 32]).unwrap();
    std::fs::set_permissions(env.image_key(), std::fs::Permissions::from_mode(0o600)).unwrap();
    let fifo = env.root.join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let state = env.root.join("coord");
    let runs: [&[&str]; 4] = [
        &[
            "restore",
            "--dir",
            path_str(&env.img),
            "--netns",
            path_str(&fifo),
        ],
        &[
            "restore",
            "--dir",
            path_str(&env.img),
            "--mntns",
            path_str(&fifo),
        ],
        &[
            "coord",
            "--listen",
            "127.0.0.1:0",
            "--state-dir",
            path_str(&state),
            "--secret-file",
            path_str(&fifo),
        ],
        &[
            "coord",
            "trigger",
            "--connect",
            "127.0.0.1:1",
            "--secret-file",
            path_str(&fifo),
        ],
    ];
    for args in runs {
        let out = ckpt(&env, args, quick);
        let err = out.assert_error();
        assert!(
            err.contains(path_str(&fifo)) && err.contains("FIFO"),
            "{err}"
        );
        assert_eq!(
            out.stderr.trim().lines().count(),
            1,
            "one line: {}",
            out.stderr
        );
    }
}
