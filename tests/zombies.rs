//! Zombie children (exited, or killed by a signal including SIGKILL, not yet
//! reaped) come back as zombies of the same parent with the same wait status
//! and name
//! (victim: tests/c/zombie.c).

mod common;

use common::*;

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
