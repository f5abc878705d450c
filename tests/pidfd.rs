//! pidfds of processes of the tree come back on the same pids with their
//! flags: a parent polls and waits for its child through one, and reaps a
//! zombie child through another; one of a child already reaped still
//! refers to no process; a pidfd of a process outside the tree is refused
//! by name (victim: tests/c/pidfd.c).

use std::time::Duration;

use crate::common::*;

#[test]
fn pidfds_of_the_tree_come_back() {
    let env = TestEnv::new("pidfd");
    let mut v = Victim::spawn_as(&env, "pidfd", &[], test_user());
    v.wait_ready();
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("3 processes"), "{}", out.stderr);
    v.reap_killed(Duration::from_secs(10));

    let json = show_json(&env);
    let fds = fds_of_kind(&json, "pidfd");
    assert_eq!(fds.len(), 4, "the parent's four pidfds: {json}");
    let objects: Vec<&str> = fds.iter().filter_map(|f| f["object"].as_str()).collect();
    assert!(
        objects.contains(&format!("pidfd of pid {}", v.pid).as_str())
            && objects.contains(&"pidfd of a process that exited and was reaped"),
        "{objects:?}"
    );

    restore_and_check(&env, &v);
}

#[test]
fn pidfd_of_a_process_outside_the_tree_is_refused() {
    let env = TestEnv::new("pidfd-outside");
    let mut v = Victim::spawn(&env, "pidfd", &["outside"]);
    v.wait_ready();
    let line = dump_expect_error(&env, &v);
    for w in [
        &v.pid.to_string(),
        "fd 12",
        "pidfd of pid",
        "not a process (or unreaped child) of the dumped tree",
    ] {
        assert!(line.contains(w), "error should name {w:?}: {line}");
    }
    v.assert_unharmed_and_passes("after a dump refused for a pidfd");
}
