//! A memfd held by an fd and mapped by a parent and its forked child
//! (shared twice at different offsets and once private): after restore its
//! name, size, contents, offset, FD_CLOEXEC and seals (F_SEAL_SHRINK |
//! F_SEAL_GROW, enforced) are back, both processes see each other's writes,
//! and the image holds its contents once, for the fd and every mapping; a
//! memfd made without MFD_ALLOW_SEALING stays unsealable (victim:
//! tests/c/shmobj.c in mode `memfd fd`).

use crate::common::*;

/// F_SEAL_SHRINK | F_SEAL_GROW.
const SEALS: u64 = 0x2 | 0x4;
/// F_SEAL_SEAL.
const F_SEAL_SEAL: u64 = 0x1;

#[test]
fn memfd_fd_and_mappings_are_one_object() {
    let env = TestEnv::new("memfd");
    let mut v = Victim::spawn(&env, "shmobj", &["memfd", "fd"]);
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let show = show_json(&env);
    let objects = show["shmem"].as_array().expect("shmem objects");
    assert_eq!(objects.len(), 2, "{objects:?}");
    let named = |name: &str| {
        objects
            .iter()
            .find(|o| o["name"] == name)
            .unwrap_or_else(|| panic!("no object {name}: {objects:?}"))
    };
    // Made without MFD_ALLOW_SEALING: F_SEAL_SEAL, re-added on restore.
    let unsealable = named("ckpt unsealable");
    assert_eq!(unsealable["seals"].as_u64(), Some(F_SEAL_SEAL));
    assert_eq!(unsealable["size"].as_u64(), Some(5));
    let o = named("ckpt test memfd");
    assert_eq!(o["kind"], "Memfd");
    assert_eq!(o["size"].as_u64(), Some(8 * 4096 + 100));
    assert_eq!(o["seals"].as_u64(), Some(SEALS));
    let id = o["id"].as_u64().unwrap();
    // The fd of parent and child: one description, at offset 1234.
    let fds: Vec<_> = fds_of_kind(&show, "memfd")
        .into_iter()
        .filter(|f| {
            f["object"]
                .as_str()
                .unwrap()
                .ends_with(&format!("object {id}"))
        })
        .collect();
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
        .filter(|f| f["name"] == format!("shmem-{id}.img").as_str())
        .collect();
    assert_eq!(data_files.len(), 1);
    assert_eq!(data_files[0]["size"], o["data_bytes"]);
    let all_data: usize = show["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["name"].as_str().unwrap().starts_with("shmem-"))
        .count();
    assert_eq!(all_data, 2, "one data file per object");
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

/// Memfds sealed against writes (F_SEAL_WRITE with a read-only mapping,
/// F_SEAL_FUTURE_WRITE after a writable one), a memfd mapped twice after
/// its fd was closed, and /dev/zero mapped shared with its fd kept: each
/// comes back as it was (victim: tests/c/memfd_edge.c checks from inside).
#[test]
fn sealed_and_closed_memfds_and_dev_zero_come_back() {
    standard_cycle("memfd-edge", "memfd_edge", &[]);
}
