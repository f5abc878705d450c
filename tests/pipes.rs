//! A pipe between a process and its child, with data buffered in it at
//! dump time: every byte arrives after restore, in order
//! (victim: tests/c/pipes.c).

use std::time::Duration;

use crate::common::*;

/// Runs `ckpt restore --detach` with no stdin and `stdout` as its stdout,
/// checks that it succeeded and returns what it said on stderr.
fn restore_detached(env: &TestEnv, stdout: std::process::Stdio) -> String {
    let stderr_path = env.work.join("restore.stderr");
    let status = env
        .ckpt_command()
        .args(["restore", "--detach", "--dir", path_str(&env.img)])
        .stdin(std::process::Stdio::null())
        .stdout(stdout)
        .stderr(std::fs::File::create(&stderr_path).expect("create restore.stderr"))
        .status()
        .expect("run restore");
    let notice = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    assert!(status.success(), "restore failed: {notice}");
    notice
}

#[test]
fn pipe_between_parent_and_child_keeps_its_data() {
    let env = TestEnv::new("pipes");
    let mut v = Victim::spawn(&env, "pipes", &[]);
    v.wait_ready();
    // Let data pile up in the pipe (the reader runs at a third of the pace).
    std::thread::sleep(std::time::Duration::from_millis(300));
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("2 processes"), "{}", out.stderr);
    // The buffered bytes (possibly none, if the reader caught up) travel in
    // the pipe's own raw image.
    let saved = std::fs::read_dir(&env.img)
        .expect("read image dir")
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().starts_with("pipe-"));
    assert!(saved, "no pipe-ID.img written");
    v.reap_killed(std::time::Duration::from_secs(10));
    restore_and_check(&env, &v);
}

/// Pipes whose other end no process holds (closed everywhere, one on fd
/// 0) are saved, not refused as "outside": after restore the readers get
/// their buffered bytes then EOF, and the writer EPIPE, as before the dump
/// (victim: tests/c/pipe_closed.c checks it from inside).
#[test]
fn pipe_whose_other_end_is_closed_everywhere_keeps_data_and_eof() {
    let env = TestEnv::new("pipe-closed");
    let mut v = Victim::spawn(&env, "pipe_closed", &[]);
    v.wait_ready();
    let out = dump(&env, &v, &["--kill"]);
    assert!(!out.stderr.contains("rebound"), "{}", out.stderr);
    v.reap_killed(Duration::from_secs(10));
    restore_and_check(&env, &v);
}

/// A pipe whose other end is outside the dumped tree, on an fd other than
/// 0, 1 or 2, cannot be restored: the dump names pid, fd and `--external`,
/// and leaves the process alone (victim: tests/c/outside_pipe.c).
#[test]
fn pipe_to_outside_the_tree_is_refused() {
    let env = TestEnv::new("pipe-outside");
    let (mut v, w) = spawn_with_outside_pipe(&env);
    let err = dump_expect_error(&env, &v);
    assert!(
        err.contains(&format!("pid {}", v.pid))
            && err.contains("fd 10")
            && err.contains("outside")
            && err.contains("--external"),
        "error should name pid, fd 10 and --external: {err}"
    );
    assert!(!env.img.exists(), "failed dump left {}", env.img.display());
    drop(w);
    v.assert_unharmed_and_passes("after refusing an outside pipe");
}

/// A job whose stdout is a pipe to its launcher (the test) is dumped
/// without `--external` (the terminal rule covers stdio pipes): restored
/// under a new launcher, it writes on into the new launcher's pipe,
/// numbered from where it stopped, and restore says it rebound the fd
/// (victim: tests/c/ticker.c).
#[test]
fn stdio_pipe_to_launcher_is_rebound_to_restore() {
    let env = TestEnv::new("pipe-stdio");
    let (mut r1, w1) = launcher_pipe();
    let mut v = spawn_ticker(&env, std::process::Stdio::from(w1));
    dump(&env, &v, &["--kill"]);
    v.reap_killed(Duration::from_secs(10));
    // What the job wrote before the dump is still in the old pipe, the old
    // launcher's to read; none of it is in the checkpoint.
    let last = last_tick_before_dump(&mut r1);
    let saved = std::fs::read_dir(&env.img)
        .expect("read image dir")
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().starts_with("pipe-"));
    assert!(!saved, "a launcher's pipe data must not be saved");

    let (mut r2, w2) = launcher_pipe();
    let notice = restore_detached(&env, std::process::Stdio::from(w2));
    assert!(
        notice.contains(&format!(
            "pid {} fd 1: pipe to outside the tree rebound",
            v.pid
        )),
        "restore should say it rebound fd 1: {notice}"
    );
    assert_ticks_carry_on(&mut r2, last, &v);
}

/// A process whose stdin is a pipe from its parent outside the tree (a
/// child of make), restored while that parent still holds the pipe and
/// restore's own stdin is no stream: the process is on the very same pipe
/// again, with what sat in it, and the parent's later writes reach it;
/// restore says so in one line and rebinds nothing (victim:
/// tests/c/stdin_pipe.c).
#[test]
fn stdin_pipe_from_a_living_parent_is_kept() {
    use std::io::Write;
    let env = TestEnv::new("pipe-stdin-kept");
    // Close-on-exec: no other test's child may hold the parent's end.
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).expect("pipe");
    let mut parent_end = std::fs::File::from(w);
    let mut v = Victim::spawn_with(
        &env,
        "stdin_pipe",
        &[],
        std::process::Stdio::from(r),
        std::process::Stdio::null(),
        std::process::Stdio::null(),
    );
    v.wait_ready();
    parent_end.write_all(b"before\n").expect("write before");
    dump(&env, &v, &["--kill"]);
    v.reap_killed(Duration::from_secs(10));

    let notice = restore_detached(&env, std::process::Stdio::null());
    assert!(
        notice.contains(&format!(
            "pid {} fd 0: pipe to outside the tree kept: pid {} still holds it",
            v.pid,
            std::process::id()
        )),
        "restore should say it kept fd 0: {notice}"
    );
    assert!(!notice.contains("rebound"), "{notice}");
    parent_end.write_all(b"after\n").expect("write after");
    v.go();
    v.wait_result(Duration::from_secs(10));
    v.assert_pass();
}
