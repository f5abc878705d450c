//! SysV IPC (victim: tests/c/sysv.c): a keyed shared memory segment shared
//! by a parent and its child, a segment marked for removal but attached, a
//! semaphore set and a message queue come back with their ids, contents,
//! values and messages; the segment is saved once and restored as one
//! copy in the segment, none in the processes' private memory. A key
//! already in use at restore fails in one line, leaving nothing behind.

use std::fs;
use std::path::Path;

use crate::common::*;

const MIB: u64 = 1 << 20;
/// The shared segment of the main test.
const BIG_MIB: u64 = 256;

/// The ids the victim published: shmid, semid, msqid, the removed
/// segment's shmid and the child's pid.
struct Ids {
    shm: i32,
    sem: i32,
    msg: i32,
    removed_shm: i32,
    child: i32,
    /// The removed segment is SHM_LOCKed too (where RLIMIT_MEMLOCK let the
    /// victim).
    locked: bool,
}

fn read_ids(v: &Victim) -> Ids {
    let text = fs::read_to_string(v.path("ids")).expect("victim wrote its ids");
    let n: Vec<i32> = text
        .split_whitespace()
        .map(|w| w.parse().expect("a number"))
        .collect();
    Ids {
        shm: n[0],
        sem: n[1],
        msg: n[2],
        removed_shm: n[3],
        child: n[4],
        locked: n[5] != 0,
    }
}

/// Held by every test of this file: the jobs all run as the test user, so
/// one test's object used by root (`set_used_last_by_another_user_…`)
/// rightly refuses the dump of another test's job meanwhile.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A key no other run of this test uses at the same time.
fn unique_key(salt: u32) -> u32 {
    0x5c00_0000 | ((std::process::id() & 0xffff) << 8) | salt
}

/// Removes every object of `key` (none for 0) and the ids given when
/// dropped, so a failing test leaves no IPC object behind.
struct IpcCleanup {
    key: u32,
    ids: Vec<(&'static str, i32)>,
}

impl Drop for IpcCleanup {
    fn drop(&mut self) {
        let key = format!("{:#x}", self.key);
        let by_key: &[&str] = if self.key == 0 {
            &[]
        } else {
            &["-M", "-S", "-Q"]
        };
        for flag in by_key {
            let _ = std::process::Command::new("ipcrm")
                .args([*flag, &key])
                .stderr(std::process::Stdio::null())
                .status();
        }
        for (flag, id) in &self.ids {
            let _ = std::process::Command::new("ipcrm")
                .args([*flag, &id.to_string()])
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// A small job of the test user (the sysv victim with a 4 MiB segment of
/// key `key`), dumped with --kill and reaped.
struct DumpedJob {
    /// Declared first, so dropped first: the processes go before their
    /// objects are removed.
    v: Victim,
    ids: Ids,
    /// Removes the job's objects, and its segment marked for removal, when
    /// the test ends.
    cleanup: IpcCleanup,
}

fn dump_small_job(env: &TestEnv, key: u32) -> DumpedJob {
    let mut cleanup = IpcCleanup {
        key,
        ids: Vec::new(),
    };
    let mut v = Victim::spawn_as(env, "sysv", &[&format!("{key:x}"), "4"], test_user());
    v.wait_ready();
    let ids = read_ids(&v);
    cleanup.ids.push(("-m", ids.removed_shm));
    dump_kill_reap(env, &mut v);
    DumpedJob { v, ids, cleanup }
}

/// The row of `/proc/sysvipc/NAME` with id `id` (second column), as
/// column name -> value.
fn sysvipc_row(name: &str, id: i32) -> Option<Vec<(String, String)>> {
    let text = fs::read_to_string(format!("/proc/sysvipc/{name}")).expect("read /proc/sysvipc");
    let mut lines = text.lines();
    let header: Vec<String> = lines.next()?.split_whitespace().map(String::from).collect();
    lines
        .map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
        .find(|row| row.get(1).and_then(|s| s.parse::<i32>().ok()) == Some(id))
        .map(|row| header.into_iter().zip(row).collect())
}

fn column(row: &[(String, String)], name: &str) -> u64 {
    row.iter()
        .find(|(h, _)| h == name)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {row:?}"))
}

/// Private memory of a process (anonymous pages: what a copy of the
/// segment in the process would show as), from smaps_rollup, in bytes.
fn private_bytes(pid: i32) -> u64 {
    let text = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).expect("smaps_rollup");
    text.lines()
        .filter_map(|l| l.strip_prefix("Anonymous:"))
        .map(|v| v.trim().trim_end_matches(" kB").parse::<u64>().unwrap_or(0) * 1024)
        .sum()
}

fn meminfo_shmem() -> u64 {
    let text = fs::read_to_string("/proc/meminfo").expect("meminfo");
    text.lines()
        .find_map(|l| l.strip_prefix("Shmem:"))
        .map(|v| v.trim().trim_end_matches(" kB").parse::<u64>().unwrap_or(0) * 1024)
        .expect("Shmem in meminfo")
}

fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .expect("image dir")
        .map(|e| e.expect("entry").metadata().expect("metadata").len())
        .sum()
}

#[test]
fn sysv_objects_come_back_with_ids_contents_and_one_copy() {
    let _serial = one_at_a_time();
    let env = TestEnv::new("sysv");
    let key = unique_key(1);
    let mut cleanup = IpcCleanup {
        key,
        ids: Vec::new(),
    };
    let mut v = Victim::spawn_as(
        &env,
        "sysv",
        &[&format!("{key:x}"), &BIG_MIB.to_string()],
        test_user(),
    );
    v.wait_ready();
    let ids = read_ids(&v);
    cleanup.ids.push(("-m", ids.removed_shm));

    // A set and a queue of the same user that no process of the tree uses
    // (another job's): not saved, and not removed by --kill.
    let ipcmk = |args: &[&str]| -> i32 {
        use std::os::unix::process::CommandExt;
        let out = std::process::Command::new("ipcmk")
            .args(args)
            .uid(test_user().uid)
            .gid(test_user().gid)
            .output()
            .expect("run ipcmk");
        assert!(out.status.success(), "ipcmk {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout)
            .rsplit(' ')
            .next()
            .and_then(|id| id.trim().parse().ok())
            .unwrap_or_else(|| panic!("ipcmk {args:?} said {out:?}"))
    };
    let other_sem = ipcmk(&["-S", "1"]);
    let other_msg = ipcmk(&["-Q"]);
    let other = IpcCleanup {
        key: 0,
        ids: vec![("-s", other_sem), ("-q", other_msg)],
    };

    dump_kill_reap(&env, &mut v);
    assert!(
        sysvipc_row("sem", other_sem).is_some() && sysvipc_row("msg", other_msg).is_some(),
        "--kill removed objects that were not the job's"
    );
    drop(other);
    // One copy of the segment, however many processes attach it.
    let seg_image = fs::metadata(env.img.join(format!("ipc-shm-{}.img", ids.shm)))
        .expect("the segment's image")
        .len();
    assert_eq!(
        seg_image,
        BIG_MIB * MIB,
        "every page of the segment was written"
    );
    let total = dir_bytes(&env.img);
    assert!(
        total < BIG_MIB * MIB * 3 / 2,
        "images hold {total} bytes: more than one copy of the segment"
    );
    let show = show_json(&env);
    let ipc = &show["ipc"];
    let segment = |id: i32| {
        ipc["shm"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["id"] == id))
            .unwrap_or_else(|| panic!("segment {id} in {ipc}"))
    };
    assert_eq!(ipc["shm"].as_array().map(Vec::len), Some(2), "{ipc}");
    assert_eq!(segment(ids.shm)["key"], key as i32, "{ipc}");
    assert_eq!(segment(ids.shm)["removed"], false, "{ipc}");
    assert_eq!(segment(ids.removed_shm)["removed"], true, "{ipc}");
    assert_eq!(segment(ids.removed_shm)["key"], 0, "{ipc}");
    assert_eq!(segment(ids.removed_shm)["locked"], ids.locked, "{ipc}");
    assert_eq!(segment(ids.shm)["locked"], false, "{ipc}");
    assert_eq!(ipc["sem"][0]["id"], ids.sem, "{ipc}");
    assert_eq!(
        ipc["sem"][0]["values"],
        serde_json::json!([5, 0, 1234]),
        "{ipc}"
    );
    assert_eq!(ipc["msg"][0]["id"], ids.msg, "{ipc}");
    assert_eq!(ipc["msg"][0]["messages"], 4, "{ipc}");
    assert_eq!(ipc["sem"].as_array().map(Vec::len), Some(1), "{ipc}");
    assert_eq!(ipc["msg"].as_array().map(Vec::len), Some(1), "{ipc}");
    let text = ckpt(&env, &["show", path_str(&env.img)], FAIL_TIMEOUT);
    text.assert_success();
    for line in [
        format!(
            "shared memory id {} key {key:#x} owner {}:{} mode 0o640: {} bytes, {} saved",
            ids.shm,
            test_user().uid,
            test_user().gid,
            BIG_MIB * MIB,
            BIG_MIB * MIB
        ),
        format!("semaphores id {} key {key:#x}", ids.sem),
        format!("SysV shmid {}", ids.shm),
        "marked for removal".to_string(),
    ] {
        assert!(
            text.stdout.contains(&line),
            "ckpt show lacks {line:?}:\n{}",
            text.stdout
        );
    }
    // --kill ends the job, its IPC objects included (they are saved).
    assert!(
        sysvipc_row("shm", ids.shm).is_none(),
        "segment left after --kill"
    );
    assert!(
        sysvipc_row("sem", ids.sem).is_none(),
        "semaphores left after --kill"
    );
    assert!(
        sysvipc_row("msg", ids.msg).is_none(),
        "queue left after --kill"
    );

    let shmem_before = meminfo_shmem();
    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    let shmem_after = meminfo_shmem();
    let private: u64 = [v.pid, ids.child].iter().map(|p| private_bytes(*p)).sum();
    assert!(
        private < 32 * MIB,
        "the restored processes hold {private} bytes of private memory: the segment was copied into them"
    );
    let row = sysvipc_row("shm", ids.shm).expect("segment restored");
    let rss = column(&row, "rss");
    assert_eq!(rss, BIG_MIB * MIB, "the segment holds its pages once");
    assert_eq!(
        column(&row, "nattch"),
        2,
        "both processes attach the segment"
    );
    let grown = shmem_after.saturating_sub(shmem_before);
    assert!(
        grown < BIG_MIB * MIB * 3 / 2,
        "Shmem grew by {grown} bytes: more than one copy of the segment"
    );
    v.go();
    finish_restore(&v, restore);
}

#[test]
fn key_in_use_at_restore_fails_in_one_line_leaving_nothing() {
    let _serial = one_at_a_time();
    let env = TestEnv::new("sysv-collision");
    let key = unique_key(2);
    let mut job = dump_small_job(&env, key);

    // Someone else's segment with the job's key appears meanwhile.
    // SAFETY: integers only.
    let other = unsafe { libc::shmget(key as i32, 4096, libc::IPC_CREAT | libc::IPC_EXCL | 0o600) };
    assert!(other >= 0, "shmget: {}", std::io::Error::last_os_error());
    job.cleanup.ids.push(("-m", other));

    let out = restore_outcome(&env);
    let err = out.assert_error();
    assert!(
        err.contains(&format!(
            "SysV shared memory segment id {} (key {key:#x})",
            job.ids.shm
        )) && err.contains(&format!("id {other}")),
        "the error names the object and the holder: {err}"
    );
    assert_eq!(
        out.stderr
            .lines()
            .filter(|l| l.starts_with("ckpt: error:"))
            .count(),
        1,
        "{}",
        out.stderr
    );
    assert!(
        !pid_exists(job.v.pid) && !pid_exists(job.ids.child),
        "no process is left behind"
    );
    assert!(
        sysvipc_row("sem", job.ids.sem).is_none(),
        "no semaphore set was created"
    );
    assert!(
        sysvipc_row("msg", job.ids.msg).is_none(),
        "no queue was created"
    );
}

#[test]
fn segment_of_another_user_is_refused_at_dump() {
    let _serial = one_at_a_time();
    let env = TestEnv::new("sysv-foreign");
    let key = unique_key(3);
    // Root's segment, open to everyone: the job may use it, but a restore
    // must not create a root-owned object from the job's image.
    // SAFETY: integers only.
    let foreign = unsafe { libc::shmget(libc::IPC_PRIVATE, 4096, libc::IPC_CREAT | 0o666) };
    assert!(foreign >= 0, "shmget: {}", std::io::Error::last_os_error());
    let mut cleanup = IpcCleanup {
        key,
        ids: vec![("-m", foreign)],
    };
    let mut v = Victim::spawn_as(
        &env,
        "sysv",
        &[&format!("{key:x}"), "4", &foreign.to_string()],
        test_user(),
    );
    v.wait_ready();
    cleanup.ids.push(("-m", read_ids(&v).removed_shm));
    let err = dump_expect_error(&env, &v);
    assert!(
        err.contains(&format!(
            "SysV shared memory segment id {foreign} (key 0x0) owned by uid 0 gid 0, not a user and group of the tree"
        )),
        "{err}"
    );
    assert!(!env.img.exists(), "failed dump left {}", env.img.display());
    v.assert_unharmed_and_passes("after the refused dump");
}

/// Rewrites `ipc.img` as `ipc` and reseals the manifest, as only the site
/// can: what a sealed image may still not do is the restorer's to check.
fn reseal_ipc(env: &TestEnv, ipc: &ckpt_image::ipc::Ipc) {
    use ckpt_image::{ImageKind, header};
    let bytes = header::encode(ImageKind::Ipc, ipc);
    fs::write(env.img.join("ipc.img"), &bytes).unwrap();
    let mpath = env.img.join("manifest.img");
    let mut m: ckpt_image::manifest::Manifest =
        header::decode(ImageKind::Manifest, &mpath, &fs::read(&mpath).unwrap()).unwrap();
    let d = m.files.iter_mut().find(|d| d.name == "ipc.img").unwrap();
    d.size = bytes.len() as u64;
    d.blake3 = ckpt_image::digest::of_bytes(&bytes).to_vec();
    let manifest = header::encode(ImageKind::Manifest, &m);
    fs::write(&mpath, &manifest).unwrap();
    let key = ckpt_image::ImageKey::load(&env.image_key()).unwrap();
    fs::write(env.img.join("manifest.mac"), key.seal(&manifest)).unwrap();
}

#[test]
fn sealed_image_cannot_create_objects_beyond_the_user_or_the_limits() {
    let _serial = one_at_a_time();
    use ckpt_image::ImageKind;
    let env = TestEnv::new("sysv-crafted");
    let key = unique_key(4);
    let job = dump_small_job(&env, key);
    let path = env.img.join("ipc.img");
    let original: ckpt_image::ipc::Ipc =
        ckpt_image::header::decode(ImageKind::Ipc, &path, &fs::read(&path).unwrap()).unwrap();

    let refused = |ipc: &ckpt_image::ipc::Ipc, needle: &str| {
        reseal_ipc(&env, ipc);
        let err = restore_expect_error(&env);
        assert!(
            err.contains(needle),
            "error should contain {needle:?}: {err}"
        );
        assert!(
            !pid_exists(job.v.pid),
            "a process is left after the refused restore"
        );
        for (name, id) in [
            ("shm", job.ids.shm),
            ("sem", job.ids.sem),
            ("msg", job.ids.msg),
        ] {
            assert!(
                sysvipc_row(name, id).is_none(),
                "{name} {id} created by a refused restore"
            );
        }
    };
    // A root-owned segment from a job of the test user.
    let mut root_owned = original.clone();
    for s in &mut root_owned.shm {
        s.perm.as_mut().unwrap().uid = 0;
    }
    refused(&root_owned, "owned by uid 0");
    // More semaphores than the kernel allows in a set.
    let mut huge = original.clone();
    huge.sem[0].values = vec![1; 1 << 20];
    refused(&huge, "semaphores; this kernel allows");
    // Saved pages that do not match the segment's image.
    let mut shrunk = original;
    shrunk.shm[0].pages[0].nr_pages -= 1;
    refused(&shrunk, "size is not that of the saved pages");
}

/// A restorer SIGKILLed after it created the job's objects (mid-rebuild)
/// leaves none of them: its keeper process removes them, so the next
/// restore is not refused with "already taken here" and brings the job
/// back.
#[test]
fn killed_restore_leaves_no_objects_and_the_next_restore_works() {
    let _serial = one_at_a_time();
    use std::os::unix::process::ExitStatusExt;
    let env = TestEnv::new("sysv-killed-restore");
    let key = unique_key(5);
    let job = dump_small_job(&env, key);

    let status = env
        .ckpt_command()
        .args(["restore", "--dir", path_str(&env.img)])
        .env("CKPT_FAULT", "restore-mid-rebuild")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    let gone = || {
        sysvipc_row("shm", job.ids.shm).is_none()
            && sysvipc_row("sem", job.ids.sem).is_none()
            && sysvipc_row("msg", job.ids.msg).is_none()
    };
    assert!(
        wait_until(std::time::Duration::from_secs(10), gone),
        "objects of the killed restore are left: shm {:?} sem {:?} msg {:?}",
        sysvipc_row("shm", job.ids.shm),
        sysvipc_row("sem", job.ids.sem),
        sysvipc_row("msg", job.ids.msg)
    );
    restore_and_check(&env, &job.v);
}

/// Another user (root here, not a user of the job) operates last on every
/// semaphore of the job's set: the dump must not leave the set out
/// silently (it used to: an INFO line and exit 0, and the restore elsewhere
/// lacked it). It is refused by name, and the job runs on unharmed.
#[test]
fn set_used_last_by_another_user_is_refused_not_left_out() {
    let _serial = one_at_a_time();
    let env = TestEnv::new("sysv-foreign-last");
    let key = unique_key(6);
    let _cleanup = IpcCleanup {
        key,
        ids: Vec::new(),
    };
    let mut v = Victim::spawn_as(&env, "sysv", &[&format!("{key:x}"), "4"], test_user());
    v.wait_ready();
    let ids = read_ids(&v);
    let nsems = column(
        &sysvipc_row("sem", ids.sem).expect("the job's set"),
        "nsems",
    );
    for n in 0..nsems as u16 {
        for op in [1i16, -1] {
            let mut sop = libc::sembuf {
                sem_num: n,
                sem_op: op,
                sem_flg: libc::IPC_NOWAIT as i16,
            };
            // SAFETY: one sembuf of ours.
            let r = unsafe { libc::semop(ids.sem, &mut sop, 1) };
            assert_eq!(r, 0, "semop: {}", std::io::Error::last_os_error());
        }
    }
    let line = dump_expect_error(&env, &v);
    assert!(
        line.contains(&format!("SysV semaphore set id {}", ids.sem))
            && line.contains("not a user of the tree"),
        "the error names the set and why: {line}"
    );
    assert!(
        !env.img.exists(),
        "a refused dump left {}",
        env.img.display()
    );
    v.assert_unharmed_and_passes("after a dump refused for a set used by another user");
}
