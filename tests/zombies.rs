//! Zombie children (exited, or killed by a signal including SIGKILL, not yet
//! reaped) come back as zombies of the same parent with the same wait status
//! and name
//! (victim: tests/c/zombie.c).

use crate::common::*;

#[test]
fn zombie_children_keep_their_status() {
    let env = TestEnv::new("zombies");
    let mut v = Victim::spawn(&env, "zombie", &[]);
    v.wait_ready();
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("4 processes"), "{}", out.stderr);
    v.reap_killed(std::time::Duration::from_secs(10));
    // `ckpt show` reads a checkpoint that holds zombies.
    ckpt(&env, &["show", path_str(&env.img)], FAIL_TIMEOUT).assert_success();
    restore_and_check(&env, &v);
}

/// Every way to end comes back as the same wait status: exit codes 0, 1
/// and 255, SIGKILL, SIGSEGV and SIGABRT without a core, and SIGSEGV with
/// the core-dump bit (restore writes a minimal core it throws away).
fn endings_cycle(test: &str, user: Option<&TestUser>) {
    let env = TestEnv::new(test);
    let mut v = match user {
        Some(u) => Victim::spawn_as(&env, "zombie", &["all"], u),
        None => Victim::spawn(&env, "zombie", &["all"]),
    };
    let ready = v.wait_ready();
    let pattern = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap_or_default();
    if !pattern.starts_with(['|', '/']) {
        assert_eq!(
            ready, "core=1",
            "the core-dumping child got no core-dump bit"
        );
    }
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("8 processes"), "{}", out.stderr);
    v.reap_killed(std::time::Duration::from_secs(10));
    restore_and_check(&env, &v);
    // The throw-away core directory is gone.
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("ckpt-core-"))
        .collect();
    assert!(left.is_empty(), "core directories left: {left:?}");
}

#[test]
fn every_ending_keeps_its_wait_status() {
    endings_cycle("zombies-endings", None);
}

#[test]
fn every_ending_of_a_user_keeps_its_wait_status() {
    endings_cycle("zombies-endings-user", Some(test_user()));
}
