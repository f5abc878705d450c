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

/// A session whose controlling terminal is a pty of the tree (tmux,
/// screen, `script`): after restore the new slave is the session's
/// controlling terminal with the same foreground job, its node has the
/// owner and mode it had, the bytes in flight both ways (a half-typed
/// line included) are there, and ^C typed into the master interrupts the
/// job (victim: tests/c/ctty.c).
#[test]
fn controlling_terminal_and_bytes_in_flight_come_back() {
    let env = TestEnv::new("ctty");
    let mut v = Victim::spawn(&env, "ctty", &[]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let show = show_json(&env);
    // The master in the root, fds 0-2 on the slave in the leader and its job.
    assert_eq!(fds_of_kind(&show, "pty").len(), 7);
    assert!(fds_of_kind(&show, "tty").is_empty());
    restore_and_check(&env, &v);
}

/// The same tree dumped and left running: reading the bytes in flight
/// consumed them, and the dump put them back where they were.
#[test]
fn bytes_in_flight_survive_a_dump_that_lets_the_tree_run_on() {
    let env = TestEnv::new("ctty-live");
    let mut v = Victim::spawn(&env, "ctty", &[]);
    v.wait_ready();
    dump(&env, &v, &[]);
    v.assert_unharmed_and_passes("after a dump of a session with its terminal's bytes in flight");
}
