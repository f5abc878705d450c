//! A process tree: root, two children and a grandchild come back with their
//! pids, parent links (the root reaps its children), memory, and one log
//! descriptor whose offset they still share (victim: tests/c/tree.c).

use crate::common::*;

fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let t = t.unwrap().file_name();
        let list =
            std::fs::read_to_string(format!("/proc/{pid}/task/{}/children", t.to_string_lossy()))
                .unwrap_or_default();
        out.extend(list.split_whitespace().map(|c| c.parse::<i32>().unwrap()));
    }
    out.sort_unstable();
    out
}

#[test]
fn tree_restored_with_links_and_shared_offset() {
    let env = TestEnv::new("tree");
    let mut v = Victim::spawn(&env, "tree", &[]);
    v.wait_ready();
    let kids = children(v.pid);
    assert_eq!(kids.len(), 2, "root should have 2 children: {kids:?}");
    let grandkids: Vec<Vec<i32>> = kids.iter().map(|k| children(*k)).collect();
    assert_eq!(
        grandkids.iter().map(Vec::len).sum::<usize>(),
        1,
        "one grandchild expected: {grandkids:?}"
    );

    let out = dump(&env, &v, &["--kill"]);
    assert!(out.stderr.contains("4 processes"), "{}", out.stderr);
    v.reap_killed(std::time::Duration::from_secs(10));

    // The children were orphaned by the kill; init reaps them in its own
    // time, and restore waits for their pids.
    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    assert_eq!(children(v.pid), kids, "children of the root changed");
    let after: Vec<Vec<i32>> = kids.iter().map(|k| children(*k)).collect();
    assert_eq!(after, grandkids, "grandchild links changed");
    v.go();
    finish_restore(&v, restore);
}

/// A root with eight leaves of 8 MiB each (above the size whose pages go
/// through a userfaultfd): the restore copies the leaves' pages while it
/// rebuilds the next ones, two at once, read directly from a disk; every
/// leaf then checks every word of its memory, raw and compressed alike.
#[test]
fn leaves_filled_beside_each_other_come_back_word_for_word() {
    let env = TestEnv::new("tree-leaves");
    let mut v = Victim::spawn(&env, "leaves", &["8", "8"]);
    v.wait_ready();
    assert_eq!(children(v.pid).len(), 8, "the root should have 8 children");
    let out = dump(&env, &v, &["--kill", "--compress=lz4"]);
    assert!(out.stderr.contains("9 processes"), "{}", out.stderr);
    v.reap_killed(std::time::Duration::from_secs(10));
    let restore = CkptCmd::spawn(&env, &["-vv", "restore", "--dir", path_str(&env.img)]);
    v.go();
    let out = finish_restore(&v, restore);
    if on_disk(&env.img) {
        let direct = out
            .stderr
            .matches("read directly, each block checked")
            .count();
        assert!(
            direct >= 8,
            "{direct} pages files read directly:\n{}",
            out.stderr
        );
    }
}

/// The root dies (killed here by the pre-resume action script) after the
/// tree is rebuilt, while its children are already let go: the restore
/// fails naming the root, and kills the children it had let go, so no
/// process of the tree is left running on its own.
#[test]
fn root_dying_as_the_tree_resumes_fails_the_restore_and_leaves_nothing() {
    let env = TestEnv::new("tree-root-dies");
    let mut v = Victim::spawn(&env, "tree", &[]);
    v.wait_ready();
    let kids = children(v.pid);
    let grandkids: Vec<i32> = kids.iter().flat_map(|k| children(*k)).collect();
    dump_kill_reap(&env, &mut v);
    let hook = env.root.join("hook.sh");
    write_executable(
        &hook,
        "#!/bin/sh\n[ \"$CKPT_SCRIPT_ACTION\" = pre-resume ] && kill -KILL \"$CKPT_PID\"\nexit 0\n",
    );
    // No go: a child let go waits for it, and stays unless killed.
    let out = spawn_restore(&env, &["--action-script", path_str(&hook)])
        .wait_with(FAIL_TIMEOUT, || v.diag());
    let err = out.assert_error();
    assert!(
        err.contains(&format!("pid {}", v.pid)),
        "error should name the root {}: {err}",
        v.pid
    );
    for pid in kids.iter().chain(&grandkids) {
        assert!(
            wait_until(std::time::Duration::from_secs(10), || victim_gone(
                *pid, &v.bin, &v.work
            )),
            "process {pid} of the tree left after the failed restore (state {:?})",
            proc_state(*pid)
        );
    }
}
