//! A process of an ordinary user, dumped and restored by root, comes back
//! as that user and nothing more: the same uids and gids, no supplementary
//! groups it did not have, no capabilities (victim: tests/c/counter.c).

use crate::common::*;

fn status_line(pid: i32, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("read status")
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)
                .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
        })
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

#[test]
fn restored_process_keeps_its_user_and_no_more() {
    let user = test_user();
    let env = TestEnv::new("users");
    let mut v = Victim::spawn_as(&env, "counter", &[], user);
    v.wait_ready();
    let id = format!("{0} {0} {0} {0}", user.uid);
    assert_eq!(
        status_line(v.pid, "Uid:"),
        id,
        "victim not running as the test user"
    );
    let before: Vec<String> = ["Uid:", "Gid:", "Groups:", "CapEff:", "CapPrm:", "CapBnd:"]
        .iter()
        .map(|k| status_line(v.pid, k))
        .collect();
    dump_kill_reap(&env, &mut v);

    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    let after: Vec<String> = ["Uid:", "Gid:", "Groups:", "CapEff:", "CapPrm:", "CapBnd:"]
        .iter()
        .map(|k| status_line(v.pid, k))
        .collect();
    assert_eq!(after, before, "credentials changed across restore");
    v.go();
    finish_restore(&v, restore);
}
