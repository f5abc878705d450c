//! UNIX sockets come back connected to the same peers, with every byte and
//! message boundary queued in both directions, shutdown state, options and
//! flags; run as root and as an unprivileged user, whose sockets stay
//! theirs (victim: tests/c/unix.c).

mod common;

use common::*;

/// The fds the victim holds, per process: root 4 cross-process ends, a
/// dup, 2 local ends and a lone socket; the child 4 ends.
const ROOT_FDS: usize = 8;
const CHILD_FDS: usize = 4;

fn cycle(env: &TestEnv, mut v: Victim) {
    v.wait_ready();
    let out = dump(env, &v, &["--kill"]);
    assert!(out.stderr.contains("2 processes"), "{}", out.stderr);
    v.reap_killed(std::time::Duration::from_secs(10));

    let json = show_json(env);
    let fds = fds_of_kind(&json, "unix");
    assert_eq!(fds.len(), ROOT_FDS + CHILD_FDS, "unix fds: {json}");
    // Five pairs and the lone socket; the dup shares its description.
    assert_eq!(file_ids(&fds).len(), 11, "unix open files: {json}");
    let objects: Vec<&str> = fds.iter().filter_map(|f| f["object"].as_str()).collect();
    for what in [
        "unix stream",
        "unix dgram",
        "unix seqpacket",
        "queued 3 messages",
        "shutdown 2",
        "shutdown 1",
    ] {
        assert!(
            objects.iter().any(|o| o.contains(what)),
            "no `{what}` in {objects:?}"
        );
    }
    let files = json["files"].as_array().expect("files");
    assert!(
        files
            .iter()
            .any(|f| f["name"].as_str().is_some_and(|n| n.starts_with("unix-"))),
        "no unix-ID.img queue image: {json}"
    );

    restore_and_check(env, &v);
}

#[test]
fn socket_pairs_keep_queues_boundaries_and_options() {
    let env = TestEnv::new("unix");
    let v = Victim::spawn(&env, "unix", &[]);
    cycle(&env, v);
}

#[test]
fn an_unprivileged_users_sockets_stay_theirs() {
    let env = TestEnv::new("unix-user");
    let v = Victim::spawn_as(&env, "unix", &[], test_user());
    cycle(&env, v);
}
