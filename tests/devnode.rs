//! An open file of a device node unlinked while open (victim:
//! tests/c/devnode.c): a node of the same device number is made again by
//! ckpt (mknod is root's), opened and unlinked, so the process finds its
//! fd as it was; for a user who could not have opened the node (its mode
//! changed to root's only since), restore refuses in one line naming pid,
//! fd and the node, as it does for a node replaced by another device.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use crate::common::*;

/// The victim's fd of the node.
const FD_NODE: i32 = 40;

#[test]
fn unlinked_device_node_comes_back_as_the_same_device() {
    standard_cycle("devnode", "devnode", &[]);
}

#[test]
fn unlinked_device_node_a_user_could_not_open_is_refused() {
    let env = TestEnv::new("devnode-user");
    let node = env.work.join("null-node");
    let made = std::process::Command::new("mknod")
        .args(["-m", "0666", path_str(&node), "c", "1", "3"])
        .status()
        .expect("run mknod");
    assert!(made.success(), "mknod {}", node.display());
    let mut v = Victim::spawn_as(&env, "devnode", &["user"], test_user());
    v.wait_ready();
    // Root's only now (spawning gave the work directory to the user), and
    // gone: the user could not open it again.
    std::os::unix::fs::chown(&node, Some(0), Some(0)).expect("chown node");
    fs::set_permissions(&node, fs::Permissions::from_mode(0o600)).expect("chmod node");
    fs::remove_file(&node).expect("unlink node");
    dump_kill_reap(&env, &mut v);
    let line = restore_expect_error(&env);
    for want in [
        format!("pid {}", v.pid),
        format!("fd {FD_NODE}"),
        "null-node".to_string(),
        "could not have opened".to_string(),
    ] {
        assert!(
            line.contains(&want),
            "error line should name {want:?}: {line}"
        );
    }
    assert!(
        !env.work.join("null-node").exists(),
        "the refused restore left a node behind"
    );
}

#[test]
fn device_node_replaced_by_another_device_is_refused() {
    let env = TestEnv::new("devnode-kept");
    let mut v = Victim::spawn(&env, "devnode", &["kept"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    // The zero device where the null device was.
    let node = env.work.join("null-node");
    fs::remove_file(&node).expect("unlink node");
    let made = std::process::Command::new("mknod")
        .args(["-m", "0640", path_str(&node), "c", "1", "5"])
        .status()
        .expect("run mknod");
    assert!(made.success(), "mknod {}", node.display());
    let line = restore_expect_error(&env);
    for want in [
        format!("pid {}", v.pid),
        format!("fd {FD_NODE}"),
        "null-node".to_string(),
        "no longer the character device 1:3".to_string(),
    ] {
        assert!(
            line.contains(&want),
            "error line should name {want:?}: {line}"
        );
    }
}
