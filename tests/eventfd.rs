//! eventfds come back with their 64-bit counter, semaphore mode, status
//! and fd flags, shared by a dup and across fork (victim: tests/c/eventfd.c).

mod common;

use common::*;

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
    let show = ckpt(&env, &["show", path_str(&env.img), "--json"], FAIL_TIMEOUT);
    show.assert_success();
    let json: serde_json::Value = serde_json::from_str(show.stdout.trim()).expect("show --json");
    let mut ids: Vec<u64> = json["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .flat_map(|p| p["fds"].as_array().cloned().unwrap_or_default())
        .filter(|f| f["kind"] == "eventfd")
        .map(|f| f["file_id"].as_u64().expect("file_id"))
        .collect();
    assert_eq!(
        ids.len(),
        6,
        "parent and child hold 3 eventfd fds each: {json}"
    );
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 2, "6 eventfd fds should be 2 open files: {json}");

    restore_and_check(&env, &v);
}
