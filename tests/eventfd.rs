//! eventfds come back with their 64-bit counter, semaphore mode, status
//! and fd flags, shared by a dup and across fork (victim: tests/c/eventfd.c).

use crate::common::*;

#[test]
fn eventfd_counter_mode_and_sharing_survive() {
    let env = TestEnv::new("eventfd");
    let mut v = Victim::spawn(&env, "eventfd", &[]);
    v.wait_ready();
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("2 processes"), "{}", out.stderr);
    v.reap_killed(std::time::Duration::from_secs(10));

    // Parent and child each hold A, its dup and S (fork copies the table):
    // six fds, two open files.
    let json = show_json(&env);
    let fds = fds_of_kind(&json, "eventfd");
    assert_eq!(
        fds.len(),
        6,
        "parent and child hold 3 eventfd fds each: {json}"
    );
    assert_eq!(
        file_ids(&fds).len(),
        2,
        "6 eventfd fds should be 2 open files: {json}"
    );

    restore_and_check(&env, &v);
}
