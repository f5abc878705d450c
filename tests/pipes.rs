//! A pipe between a process and its child, with data buffered in it at
//! dump time: every byte arrives after restore, in order
//! (victim: tests/c/pipes.c).

mod common;

use common::*;

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

/// A pipe whose other end is outside the dumped tree cannot be restored:
/// the dump names it and leaves the process alone.
#[test]
fn pipe_to_outside_the_tree_is_refused() {
    let env = TestEnv::new("pipe-outside");
    let (r, w) = nix::unistd::pipe().unwrap();
    let mut v = Victim::spawn_with(
        &env,
        "counter",
        &[],
        std::process::Stdio::from(r),
        std::process::Stdio::null(),
        std::process::Stdio::null(),
    );
    v.wait_ready();
    let err = dump_expect_error(&env, &v);
    assert!(
        err.contains("fd 0") && err.contains("pipe") && err.contains("outside"),
        "error should name fd 0 and the pipe: {err}"
    );
    assert!(!env.img.exists(), "failed dump left {}", env.img.display());
    drop(w);
    v.assert_unharmed_and_passes("after refusing an outside pipe");
}
