//! Zombie children (exited, or killed by a signal, not yet reaped) come back
//! as zombies of the same parent with the same wait status
//! (victim: tests/c/zombie.c).

mod common;

use common::*;

#[test]
fn zombie_children_keep_their_status() {
    let env = TestEnv::new("zombies");
    let mut v = Victim::spawn(&env, "zombie", &[]);
    v.wait_ready();
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("3 processes"), "{}", out.stderr);
    v.reap_killed(std::time::Duration::from_secs(10));
    restore_and_check(&env, &v);
}
