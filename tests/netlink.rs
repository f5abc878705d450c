//! Netlink sockets come back with their protocol, port id, multicast
//! groups, destination and options; queued messages are dropped (victim:
//! tests/c/netlink.c).

use std::time::Duration;

use crate::common::*;

fn netlink_objects(env: &TestEnv) -> Vec<String> {
    let json = show_json(env);
    fds_of_kind(&json, "netlink")
        .iter()
        .map(|f| f["object"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn netlink_sockets_come_back_with_port_ids_groups_and_destination() {
    let env = TestEnv::new("netlink-all");
    let mut v = Victim::spawn(&env, "netlink", &["all"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let objects = netlink_objects(&env);
    let pid = v.pid;
    for want in [
        format!("netlink route portid {pid} groups 1,5,33"),
        "netlink sock_diag".to_string(),
        "netlink kobject_uevent portid".to_string(),
    ] {
        assert!(
            objects.iter().any(|o| o.starts_with(&want)),
            "{want}: {objects:?}"
        );
    }
    assert!(
        objects
            .iter()
            .any(|o| o.contains(&format!("-> portid {pid}"))),
        "the connected socket's destination: {objects:?}"
    );
    let log = read_to_string_lossy(&env.img.join("dump.log"));
    assert!(
        log.contains("dropping") && log.contains("queued messages"),
        "the dump says it drops the queued message:\n{log}"
    );
    restore_and_check(&env, &v);
    assert_eq!(read_to_string_lossy(&v.path("nl-queued")), "dropped");
}

/// The restorer holds CAP_NET_ADMIN; a process that had dropped it gets
/// no group back that only CAP_NET_ADMIN may join: refused in one line.
#[test]
fn netlink_group_needing_cap_net_admin_is_not_given_back_without_it() {
    let env = TestEnv::new("netlink-admin");
    let mut v = Victim::spawn(&env, "netlink", &["admin"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let out = spawn_restore(&env, &[]).wait(Duration::from_secs(30));
    let line = out.assert_error();
    assert!(
        line.contains(&format!("pid {}", v.pid))
            && line.contains("fd ")
            && line.contains("netlink sock_diag socket in multicast groups 1")
            && line.contains("CAP_NET_ADMIN"),
        "{line}"
    );
    assert!(!pid_exists(v.pid), "nothing of the refused restore runs");
}

/// A socket in the middle of a dump (the kernel holds the rest of its
/// answer) is refused by name, and the process goes on and reads it all.
#[test]
fn netlink_socket_with_a_dump_in_progress_is_refused_by_name() {
    let env = TestEnv::new("netlink-dumping");
    let mut v = Victim::spawn(&env, "netlink", &["dumping"]);
    v.wait_ready();
    let out = dump_outcome(&env, &v, &["--kill"]);
    out.assert_error();
    let what =
        "dump in progress (the kernel holds the rest of its answer) on a route netlink socket";
    assert!(
        out.stderr
            .lines()
            .any(|l| l.contains(&format!("pid {}", v.pid))
                && l.contains("fd ")
                && l.contains(what)),
        "no line for {what}:\n{}",
        out.stderr
    );
    assert!(!env.img.exists(), "a refused dump leaves no checkpoint");
    v.assert_unharmed_and_passes("after a refused dump");
}
