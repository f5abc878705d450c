//! Private memory a forked tree still shares copy-on-write is saved once
//! and stays one copy after restore (victim: tests/c/cow.c: 256 MiB shared
//! by a root, three children and a grandchild, each with a few changes of
//! its own), private anonymous memory or the written pages of a private
//! file mapping.

use std::fs;

use crate::common::*;

const REGION: u64 = 256 << 20;

/// The process and all its descendants.
fn tree_of(root: i32) -> Vec<i32> {
    let mut all = vec![root];
    let mut i = 0;
    while i < all.len() {
        let pid = all[i];
        let kids =
            fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        all.extend(
            kids.split_whitespace()
                .filter_map(|k| k.parse::<i32>().ok()),
        );
        i += 1;
    }
    all
}

/// Memory the tree really uses: the sum of its processes' proportional set
/// sizes (a page shared by n processes counts 1/n in each).
fn tree_pss(root: i32) -> u64 {
    tree_of(root)
        .iter()
        .map(|pid| {
            let rollup =
                fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
            rollup
                .lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .unwrap_or(0)
                * 1024
        })
        .sum()
}

#[test]
fn forked_tree_keeps_sharing_its_private_memory() {
    cow_cycle("cow", &[]);
}

#[test]
fn forked_tree_keeps_sharing_its_private_file_mapping() {
    cow_cycle("cow-file", &["file"]);
}

fn cow_cycle(test: &str, args: &[&str]) {
    let env = TestEnv::new(test);
    let mut v = Victim::spawn(&env, "cow", args);
    v.wait_ready();
    assert_eq!(
        tree_of(v.pid).len(),
        5,
        "root, three children, a grandchild"
    );
    let before = tree_pss(v.pid);
    dump_kill_reap(&env, &mut v);

    let pages_on_disk: u64 = fs::read_dir(&env.img)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("pages-"))
        .map(|e| e.metadata().unwrap().len())
        .sum();
    assert!(
        pages_on_disk < REGION * 5 / 4,
        "the shared region is saved once: {pages_on_disk} bytes of pages for a {REGION}-byte region in 5 processes"
    );

    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    assert_eq!(tree_of(v.pid).len(), 5, "the whole tree is back");
    let after = tree_pss(v.pid);
    assert!(
        after < REGION * 5 / 4 && after < before + (32 << 20),
        "the restored tree uses {after} bytes (before the dump: {before}); \
         the region must stay one shared copy, not one per process"
    );
    v.go();
    finish_restore(&v, restore);
}
