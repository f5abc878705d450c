//! Raw IPv4/IPv6 sockets and packet sockets come back with their
//! protocols, addresses, interfaces and options; packet sockets with a
//! ring or in a fanout group are refused by name (victim:
//! tests/c/rawsock.c).

use crate::common::*;

fn objects_of(env: &TestEnv, kind: &str) -> Vec<String> {
    let json = show_json(env);
    fds_of_kind(&json, kind)
        .iter()
        .map(|f| f["object"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn raw_and_packet_sockets_come_back() {
    let env = TestEnv::new("rawsock-all");
    let mut v = Victim::spawn(&env, "rawsock", &["all"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let inet = objects_of(&env, "inet");
    for want in [
        "raw4 bound protocol 253 127.0.0.1:",
        "raw4 connected protocol 253",
        "raw6 bound protocol 253 [::1]:",
        "raw4 unbound protocol 255",
        "raw4 unbound protocol 1",
    ] {
        assert!(inet.iter().any(|o| o.starts_with(want)), "{want}: {inet:?}");
    }
    let packet = objects_of(&env, "packet");
    assert!(
        packet
            .iter()
            .any(|o| o.starts_with("packet dgram protocol 0x0800 interface 1")),
        "{packet:?}"
    );
    assert!(
        packet.iter().any(|o| o == "packet raw protocol 0x0000"),
        "{packet:?}"
    );
    restore_and_check(&env, &v);
}

#[test]
fn packet_sockets_with_a_ring_or_fanout_are_refused_by_name() {
    let env = TestEnv::new("rawsock-ring");
    let mut v = Victim::spawn(&env, "rawsock", &["ring"]);
    v.wait_ready();
    let out = dump_outcome(&env, &v, &["--kill"]);
    out.assert_error();
    for what in [
        "packet socket with a ring (PACKET_RX_RING or PACKET_TX_RING)",
        "packet socket in a fanout group (PACKET_FANOUT)",
    ] {
        assert!(
            out.stderr
                .lines()
                .any(|l| l.contains(&format!("pid {}", v.pid))
                    && l.contains("fd ")
                    && l.contains(what)),
            "no line for {what}:\n{}",
            out.stderr
        );
    }
    assert!(!env.img.exists(), "a refused dump leaves no checkpoint");
    v.assert_unharmed_and_passes("after a refused dump");
}

/// A restore for a user through the service does not make a raw socket
/// for a process that could not have made one (it kept it from before it
/// dropped to the user): refused in one line naming pid, fd and why.
#[test]
fn raw_socket_is_not_made_for_a_user_whose_process_lacked_cap_net_raw() {
    let user = test_user();
    let env = TestEnv::new("rawsock-user");
    env.give_work_to(user);
    let svc = Service::start(&env);
    let (uid, gid) = (user.uid.to_string(), user.gid.to_string());
    let mut v = Victim::spawn(&env, "rawsock", &["user", &uid, &gid]);
    v.wait_ready();
    // Its output files too, made as root before it became the user.
    env.give_work_to(user);
    let home = user_dir(&env, user, "home");
    let pid = v.pid.to_string();
    ckpt_as_user(
        &env,
        user,
        &svc.socket,
        &home,
        &["dump", "--tree", &pid, "--dir", "img", "--kill"],
    )
    .assert_success();
    v.reap_killed(std::time::Duration::from_secs(10));
    let out = ckpt_as_user(&env, user, &svc.socket, &home, &["restore", "--dir", "img"]);
    let line = out.assert_error();
    assert!(
        line.contains(&format!("pid {pid}"))
            && line.contains("fd ")
            && line.contains("raw IPv4 socket (protocol 253)")
            && line.contains("CAP_NET_RAW"),
        "{line}"
    );
    assert!(!pid_exists(v.pid), "nothing of the refused restore runs");
}
