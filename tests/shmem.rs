//! Shared memory objects stay one object after restore, saved once: shared
//! anonymous memory across fork (tests/c/shmem.c), and a parent and child
//! mapping shared anonymous memory with its middle unmapped, /dev/zero, a
//! memfd mapped twice at different offsets and privately, and a deleted
//! file mapped shared and private, a POSIX shm object in /dev/shm shared by
//! both and removed (or kept) before the restore (tests/c/shmobj.c).

use crate::common::*;

#[test]
fn shared_anonymous_memory_stays_shared() {
    standard_cycle("shmem", "shmem", &[]);
}

/// Dumps the `shmobj` victim in `mode`, checks the image holds exactly one
/// object of `kind` (its data once, however many VMAs of both processes
/// map it), restores and requires the victim to pass. Returns the show.
fn one_object_cycle(test: &str, args: &[&str], kind: &str) -> serde_json::Value {
    one_object_cycle_with(test, args, kind, None, |_| {})
}

/// [`one_object_cycle`] with the victim run as `user` (root if `None`) and
/// `between` run after the dump, before the restore.
fn one_object_cycle_with(
    test: &str,
    args: &[&str],
    kind: &str,
    user: Option<&TestUser>,
    between: impl FnOnce(&serde_json::Value),
) -> serde_json::Value {
    let env = TestEnv::new(test);
    let mut v = match user {
        Some(u) => {
            env.give_work_to(u);
            Victim::spawn_as(&env, "shmobj", args, u)
        }
        None => Victim::spawn(&env, "shmobj", args),
    };
    v.wait_ready();
    dump_kill_reap(&env, &mut v);
    let show = show_json(&env);
    let objects = show["shmem"].as_array().expect("shmem objects");
    assert_eq!(objects.len(), 1, "one object, saved once: {objects:?}");
    let o = &objects[0];
    assert_eq!(o["kind"], kind);
    let id = o["id"].as_u64().unwrap();
    let size = o["size"].as_u64().unwrap();
    let data = o["data_bytes"].as_u64().unwrap();
    assert!(data > 0 && data <= size, "{o}");
    // One data file, holding the data once.
    let name = format!("shmem-{id}.img");
    let files = show["files"].as_array().unwrap();
    let data_files: Vec<_> = files
        .iter()
        .filter(|f| f["name"].as_str().unwrap().starts_with("shmem-"))
        .collect();
    assert_eq!(data_files.len(), 1, "{data_files:?}");
    assert_eq!(data_files[0]["name"], name.as_str());
    assert_eq!(data_files[0]["size"].as_u64(), Some(data));
    // Every shared VMA of both processes refers to it and saves nothing.
    let procs = show["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 2);
    for p in procs {
        let shared: Vec<_> = p["vmas"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["kind"] == "Shmem")
            .collect();
        assert!(!shared.is_empty(), "pid {}: no shared VMA", p["pid"]);
        for m in shared {
            assert_eq!(m["shmem_id"].as_u64(), Some(id), "{m}");
            assert_eq!(m["saved_bytes"].as_u64(), Some(0), "{m}");
        }
    }
    between(&show);
    restore_and_check(&env, &v);
    show
}

/// The VMAs of kind Shmem of the first process, as (file offset, length).
fn shared_views(show: &serde_json::Value) -> Vec<(u64, u64)> {
    let hex = |s: &serde_json::Value| u64::from_str_radix(&s.as_str().unwrap()[2..], 16).unwrap();
    show["processes"][0]["vmas"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["kind"] == "Shmem")
        .map(|m| {
            (
                m["file_offset"].as_u64().unwrap(),
                hex(&m["end"]) - hex(&m["start"]),
            )
        })
        .collect()
}

#[test]
fn partly_unmapped_shared_anonymous_memory_stays_one_object() {
    let show = one_object_cycle("shmem-partial", &["partial"], "Anon");
    let mut views = shared_views(&show);
    views.sort_unstable();
    assert_eq!(views, [(0, 4 * 4096), (8 * 4096, 8 * 4096)]);
    assert_eq!(show["shmem"][0]["size"].as_u64(), Some(16 * 4096));
}

#[test]
fn dev_zero_shared_and_private_mappings() {
    one_object_cycle("shmem-devzero", &["devzero"], "Anon");
}

#[test]
fn memfd_mapped_twice_and_privately() {
    let show = one_object_cycle("shmem-memfd", &["memfd"], "Memfd");
    assert_eq!(show["shmem"][0]["name"], "ckpt test memfd");
    assert_eq!(show["shmem"][0]["size"].as_u64(), Some(8 * 4096 + 100));
    let mut views = shared_views(&show);
    views.sort_unstable();
    assert_eq!(views, [(0, 9 * 4096), (4 * 4096, 2 * 4096)]);
}

#[test]
fn deleted_file_mapped_shared_and_private() {
    let show = one_object_cycle("shmem-deleted", &["deleted"], "DeletedFile");
    assert!(
        show["shmem"][0]["name"]
            .as_str()
            .unwrap()
            .ends_with("/deleted.bin"),
        "{}",
        show["shmem"][0]
    );
}

/// A POSIX shm name of this test run, removed when dropped.
struct ShmName(String);

impl ShmName {
    fn new(tag: &str) -> ShmName {
        ShmName(format!("/ckpt-test-{}-{tag}", std::process::id()))
    }

    fn path(&self) -> std::path::PathBuf {
        std::path::Path::new("/dev/shm").join(&self.0[1..])
    }
}

impl Drop for ShmName {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.path());
    }
}

#[test]
fn posix_shm_recreated_when_gone() {
    use std::os::unix::fs::MetadataExt;
    let user = test_user();
    let name = ShmName::new("gone");
    let path = name.path();
    one_object_cycle_with(
        "shmem-posix-gone",
        &["posix", &name.0],
        "TmpfsFile",
        Some(user),
        |show| {
            assert_eq!(show["shmem"][0]["name"], path.to_str().unwrap());
            // As after a reboot or on another node: only the image has it.
            std::fs::remove_file(&path).unwrap();
        },
    );
    let m = std::fs::metadata(&path).expect("recreated");
    assert_eq!((m.uid(), m.gid()), (user.uid, user.gid));
    assert_eq!(m.mode() & 0o7777, 0o640);
    assert_eq!(m.len(), 5 * 4096 + 300);
}

#[test]
fn posix_shm_kept_gets_the_checkpoint_contents() {
    use std::os::unix::fs::FileExt;
    let name = ShmName::new("kept");
    let path = name.path();
    one_object_cycle_with(
        "shmem-posix-kept",
        &["posix", &name.0],
        "TmpfsFile",
        None,
        |_| {
            // Changed after the checkpoint: the image's state wins.
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            f.write_all_at(b"changed after the checkpoint", 2 * 4096)
                .unwrap();
        },
    );
}

/// A deleted file held by an fd and mapped shared (what UCX's
/// shared-memory transport keeps): the fd comes back as the memfd the
/// mapping's object becomes, so writes through either show in the other
/// and the fd's offset is kept (checked from inside).
#[test]
fn deleted_file_held_by_an_fd_and_mapped_shared_stays_one_file() {
    let env = TestEnv::new("shmem-deleted-fd");
    let mut v = Victim::spawn(&env, "shmobj", &["deleted", "fd"]);
    v.wait_ready();
    dump(&env, &v, &["--kill"]);
    v.reap_killed(std::time::Duration::from_secs(10));
    restore_and_check(&env, &v);
}
