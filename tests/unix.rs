//! UNIX sockets come back connected to the same peers, with every byte and
//! message boundary queued in both directions, shutdown state, options and
//! flags; run as root and as an unprivileged user, whose sockets stay
//! theirs (victim: tests/c/unix.c).

use crate::common::*;

/// The fds the victim holds, per process: the root 4 cross-process ends, a
/// dup, 2 local ends, a lone socket, 2 whose peer closed, 3 listeners, an accepted connection,
/// a pending client and a bound datagram socket; the child 4 ends, a
/// pending client, an accepted connection's client and a datagram socket
/// connected one way.
const ROOT_FDS: usize = 16;
const CHILD_FDS: usize = 7;
/// Open files: 5 pairs, 2 pending clients, a connection and its client,
/// 3 listeners, the lone, the bound and the one-way datagram sockets, 2
/// sockets whose peer closed.
const FILES: usize = 22;

fn cycle(env: &TestEnv, mut v: Victim) {
    v.wait_ready();
    let out = dump(env, &v, &["--kill"]);
    assert!(out.stderr.contains("2 processes"), "{}", out.stderr);
    v.reap_killed(std::time::Duration::from_secs(10));

    let json = show_json(env);
    let fds = fds_of_kind(&json, "unix");
    assert_eq!(fds.len(), ROOT_FDS + CHILD_FDS, "unix fds: {json}");
    // The dup shares its description.
    assert_eq!(file_ids(&fds).len(), FILES, "unix open files: {json}");
    let objects: Vec<&str> = fds.iter().filter_map(|f| f["object"].as_str()).collect();
    for what in [
        "unix stream",
        "unix dgram",
        "unix seqpacket",
        "queued 3 messages",
        "shutdown 2",
        "shutdown 1",
        "listening",
        "pending on file",
        "name @ckpt-unix-test-",
        "unlinked",
        "sends to file",
        "peer closed",
        "queued 2 messages 10 bytes",
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

/// Files queued in SCM_RIGHTS messages and held by no fd (a pipe end, a
/// regular file at an offset, one end of a socket pair with its queue)
/// are saved as files of their own and sent again in order at restore;
/// sent twice, they come back as one open file each.
#[test]
fn fds_in_flight_come_back_with_their_messages() {
    let env = TestEnv::new("unix-inflight");
    let mut v = Victim::spawn(&env, "unix", &["inflight"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let json = show_json(&env);
    let objects: Vec<String> = fds_of_kind(&json, "unix")
        .iter()
        .filter_map(|f| f["object"].as_str().map(str::to_string))
        .collect();
    assert!(
        objects.iter().any(|o| o.contains("files in flight")),
        "no socket lists its files in flight: {objects:?}"
    );
    // The pipe's read end, the file and the socket end: no fd holds them.
    let mut kinds: Vec<String> = json["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .flat_map(|p| p["files_in_flight"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f["kind"].as_str().map(str::to_string))
        .collect();
    kinds.sort_unstable();
    assert_eq!(
        kinds,
        ["pipe", "reg", "unix"],
        "files held only in flight: {json}"
    );
    restore_and_check(&env, &v);
}

/// The same as an unprivileged user: the files held only in flight are
/// reopened with the user's rights, and a child's message keeps its
/// credentials.
#[test]
fn an_unprivileged_users_fds_and_credentials_in_flight_come_back() {
    for mode in ["inflight", "creds"] {
        let env = TestEnv::new(&format!("unix-user-{mode}"));
        let mut v = Victim::spawn_as(&env, "unix", &[mode], test_user());
        v.wait_ready();
        dump_kill_reap(&env, &mut v);
        restore_and_check(&env, &v);
    }
}

/// Restored into a new PID namespace (the restorer outside it), the files
/// in flight are still sent from where the tree holds them.
#[test]
fn fds_in_flight_come_back_in_a_new_pid_namespace() {
    let env = TestEnv::new("unix-inflight-pidns");
    let mut v = Victim::spawn(&env, "unix", &["inflight"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let mut restore = spawn_restore(&env, &["--pidns"]);
    wait_restored_and_running(&v, &mut restore);
    v.go();
    finish_restore(&v, restore);
}

/// A dump left running peeks at the files in flight without taking them:
/// the victim then receives every message with its files as sent.
#[test]
fn fds_in_flight_stay_in_place_after_a_dump_left_running() {
    let env = TestEnv::new("unix-inflight-running");
    let mut v = Victim::spawn(&env, "unix", &["inflight"]);
    v.wait_ready();
    dump(&env, &v, &[]);
    v.assert_unharmed_and_passes("after a dump left running");
}

/// A pipe end in flight on a datagram socket, an empty datagram between
/// two others, sockets never connected and a seqpacket socket whose peer
/// closed: all dumped and back as they were.
#[test]
fn datagrams_with_fds_empty_datagrams_and_unconnected_sockets_come_back() {
    let env = TestEnv::new("unix-inflight-dgram");
    let mut v = Victim::spawn(&env, "unix", &["inflight_dgram"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    restore_and_check(&env, &v);
}

/// A datagram queued on a socket with SO_PASSCRED keeps its sender's
/// credentials (the child's pid, not the restorer's).
#[test]
fn credentials_of_queued_messages_are_the_senders() {
    let env = TestEnv::new("unix-creds");
    let mut v = Victim::spawn(&env, "unix", &["creds"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    restore_and_check(&env, &v);
}

/// A socket in flight with a file in flight on it (nested SCM_RIGHTS):
/// left in place by a dump leaving the tree running, and after a dump with
/// `--kill` both come back in their messages, the pipe end still the
/// pipe's, the socket still its pair's other end.
#[test]
fn nested_fds_in_flight_come_back() {
    let env = TestEnv::new("unix-nested");
    let mut v = Victim::spawn(&env, "unix", &["nested"]);
    v.wait_ready();
    dump(&env, &v, &[]);
    v.assert_unharmed_and_passes("after a dump left running");

    let env = TestEnv::new("unix-nested-kill");
    let mut v = Victim::spawn(&env, "unix", &["nested"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    restore_and_check(&env, &v);
}

/// An out-of-band byte would be peeked inline and come back inline:
/// refused by name, and the reader later finds it where it was.
#[test]
fn out_of_band_data_is_refused_and_left_in_place() {
    let env = TestEnv::new("unix-oob");
    let mut v = Victim::spawn(&env, "unix", &["oob"]);
    v.wait_ready();
    let err = dump_expect_error(&env, &v);
    assert!(
        err.contains(&format!("pid {}", v.pid))
            && err.contains("out-of-band data queued (MSG_OOB)"),
        "{err}"
    );
    v.assert_unharmed_and_passes("after a refused dump");
}

/// A socket pair made in a network namespace of the process's own is read
/// from inside that namespace (sock_diag answers for the caller's only);
/// the restore refuses without `--netns` and, given one, rebuilds the pair
/// there, still carrying bytes.
#[test]
fn a_pair_in_a_network_namespace_of_its_own_moves_with_netns() {
    let env = TestEnv::new("unix-netns");
    let nodes = NetNodes::new("unx", 1);
    let mut v = Victim::spawn(&env, "unix", &["netns"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let err = restore_expect_error(&env);
    assert!(
        err.contains("network namespace of its own") && err.contains("--netns"),
        "{err}"
    );
    let to_path = format!("/run/netns/{}", nodes.names[0]);
    let mut restore = spawn_restore(&env, &["--netns", &to_path]);
    wait_restored_and_running(&v, &mut restore);
    v.go();
    finish_restore(&v, restore);
}

/// A socket whose peer is outside the tree is refused naming the
/// `--external` key; the pair still works afterwards.
#[test]
fn a_peer_outside_the_tree_is_refused() {
    let env = TestEnv::new("unix-outside");
    let mut v = Victim::spawn(&env, "unix", &["outside"]);
    v.wait_ready();
    let err = dump_expect_error(&env, &v);
    assert!(
        err.contains(&format!("pid {}", v.pid))
            && err.contains("outside the dumped tree")
            && err.contains("--external socket:["),
        "{err}"
    );
    v.assert_unharmed_and_passes("after a refused dump");
}

/// A non-blocking socket pair for a launcher: (its end as a `File` the
/// test reads, the end the job gets as stdout).
fn launcher_socket() -> (std::fs::File, std::os::fd::OwnedFd) {
    let (mine, theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
    mine.set_nonblocking(true).expect("O_NONBLOCK");
    (
        std::fs::File::from(std::os::fd::OwnedFd::from(mine)),
        theirs.into(),
    )
}

/// A socket to a daemon outside the tree (here the test, as the job's
/// stdout) is refused naming its key, saved when declared with
/// `--external socket:[INO]`, and handed over at restore with
/// `--inherit-fd fd[N]:socket:[INO]`: the job writes on into the new one.
#[test]
fn an_outside_socket_declared_external_is_handed_over() {
    let env = TestEnv::new("unix-external");
    let (mut r1, w1) = launcher_socket();
    let mut v = spawn_ticker(&env, std::process::Stdio::from(w1));
    let key = stdout_key(&v);
    assert!(key.starts_with("socket:["), "{key}");
    let err = dump_expect_error(&env, &v);
    assert!(err.contains("fd 1") && err.contains(&key), "{err}");

    dump(&env, &v, &["--kill", "--external", &key]);
    v.reap_killed(std::time::Duration::from_secs(10));
    let last = last_tick_before_dump(&mut r1);

    let (mut r2, w2) = launcher_socket();
    restore_inheriting_stdout(&env, &key, w2);
    assert_ticks_carry_on(&mut r2, last, &v);
}

/// Data a client sent on a connection not yet accepted sits on a socket
/// no fd reaches, which only accepting shows: a dump leaving the tree
/// running refuses it by name and leaves it in place; a dump with `--kill`
/// takes it, and after restore the listener accepts the connections in
/// order, each with its data and message boundaries, still connected to
/// its client.
#[test]
fn data_on_a_connection_not_yet_accepted_comes_back_after_a_kill() {
    let env = TestEnv::new("unix-pendingdata");
    let mut v = Victim::spawn(&env, "unix", &["pendingdata"]);
    v.wait_ready();
    let err = dump_expect_error(&env, &v);
    assert!(
        err.contains(&format!("pid {}", v.pid))
            && err.contains("not yet accepted")
            && err.contains("--kill"),
        "{err}"
    );
    assert!(!env.img.exists(), "failed dump left {}", env.img.display());
    v.assert_unharmed_and_passes("after a refused dump");

    let env = TestEnv::new("unix-pendingdata-kill");
    let mut v = Victim::spawn(&env, "unix", &["pendingdata"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let json = show_json(&env);
    let objects: Vec<String> = fds_of_kind(&json, "unix")
        .iter()
        .filter_map(|f| f["object"].as_str().map(str::to_owned))
        .collect();
    for what in [
        "messages 10 bytes before accept",
        "sent 2 messages 9 bytes before accept",
    ] {
        assert!(
            objects.iter().any(|o| o.contains(what)),
            "no `{what}` in {objects:?}"
        );
    }
    restore_and_check(&env, &v);
}

/// A dump with `--kill` refused for something else takes no connection
/// first: the listener later accepts each, with its data, as if no dump
/// had been tried.
#[test]
fn a_refused_kill_dump_leaves_unaccepted_connections_in_place() {
    let env = TestEnv::new("unix-pendingdata-refused");
    let mut v = Victim::spawn(&env, "unix", &["pendingdata", "refused"]);
    v.wait_ready();
    let err = dump_outcome(&env, &v, &["--kill"]).assert_error();
    assert!(err.contains("out-of-band data queued (MSG_OOB)"), "{err}");
    assert!(!env.img.exists(), "failed dump left {}", env.img.display());
    v.assert_unharmed_and_passes("after a refused dump with --kill");
}

/// Names unlinked since bind are connected to again through the socket
/// file (a listener's pending connection, a datagram socket connected one
/// way, a bound socket's queue) and stay unlinked; a bound datagram pair
/// connected both ways keeps both names (victim mode `names`).
#[test]
fn unlinked_names_and_bound_datagram_pairs_come_back() {
    let env = TestEnv::new("unix-names");
    let mut v = Victim::spawn(&env, "unix", &["names"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    restore_and_check(&env, &v);
}

/// The same names and connections of an ordinary user's, and the data its
/// clients sent before accept, made again with that user's rights.
#[test]
fn an_unprivileged_users_unlinked_names_and_unaccepted_data_come_back() {
    for (test, mode) in [
        ("unix-names-user", "names"),
        ("unix-pendingdata-user", "pendingdata"),
    ] {
        let env = TestEnv::new(test);
        let mut v = Victim::spawn_as(&env, "unix", &[mode], test_user());
        v.wait_ready();
        dump_kill_reap(&env, &mut v);
        restore_and_check(&env, &v);
    }
}

/// A stale socket file at a bound path is replaced only when its owner
/// is the one the image records for the socket file (here a user root
/// gave it to), not the restoring process's: one of another owner fails
/// the restore naming the path and stays; the dumped process's own stale
/// socket, that user's, is replaced and the name bound again.
#[test]
fn a_stale_socket_is_replaced_only_when_its_owner_is_the_recorded_one() {
    let env = TestEnv::new("unix-stale-owner");
    let user = test_user();
    let uid = user.uid.to_string();
    let mut v = Victim::spawn(&env, "unix", &["listen", &uid]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);

    let path = v.path("srv.sock");
    let stale = std::fs::symlink_metadata(&path).expect("the killed listener's socket file");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&stale), user.uid);
    std::os::unix::fs::chown(&path, Some(0), Some(0)).expect("chown to root");
    let err = restore_expect_error(&env);
    assert!(
        err.contains(path_str(&path)) && err.contains(&format!("not a socket file of uid {uid}")),
        "{err}"
    );
    let meta = std::fs::symlink_metadata(&path).expect("root's socket is still there");
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), 0);
    assert!(!pid_exists(v.pid), "a half-restored process survived");

    std::os::unix::fs::chown(&path, Some(user.uid), None).expect("chown back");
    restore_and_check(&env, &v);
}

/// Restore binds a socket path only in place of a stale socket of the
/// process's user: a regular file of the user's at the name fails the
/// restore naming the path and stays as it was; once it is gone the
/// restore goes through.
#[test]
fn a_bound_path_never_replaces_a_users_file() {
    let env = TestEnv::new("unix-occupied");
    let mut v = Victim::spawn(&env, "unix", &["listen"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);

    let path = v.path("srv.sock");
    std::fs::remove_file(&path).expect("remove the stale socket");
    std::fs::write(&path, "the user's data").expect("write a file in its place");
    let err = restore_expect_error(&env);
    assert!(
        err.contains(path_str(&path)) && err.contains("not a socket file"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&path).expect("the file is still there"),
        "the user's data"
    );
    assert!(!pid_exists(v.pid), "a half-restored process survived");

    std::fs::remove_file(&path).expect("remove the file");
    restore_and_check(&env, &v);
}
