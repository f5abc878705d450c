//! signalfds come back with their signal masks, status and fd flags,
//! shared by a dup and across fork, and receive a signal sent after the
//! restore (victim: tests/c/signalfd.c).

use crate::common::*;
use nix::sys::signal::Signal;

#[test]
fn signalfd_mask_flags_and_sharing_survive() {
    let env = TestEnv::new("signalfd");
    let mut v = Victim::spawn(&env, "signalfd", &[]);
    v.wait_ready();
    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("2 processes"), "{}", out.stderr);
    v.reap_killed(std::time::Duration::from_secs(10));

    // Parent and child each hold S, its dup and T: six fds, two open files.
    let json = show_json(&env);
    let fds = fds_of_kind(&json, "signalfd");
    assert_eq!(
        fds.len(),
        6,
        "parent and child hold 3 signalfd fds each: {json}"
    );
    assert_eq!(
        file_ids(&fds).len(),
        2,
        "6 signalfd fds should be 2 open files: {json}"
    );
    for want in [
        "signalfd mask 0x200 (signals 10)",
        "signalfd mask 0x800 (signals 12)",
    ] {
        assert!(
            fds.iter().any(|f| f["object"] == want),
            "no `{want}` in ckpt show: {json}"
        );
    }

    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    // After the restore: only a restored signalfd can report it.
    v.send(Signal::SIGUSR1);
    v.go();
    finish_restore(&v, restore);
}
