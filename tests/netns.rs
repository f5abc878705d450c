//! A job in a network namespace of its own, moved into another one: its
//! TCP connections (over 127.0.0.1 and ::1, bytes queued both ways) go on
//! there, with `ckpt restore --netns PATH`; without it the restore refuses,
//! and a file that is not a network namespace is refused by name (victim:
//! tests/c/inet.c, which checks every byte of its streams itself).

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use crate::common::*;

fn net_inode(path: &str) -> u64 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .ino()
}

#[test]
fn tcp_connections_move_to_the_named_network_namespace() {
    let env = TestEnv::new("netns-move");
    let nodes = NetNodes::new("nsm", 2);
    let (from, to) = (&nodes.names[0], &nodes.names[1]);
    let mut v = Victim::spawn_in_netns(&env, "inet", &["tcp"], from);
    v.wait_ready();
    let from_ino = net_inode(&format!("/run/netns/{from}"));
    assert_eq!(net_inode(&format!("/proc/{}/ns/net", v.pid)), from_ino);
    dump_kill_reap(&env, &mut v);
    let show = show_json(&env);
    assert_eq!(
        show["namespaces"]["net"]["inode"].as_u64(),
        Some(from_ino),
        "the image names the namespace it was in"
    );

    // No namespace named: refused before anything is created.
    let err = restore_expect_error(&env);
    assert!(
        err.contains("network namespace of its own") && err.contains("--netns"),
        "{err}"
    );
    // A file that is not a network namespace.
    let out = spawn_restore(&env, &["--netns", "/etc/hostname"]).wait(Duration::from_secs(30));
    let err = out.assert_error();
    assert!(
        err.contains("--netns /etc/hostname") && err.contains("not a namespace"),
        "{err}"
    );
    let out = spawn_restore(
        &env,
        &["--netns", &format!("/proc/{}/ns/uts", std::process::id())],
    )
    .wait(Duration::from_secs(30));
    let err = out.assert_error();
    assert!(err.contains("not a network namespace"), "{err}");

    let to_path = format!("/run/netns/{to}");
    let mut restore = spawn_restore(&env, &["--netns", &to_path]);
    wait_restored_and_running(&v, &mut restore);
    assert_eq!(
        net_inode(&format!("/proc/{}/ns/net", v.pid)),
        net_inode(&to_path),
        "the restored tree lives in the named namespace"
    );
    v.go();
    finish_restore(&v, restore);
}
