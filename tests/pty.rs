//! A pseudo-terminal pair inside the tree (master in the root, slave as the
//! child's stdout, as `mpirun` or `script` set up) is recreated with its
//! line settings and window size, and carries bytes both ways after
//! restore (victim: tests/c/pty.c).

use crate::common::*;

#[test]
fn pty_pair_inside_the_tree_is_recreated() {
    let env = TestEnv::new("pty");
    let mut v = Victim::spawn(&env, "pty", &[]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let show = show_json(&env);
    let ptys = fds_of_kind(&show, "pty");
    // Two masters in the root, one slave (fd 1) in the child.
    assert_eq!(ptys.len(), 3, "pty fds in the image: {ptys:?}");
    assert_eq!(file_ids(&ptys).len(), 3);
    assert!(
        fds_of_kind(&show, "tty").is_empty(),
        "the slave is one end of a pair, not a terminal to rebind"
    );
    restore_and_check(&env, &v);
}

#[test]
fn pty_pair_survives_a_dump_that_lets_the_tree_run_on() {
    let env = TestEnv::new("pty-live");
    let mut v = Victim::spawn(&env, "pty", &[]);
    v.wait_ready();
    dump(&env, &v, &[]);
    v.assert_unharmed_and_passes("after a dump of a tree with a pty pair");
}
