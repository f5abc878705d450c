//! A memfd held by an fd and mapped by a parent and its forked child
//! (shared twice at different offsets and once private): after restore its
//! name, size, contents, offset, FD_CLOEXEC and seals (F_SEAL_SHRINK |
//! F_SEAL_GROW, enforced) are back, both processes see each other's writes,
//! and the image holds its contents once, for the fd and every mapping
//! (victim: tests/c/shmobj.c in mode `memfd fd`).

mod common;

use common::*;

/// F_SEAL_SHRINK | F_SEAL_GROW.
const SEALS: u64 = 0x2 | 0x4;

#[test]
fn memfd_fd_and_mappings_are_one_object() {
    let env = TestEnv::new("memfd");
    let mut v = Victim::spawn(&env, "shmobj", &["memfd", "fd"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let show = show_json(&env);
    let objects = show["shmem"].as_array().expect("shmem objects");
    assert_eq!(objects.len(), 1, "{objects:?}");
    let o = &objects[0];
    assert_eq!(o["kind"], "Memfd");
    assert_eq!(o["name"], "ckpt test memfd");
    assert_eq!(o["size"].as_u64(), Some(8 * 4096 + 100));
    assert_eq!(o["seals"].as_u64(), Some(SEALS));
    let id = o["id"].as_u64().unwrap();
    // The fd of parent and child: one description, at offset 1234.
    let fds = fds_of_kind(&show, "memfd");
    assert_eq!(fds.len(), 2, "{fds:?}");
    assert_eq!(file_ids(&fds).len(), 1);
    for f in &fds {
        assert_eq!(f["pos"].as_i64(), Some(1234));
        assert_eq!(f["cloexec"].as_bool(), Some(true));
        assert!(
            f["object"]
                .as_str()
                .unwrap()
                .contains(&format!("shared memory object {id}")),
            "{f}"
        );
    }
    // Its contents once: one data file, no pages for the shared mappings.
    let data_files: Vec<_> = show["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["name"].as_str().unwrap().starts_with("shmem-"))
        .collect();
    assert_eq!(data_files.len(), 1);
    assert_eq!(data_files[0]["size"], o["data_bytes"]);
    for p in show["processes"].as_array().unwrap() {
        for m in p["vmas"].as_array().unwrap() {
            if m["kind"] == "Shmem" || m["kind"] == "ShmemPrivate" {
                assert_eq!(m["shmem_id"].as_u64(), Some(id), "{m}");
            }
            if m["kind"] == "Shmem" {
                assert_eq!(m["saved_bytes"].as_u64(), Some(0), "{m}");
            }
        }
    }
    restore_and_check(&env, &v);
}
