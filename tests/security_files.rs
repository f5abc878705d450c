//! Root restores other users' processes: what a restore gives a process of
//! an ordinary user must be what it had, nothing more (victim:
//! tests/c/secfiles.c, run as the test user).
//!
//! - an unlinked setuid file of the user comes back owned by the user, not
//!   setuid-root;
//! - a path swapped for a symbolic link, or a file changed or replaced
//!   since the dump, is refused naming pid, fd and path, with no process
//!   left; a mapped binary is compared by contents, not mtime;
//! - the restorer's own fds never reach a terminal fd beyond 0-2 unless
//!   passed with `--inherit-fd`;
//! - a read lease comes back and breaks with SIGIO; one being broken is
//!   refused at dump time, the process unharmed.

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;

/// The victim's fd numbers (tests/c/secfiles.c).
const FD_GHOST: i32 = 20;
const FD_DATA: i32 = 10;
const FD_LOG: i32 = 6;
const FD_TTY: i32 = 7;
const FD_LOCK: i32 = 5;

/// A file only root may read, standing for /etc/shadow.
fn root_secret(env: &TestEnv) -> PathBuf {
    let p = env.root.join("secret");
    fs::write(&p, "root's secret\n").expect("write secret");
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).expect("chmod secret");
    p
}

fn spawn_user_victim(env: &TestEnv, mode: &[&str]) -> Victim {
    let mut v = Victim::spawn_as(env, "secfiles", mode, test_user());
    v.wait_ready();
    v
}

/// `ckpt restore` that must fail; returns its error line.
fn restore_expect_error(env: &TestEnv, extra: &[&str]) -> String {
    spawn_restore(env, extra)
        .wait(RESTORE_TIMEOUT)
        .assert_error()
}

fn assert_mentions(line: &str, words: &[&str]) {
    eprintln!("{line}");
    for w in words {
        assert!(line.contains(w), "error line should name {w:?}: {line}");
    }
}

fn assert_no_process_left(v: &Victim) {
    assert!(
        wait_until(Duration::from_secs(5), || victim_gone(
            v.pid, &v.bin, &v.work
        )),
        "a process is left at pid {} after a refused restore",
        v.pid
    );
}

#[test]
fn setuid_ghost_comes_back_owned_by_its_user() {
    let user = test_user();
    let env = TestEnv::new("sec-ghost");
    let mut v = spawn_user_victim(&env, &["ghost"]);
    dump_kill_reap(&env, &mut v);

    let mut restore = spawn_restore(&env, &[]);
    wait_restored_and_running(&v, &mut restore);
    let m = fs::metadata(format!("/proc/{}/fd/{FD_GHOST}", v.pid)).expect("stat ghost fd");
    assert_eq!(
        (m.uid(), m.gid()),
        (user.uid, user.gid),
        "the recreated ghost must belong to the user"
    );
    assert_eq!(m.mode() & 0o7777, 0o4755, "ghost mode");
    assert!(
        !env.work.join("suid-ghost").exists(),
        "the recreated ghost is still linked"
    );
    v.go();
    finish_restore(&v, restore);
}

#[test]
fn symlink_swapped_in_is_refused() {
    let env = TestEnv::new("sec-symlink");
    let secret = root_secret(&env);
    let mut v = spawn_user_victim(&env, &["data"]);
    dump_kill_reap(&env, &mut v);

    let data = env.work.join("data.txt");
    fs::remove_file(&data).unwrap();
    std::os::unix::fs::symlink(&secret, &data).unwrap();
    let line = restore_expect_error(&env, &[]);
    assert_mentions(
        &line,
        &[&v.pid.to_string(), &format!("fd {FD_DATA}"), "data.txt"],
    );
    assert_no_process_left(&v);
}

#[test]
fn file_replaced_by_a_shorter_one_is_refused() {
    let env = TestEnv::new("sec-shorter");
    let mut v = spawn_user_victim(&env, &["data"]);
    dump_kill_reap(&env, &mut v);

    let data = env.work.join("data.txt");
    OpenOptions::new()
        .write(true)
        .open(&data)
        .and_then(|f| f.set_len(2))
        .expect("truncate data.txt");
    let line = restore_expect_error(&env, &[]);
    assert_mentions(&line, &[&format!("fd {FD_DATA}"), "data.txt", "size"]);
    assert_no_process_left(&v);
}

/// The victim runs from a copy of its binary, owned by the user, so the
/// test can change that copy between dump and restore.
fn spawn_from_copy(env: &TestEnv) -> (Victim, PathBuf) {
    let copy = env.work.join("secfiles-copy");
    install_executable(&victim_bin("secfiles"), &copy);
    let mut v = Victim::spawn_bin_as(env, &copy, &["data"], test_user());
    v.wait_ready();
    (v, copy)
}

fn mtime_of(p: &Path) -> std::time::SystemTime {
    fs::metadata(p).and_then(|m| m.modified()).expect("mtime")
}

#[test]
fn binary_patched_with_same_size_and_mtime_is_refused() {
    let env = TestEnv::new("sec-patched");
    let (mut v, bin) = spawn_from_copy(&env);
    dump_kill_reap(&env, &mut v);

    let mtime = mtime_of(&bin);
    let len = fs::metadata(&bin).unwrap().len();
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&bin)
        .unwrap();
    let mut byte = [0u8; 1];
    f.seek(SeekFrom::Start(len / 2)).unwrap();
    std::io::Read::read_exact(&mut f, &mut byte).unwrap();
    f.seek(SeekFrom::Start(len / 2)).unwrap();
    f.write_all(&[byte[0] ^ 0xff]).unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    assert_eq!(mtime_of(&bin), mtime);
    assert_eq!(fs::metadata(&bin).unwrap().len(), len);

    let line = restore_expect_error(&env, &[]);
    assert_mentions(&line, &["mapping", "secfiles-copy", "SHA-256"]);
    assert_no_process_left(&v);
}

#[test]
fn binary_with_only_a_new_mtime_is_accepted() {
    let env = TestEnv::new("sec-touched");
    let (mut v, bin) = spawn_from_copy(&env);
    dump_kill_reap(&env, &mut v);

    let later = mtime_of(&bin) + Duration::from_secs(3600);
    File::options()
        .write(true)
        .open(&bin)
        .and_then(|f| f.set_modified(later))
        .expect("touch binary");
    restore_and_check(&env, &v);
}

/// `ckpt restore --detach EXTRA` with `held` open at fd 7 of the restorer.
fn restore_holding_fd7(env: &TestEnv, held: &File, extra: &[&str]) -> String {
    let log = env.root.join("restore-fd7.log");
    let raw = held.as_raw_fd();
    let mut cmd = env.ckpt_command();
    cmd.args(["restore", "--dir", path_str(&env.img), "--detach"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(File::create(&log).unwrap())
        .stderr(File::create(&log).unwrap());
    let hook = move || {
        // The held file may already be fd 7 (fd numbers depend on what
        // other tests have open): then dup2 would be a no-op that leaves
        // FD_CLOEXEC set, and exec would close it. Clear the flag instead.
        // SAFETY: fcntl and dup2 only change this (child) process's fd
        // table; they are async-signal-safe and take no pointers.
        let rc = unsafe {
            if raw == FD_TTY {
                libc::fcntl(FD_TTY, libc::F_SETFD, 0)
            } else {
                libc::dup2(raw, FD_TTY)
            }
        };
        if rc >= 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: the hook runs in the forked child before exec and only calls
    // fcntl or dup2, which do not allocate or take locks.
    unsafe {
        cmd.pre_exec(hook);
    }
    let status = cmd.status().expect("run ckpt restore");
    let out = read_to_string_lossy(&log);
    assert!(status.success(), "restore failed: {out}");
    out
}

#[test]
fn restorer_fds_do_not_leak_into_terminal_fds() {
    let env = TestEnv::new("sec-fd7");
    let secret = root_secret(&env);
    let mut v = spawn_user_victim(&env, &["tty7", "null"]);
    let link = fs::read_link(format!("/proc/{}/fd/{FD_TTY}", v.pid)).unwrap();
    assert!(link.to_string_lossy().starts_with("/dev/pts/"), "{link:?}");
    dump_kill_reap(&env, &mut v);

    let held = File::open(&secret).unwrap();
    restore_holding_fd7(&env, &held, &[]);
    let link = fs::read_link(format!("/proc/{}/fd/{FD_TTY}", v.pid)).unwrap();
    assert_eq!(link, Path::new("/dev/null"), "terminal fd 7 of the process");
    v.go();
    v.wait_result(RESTORE_TIMEOUT);
    v.assert_pass();
}

#[test]
fn inherit_fd_passes_an_explicit_fd() {
    let env = TestEnv::new("sec-inherit");
    let mut v = spawn_user_victim(&env, &["tty7"]);
    dump_kill_reap(&env, &mut v);

    let given = env.root.join("given.log");
    let held = File::create(&given).unwrap();
    restore_holding_fd7(&env, &held, &["--inherit-fd", "7"]);
    let link = fs::read_link(format!("/proc/{}/fd/{FD_TTY}", v.pid)).unwrap();
    assert_eq!(link, given, "--inherit-fd 7 gives the restorer's fd 7");
    v.go();
    v.wait_result(RESTORE_TIMEOUT);
    v.assert_pass();
}

#[test]
fn grown_log_is_refused_unless_allowed_then_continues_at_its_end() {
    let env = TestEnv::new("sec-log");
    let mut v = spawn_user_victim(&env, &["log"]);
    dump(&env, &v, &["--leave-running"]);
    v.send(nix::sys::signal::Signal::SIGKILL);
    v.reap_killed(Duration::from_secs(10));

    let log = env.work.join("log.txt");
    OpenOptions::new()
        .append(true)
        .open(&log)
        .and_then(|mut f| f.write_all(b"written after the dump\n"))
        .expect("grow log");
    let line = restore_expect_error(&env, &[]);
    assert_mentions(&line, &[&format!("fd {FD_LOG}"), "log.txt", "size"]);
    assert_no_process_left(&v);

    let restore = spawn_restore(&env, &["--allow-changed", path_str(&log)]);
    v.go();
    finish_restore(&v, restore);
    let text = fs::read_to_string(&log).unwrap();
    assert_eq!(text, "line1\nwritten after the dump\nline2\n");
}

/// A read lease comes back on the reopened file: F_GETLEASE says F_RDLCK
/// and a writer makes the restored process get its lease-break signal.
#[test]
fn lease_is_taken_again_and_breaks_with_sigio() {
    let env = TestEnv::new("sec-lease");
    let mut v = spawn_user_victim(&env, &["lease"]);
    dump_kill_reap(&env, &mut v);
    let json = show_json(&env);
    assert!(
        json.to_string().contains("LEASE READ"),
        "lease not saved: {json}"
    );
    let restore = spawn_restore(&env, &[]);
    v.go();
    finish_restore(&v, restore);
}

/// A lease being broken (a writer is waiting for it) cannot be made to
/// break again: refused by name, and the process keeps running.
#[test]
fn lease_being_broken_is_refused_at_dump() {
    let env = TestEnv::new("sec-lease-breaking");
    let mut v = spawn_user_victim(&env, &["lease", "breaking"]);
    let line = dump_expect_error(&env, &v);
    assert_mentions(
        &line,
        &[
            &v.pid.to_string(),
            &format!("fd {FD_LOCK}"),
            "file lease (BREAKING",
            "being broken",
            "/db",
        ],
    );
    assert!(
        !env.img.exists(),
        "a refused dump left {}",
        env.img.display()
    );
    v.assert_unharmed_and_passes("after a dump refused for a lease being broken");
}

/// Proves the reopen runs with the user's credentials, before any identity
/// check: a root-only file put in place of the user's is not even opened.
#[test]
fn root_only_file_swapped_in_is_not_opened() {
    let env = TestEnv::new("sec-rootfile");
    let mut v = spawn_user_victim(&env, &["data"]);
    dump_kill_reap(&env, &mut v);

    let data = env.work.join("data.txt");
    fs::remove_file(&data).unwrap();
    fs::write(&data, "0123456789\n").unwrap();
    fs::set_permissions(&data, fs::Permissions::from_mode(0o600)).unwrap();
    let line = restore_expect_error(&env, &[]);
    assert_mentions(
        &line,
        &[
            &format!("fd {FD_DATA}"),
            "data.txt",
            &format!("uid {}", test_user().uid),
            "permission denied",
        ],
    );
    assert_no_process_left(&v);
}

/// A directory behind another user's 0700 directory (root's here), as the
/// target of a link a user puts on a path the restorer looks up: holds
/// `inner/` (open to all, as a real user's subdirectories often are) with a
/// secret file and a copy of an executable.
fn behind_a_private_dir(env: &TestEnv) -> PathBuf {
    let private = env.root.join("other-user");
    let inner = private.join("inner");
    fs::create_dir_all(&inner).unwrap();
    fs::set_permissions(&private, fs::Permissions::from_mode(0o700)).unwrap();
    fs::write(inner.join("secret.txt"), "other user's secret\n").unwrap();
    install_executable(&victim_bin("secfiles"), &inner.join("secfiles-copy"));
    inner
}

/// The user replaces its working directory by a link into another user's
/// 0700 directory: the restored process must not get a working directory
/// its user could not reach (root's `chdir` followed the link; reads
/// through `/proc/PID/cwd` and relative opens then crossed).
#[test]
fn working_directory_swapped_for_a_link_is_refused() {
    let env = TestEnv::new("sec-cwd");
    let mut v = spawn_user_victim(&env, &["cwd"]);
    dump_kill_reap(&env, &mut v);

    let inner = behind_a_private_dir(&env);
    let cwd = env.work.join("cwd");
    fs::rename(&cwd, env.work.join("cwd.old")).unwrap();
    std::os::unix::fs::symlink(&inner, &cwd).unwrap();
    let line = restore_expect_error(&env, &[]);
    assert_mentions(
        &line,
        &[&format!("pid {}", v.pid), "cwd", "working directory"],
    );
    assert_no_process_left(&v);
}

/// The working directory comes back as the very directory it was.
#[test]
fn working_directory_is_restored() {
    let env = TestEnv::new("sec-cwd-ok");
    let mut v = spawn_user_victim(&env, &["cwd"]);
    dump_kill_reap(&env, &mut v);
    restore_and_check(&env, &v);
}

/// The user swaps the directory of its executable for a link into another
/// user's 0700 directory after the restorer checked the mapped binary and
/// before it sets `/proc/PID/exe`: the executable link must never name the
/// other user's file (readable and, if setuid, executable through it).
#[test]
fn executable_directory_swapped_mid_restore_is_refused() {
    let env = TestEnv::new("sec-exe");
    let bin_dir = env.work.join("bin");
    fs::create_dir(&bin_dir).unwrap();
    let copy = bin_dir.join("secfiles-copy");
    install_executable(&victim_bin("secfiles"), &copy);
    let mut v = Victim::spawn_bin_as(&env, &copy, &["data"], test_user());
    v.wait_ready();
    dump_kill_reap(&env, &mut v);

    let inner = behind_a_private_dir(&env);
    let gate = env.root.join("gate");
    let reached = env.root.join("gate.reached");
    let restore = CkptCmd::spawn_with_env(
        &env,
        &["restore", "--dir", path_str(&env.img)],
        &[
            ("CKPT_FAULT", Path::new("pause:restore-mid-rebuild")),
            ("CKPT_FAULT_GATE", &gate),
        ],
    );
    assert!(
        wait_for_file(&reached, RESTORE_TIMEOUT),
        "restore never reached the mid-rebuild pause: {}",
        restore.stderr_now()
    );
    fs::rename(&bin_dir, env.work.join("bin.old")).unwrap();
    std::os::unix::fs::symlink(&inner, &bin_dir).unwrap();
    fs::write(&gate, "go").unwrap();
    let line = restore
        .wait_with(RESTORE_TIMEOUT, || v.diag())
        .assert_error();
    assert_mentions(
        &line,
        &[&format!("pid {}", v.pid), "secfiles-copy", "executable"],
    );
    assert_no_process_left(&v);
}

/// A tmpfs file of another user (root's here), mode 0666, mapped by the
/// job and deleted by its owner after the dump: the restore must not
/// recreate it in that user's name holding the job's data.
#[test]
fn another_users_gone_shm_file_is_not_recreated() {
    let env = TestEnv::new("sec-shm-owner");
    let shm = PathBuf::from(format!("/dev/shm/ckpt-sec-shm-{}", std::process::id()));
    let _ = fs::remove_file(&shm);
    fs::write(&shm, vec![0u8; 4096]).unwrap();
    fs::set_permissions(&shm, fs::Permissions::from_mode(0o666)).unwrap();
    let mut v = spawn_user_victim(&env, &["shm", path_str(&shm)]);
    dump_kill_reap(&env, &mut v);

    fs::remove_file(&shm).unwrap();
    let line = restore_expect_error(&env, &[]);
    let recreated = fs::symlink_metadata(&shm).is_ok();
    let _ = fs::remove_file(&shm);
    assert!(!recreated, "{} was recreated: {line}", shm.display());
    assert_mentions(
        &line,
        &[&format!("pid {}", v.pid), path_str(&shm), "own user"],
    );
    assert_no_process_left(&v);
}

/// The same file, still there: the restore maps it again and the job
/// finds its data.
#[test]
fn another_users_shm_file_still_there_is_mapped_again() {
    let env = TestEnv::new("sec-shm-kept");
    let shm = PathBuf::from(format!("/dev/shm/ckpt-sec-shm-kept-{}", std::process::id()));
    let _ = fs::remove_file(&shm);
    fs::write(&shm, vec![0u8; 4096]).unwrap();
    fs::set_permissions(&shm, fs::Permissions::from_mode(0o666)).unwrap();
    let mut v = spawn_user_victim(&env, &["shm", path_str(&shm)]);
    dump_kill_reap(&env, &mut v);
    restore_and_check(&env, &v);
    let _ = fs::remove_file(&shm);
}
