//! A job whose files are those of a mount namespace of its own (here a
//! tmpfs mounted only there, with every kind of regular file of
//! tests/c/files.c on it, one mapped): the dump records the namespace, a
//! restore without `--mntns` is refused with nothing started, a path that
//! is not a mount namespace is refused by name, and `ckpt restore --mntns
//! PATH` puts the job back in that namespace, where it finds its files at
//! their offsets and goes on writing them (the victim checks itself),
//! while ckpt's own outputs (its pid file) stay in ckpt's. A job of `ckpt
//! run --pidns` started there gets its private mount namespace made from
//! the named one.

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use crate::common::*;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Where tests/c/files.c's read-write file is written after restore, and
/// what (it reads 10 bytes from offset 2000, then writes this).
const RW_WRITE: (&str, u64, &[u8]) = ("rw.txt", 2010, b"RWRW");
/// Likewise for its write-only file (offset 77).
const WO_WRITE: (&str, u64, &[u8]) = ("wo.txt", 77, b"WOWO");

fn mnt_inode(pid: i32) -> u64 {
    let path = format!("/proc/{pid}/ns/mnt");
    std::fs::metadata(&path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .ino()
}

/// The victim's writes after restore are in its files on the tmpfs of
/// `ns` (mounted at `data` there), and nothing of them in the test's own
/// mount namespace.
fn assert_written_on_the_tmpfs(ns: &MntNs, data: &Path) {
    for (name, at, want) in [RW_WRITE, WO_WRITE] {
        let path = ns.inside(&data.join(name));
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let mut got = vec![0; want.len()];
        file.read_exact_at(&mut got, at)
            .unwrap_or_else(|e| panic!("{path:?} at {at}: {e}"));
        assert_eq!(got, want, "{name} at {at} on the namespace's tmpfs");
        assert!(
            !data.join(name).exists(),
            "{name} is not in the test's mount namespace"
        );
    }
}

/// Kills the listed pids (restored namespace inits) when the test ends,
/// passed or not.
#[derive(Default)]
struct KillOnDrop(Vec<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        for pid in &self.0 {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
    }
}

#[test]
fn files_of_a_mount_namespace_of_its_own_come_back_there_with_mntns() {
    let env = TestEnv::new("mntns-files");
    let data = env.root.join("data");
    let ns = MntNs::new(&data);
    let mut v = Victim::spawn_in_mntns(&env, "files", &[path_str(&data)], &ns);
    v.wait_ready();
    assert_eq!(mnt_inode(v.pid), ns.inode());
    assert!(
        ns.inside(&data.join(RW_WRITE.0)).exists() && !data.join(RW_WRITE.0).exists(),
        "the victim's files are on a tmpfs only its namespace has"
    );
    dump_kill_reap(&env, &mut v);
    assert_eq!(
        show_json(&env)["namespaces"]["mnt"]["inode"].as_u64(),
        Some(ns.inode()),
        "the image names the namespace it was in"
    );

    // No namespace named: refused before anything is created.
    let err = restore_expect_error(&env);
    assert!(
        err.contains("mount namespace of its own") && err.contains("--mntns"),
        "{err}"
    );
    assert!(!pid_exists(v.pid), "a refused restore started nothing");
    // A file that is not a namespace, and a namespace of another kind.
    let err = spawn_restore(&env, &["--mntns", "/etc/hostname"])
        .wait(FAIL_TIMEOUT)
        .assert_error();
    assert!(
        err.contains("--mntns /etc/hostname") && err.contains("not a namespace"),
        "{err}"
    );
    let net = format!("/proc/{}/ns/net", std::process::id());
    let err = spawn_restore(&env, &["--mntns", &net])
        .wait(FAIL_TIMEOUT)
        .assert_error();
    assert!(
        err.contains(&format!("--mntns {net}")) && err.contains("not a mount namespace"),
        "{err}"
    );
    assert!(!pid_exists(v.pid), "a refused restore started nothing");

    // The pid file is ckpt's, written once the restorer is back in its own
    // namespace: under `data` there (an empty directory), not on the tmpfs.
    let pidfile = data.join("restored.pid");
    let mut restore = spawn_restore(
        &env,
        &[
            "--mntns",
            path_str(&ns.path()),
            "--pidfile",
            path_str(&pidfile),
        ],
    );
    wait_restored_and_running(&v, &mut restore);
    assert_eq!(
        mnt_inode(v.pid),
        ns.inode(),
        "the restored process lives in the named namespace"
    );
    v.go();
    finish_restore(&v, restore);
    assert_written_on_the_tmpfs(&ns, &data);
    assert_eq!(read_to_string_lossy(&pidfile).trim(), v.pid.to_string());
    assert!(
        !ns.inside(&pidfile).exists(),
        "the pid file was written in ckpt's mount namespace"
    );
}

/// `ckpt run --pidns` started inside the namespace: its init's mount
/// namespace (a copy of that one) is not recorded, and a restore into a new
/// PID namespace makes another copy from the one `--mntns` names, where
/// the job finds the tmpfs and its files again.
#[test]
fn a_pid_namespace_job_gets_its_mounts_from_the_named_namespace() {
    let env = TestEnv::new("mntns-pidns");
    let data = env.root.join("data");
    let ns = MntNs::new(&data);
    let pidfile = env.root.join("init.pid");
    let bin = victim_bin("files");
    let mut job = Victim::spawn_program_in_mntns(
        &env,
        Path::new(CKPT),
        &[
            "run",
            "--pidns",
            "--pidfile",
            path_str(&pidfile),
            "--",
            path_str(&bin),
            path_str(&env.work),
            path_str(&data),
        ],
        &ns,
    );
    let mut inits = KillOnDrop::default();
    assert!(
        wait_for_file(&pidfile, READY_TIMEOUT),
        "ckpt run wrote no pid file: {}",
        job.diag()
    );
    let init: i32 = read_to_string_lossy(&pidfile).trim().parse().expect("pid");
    inits.0.push(init);
    job.wait_ready();
    let tree = init.to_string();
    ckpt(
        &env,
        &[
            "dump",
            "--tree",
            &tree,
            "--dir",
            path_str(&env.img),
            "--kill",
        ],
        DUMP_TIMEOUT,
    )
    .assert_success();
    assert!(
        show_json(&env)["namespaces"]["mnt"].is_null(),
        "the PID namespace's own mount namespace is not recorded"
    );

    let mut restore = spawn_restore(&env, &["--mntns", path_str(&ns.path())]);
    wait_restored_and_running(&job, &mut restore);
    let restored = restored_root_pid(&restore);
    inits.0.push(restored);
    assert_ne!(
        mnt_inode(restored),
        ns.inode(),
        "the PID namespace has a mount namespace of its own"
    );
    let seen = Path::new(&format!("/proc/{restored}/root"))
        .join(data.strip_prefix("/").unwrap())
        .join(RW_WRITE.0);
    assert!(
        seen.exists(),
        "{seen:?}: the named namespace's tmpfs is there"
    );
    job.go();
    finish_restore(&job, restore);
    assert_written_on_the_tmpfs(&ns, &data);
}
