//! An ordinary user checkpoints and restores their own job through the
//! ckpt service (`ckpt serve`), and only their own: another user's process,
//! a directory they could not write, an image sealed for someone else, an
//! image they changed and flags that would have root act on their behalf
//! are each refused in one line (victim: tests/c/counter.c).

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use crate::common::*;

/// Exit code of a refusal for lack of privilege (docs/usage.md).
const PERMISSION: i32 = 4;
/// Exit code of a checkpoint that is not valid (changed since its seal).
const IMAGE_INVALID: i32 = 7;
/// Exit code of what may go through next time.
const CONFLICT: i32 = 8;

fn status_line(pid: i32, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .expect("read status")
        .lines()
        .find_map(|l| l.strip_prefix(key).map(|v| v.trim().to_string()))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

fn creds(pid: i32) -> Vec<String> {
    ["Uid:", "Gid:", "Groups:", "CapEff:", "CapPrm:", "CapAmb:"]
        .iter()
        .map(|k| status_line(pid, k))
        .collect()
}

/// The refusal: one `ckpt: error:` line, the exit code, nothing else on
/// stderr.
fn refused(out: &CkptOutput, code: i32) -> String {
    let line = out.assert_error();
    assert_eq!(out.code(), code, "`{}`: {}", out.desc, out.stderr);
    assert_eq!(out.stderr.trim_end().lines().count(), 1, "{}", out.stderr);
    line
}

/// `ckpt job VERB --dir DIR` with the local launch and a coordinator on
/// any free port of loopback, as the job tests run it.
fn job_args<'a>(verb: &'a str, dir: &'a str) -> [&'a str; 10] {
    [
        "job",
        verb,
        "--dir",
        dir,
        "--launch",
        "exec",
        "--via",
        VIA_LOCAL,
        "--listen",
        "127.0.0.1:0",
    ]
}

/// `user` dumps their victim `v` through the service into `home/img`,
/// killing it; it is reaped.
fn dump_as_user_and_kill(
    env: &TestEnv,
    user: &TestUser,
    svc: &Service,
    home: &Path,
    v: &mut Victim,
) {
    let pid = v.pid.to_string();
    ckpt_as_user(
        env,
        user,
        &svc.socket,
        home,
        &["dump", "--tree", &pid, "--dir", "img", "--kill"],
    )
    .assert_success();
    v.reap_killed(DUMP_TIMEOUT);
}

#[test]
fn users_own_job_is_dumped_and_restored_through_the_service() {
    let user = test_user();
    let env = TestEnv::new("service-own");
    // One request of a user at a time: the restore below holds it.
    let svc = Service::start_with(&env, &["--max-per-user", "1"]);
    let mut v = Victim::spawn_as(&env, "counter", &[], user);
    v.wait_ready();
    let before = creds(v.pid);
    let home = user_dir(&env, user, "home");
    let pid = v.pid.to_string();
    dump_as_user_and_kill(&env, user, &svc, &home, &mut v);

    // The checkpoint is the user's: theirs to read, move and delete.
    let img = home.join("img");
    for entry in std::iter::once(img.clone())
        .chain(std::fs::read_dir(&img).unwrap().map(|e| e.unwrap().path()))
    {
        let m = std::fs::metadata(&entry).unwrap();
        assert_eq!(
            (m.uid(), m.gid()),
            (user.uid, user.gid),
            "{}",
            entry.display()
        );
        assert_eq!(m.mode() & 0o077, 0, "{} is not private", entry.display());
    }
    let shown = ckpt_as_user(&env, user, &svc.socket, &home, &["show", "img"]);
    shown.assert_success();
    assert!(
        shown.stdout.contains(&format!("process {pid}")),
        "{}",
        shown.stdout
    );

    let mut restore =
        CkptCmd::spawn_as_user(&env, user, &svc.socket, &home, &["restore", "--dir", "img"]);
    wait_restored_and_running(&v, &mut restore);
    assert_eq!(creds(v.pid), before, "the restored job's credentials");
    // While it waits for the job, the user has no other request running;
    // another user has.
    let out = ckpt_as_user(&env, user, &svc.socket, &home, &["show", "img"]);
    let line = refused(&out, CONFLICT);
    assert!(line.contains("try again"), "{line}");
    let other = other_test_user();
    let out = ckpt_as_user(
        &env,
        other,
        &svc.socket,
        &env.root,
        &["show", "nothing-here"],
    );
    assert!(!out.stderr.contains("try again"), "{}", out.stderr);
    v.go();
    // The restored job's exit code reaches the user's client.
    finish_restore(&v, restore);
}

/// A v1 hierarchy of this host (`pids`) to place a test's client in, if
/// it has one.
const V1_PIDS: &str = "/sys/fs/cgroup/pids";

/// The line of `/proc/PID/cgroup` for the hierarchy with `controller`.
fn cgroup_line(pid: i32, controller: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .expect("read cgroup")
        .lines()
        .find(|l| l.split(':').nth(1) == Some(controller))
        .unwrap_or_else(|| panic!("pid {pid}: no {controller} line"))
        .to_string()
}

/// The user's client runs in a cgroup of its own (as a batch job's
/// processes do under Slurm's proctrack/cgroup on a v1 host): the job the
/// service restores for it lands there too, not in the service's cgroup,
/// so the scheduler accounts, limits and kills it as the user's job.
#[test]
fn users_restored_job_joins_the_callers_cgroups() {
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.contains(&format!(" {V1_PIDS} ")) && l.contains(" - cgroup "));
    if !mounted {
        eprintln!("SKIPPED: no v1 pids hierarchy at {V1_PIDS}");
        return;
    }
    let user = test_user();
    let env = TestEnv::new("service-cgroup");
    let svc = Service::start(&env);
    let home = user_dir(&env, user, "home");
    let cgroup = Path::new(V1_PIDS).join(format!("ckpt-test-{}", std::process::id()));
    std::fs::create_dir(&cgroup).expect("create the job's cgroup");
    let _cleanup = RemoveCgroup(cgroup.clone());
    nix::unistd::chown(
        &cgroup.join("cgroup.procs"),
        Some(nix::unistd::Uid::from_raw(user.uid)),
        None,
    )
    .expect("delegate cgroup.procs");

    let mut v = Victim::spawn_as(&env, "counter", &[], user);
    v.wait_ready();
    dump_as_user_and_kill(&env, user, &svc, &home, &mut v);
    let mut restore = CkptCmd::spawn_as_user_in_cgroup(
        &env,
        user,
        &svc.socket,
        &home,
        &["restore", "--dir", "img"],
        &cgroup,
    );
    wait_restored_and_running(&v, &mut restore);
    let want = format!("pids:/{}", cgroup.file_name().unwrap().to_string_lossy());
    let line = cgroup_line(v.pid, "pids");
    assert!(
        line.ends_with(&want),
        "the restored job is in {line}, not the client's {want}"
    );
    assert_ne!(
        cgroup_line(v.pid, "pids"),
        cgroup_line(i32::try_from(std::process::id()).unwrap(), "pids"),
    );
    v.go();
    finish_restore(&v, restore);
}

/// Removes a test's cgroup once its processes are gone.
struct RemoveCgroup(std::path::PathBuf);

impl Drop for RemoveCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

#[test]
fn the_service_refuses_what_is_not_the_callers() {
    let user = test_user();
    let env = TestEnv::new("service-refusals");
    let svc = Service::start(&env);
    let home = user_dir(&env, user, "home");

    // Another user's (root's) process: refused before it is touched.
    let mut roots = Victim::spawn(&env, "counter", &[]);
    roots.wait_ready();
    let pid = roots.pid.to_string();
    let out = ckpt_as_user(
        &env,
        user,
        &svc.socket,
        &home,
        &["dump", "--tree", &pid, "--dir", "x"],
    );
    let line = refused(&out, PERMISSION);
    assert!(
        line.contains(&format!("pid {pid}")) && line.contains("uid 0"),
        "{line}"
    );
    assert!(!home.join("x").exists());
    assert_running_untouched(roots.pid, "root's process after a user's dump");

    // A checkpoint root made of root's process, sealed with the site's key.
    dump(&env, &roots, &[]).assert_success();
    let site_img = path_str(&env.img);
    let out = ckpt_as_user(
        &env,
        user,
        &svc.socket,
        &home,
        &["restore", "--dir", site_img],
    );
    let line = refused(&out, PERMISSION);
    assert!(line.contains("sealed with another key"), "{line}");
    roots.assert_unharmed_and_passes("root's process after a user's restore");
    // The next victim shares the work dir.
    roots.clear_protocol_files();

    // The user's own process, into a directory the user could not write.
    let mut v = Victim::spawn_as(&env, "counter", &[], user);
    v.wait_ready();
    let pid = v.pid.to_string();
    let not_theirs = env.root.join("not-theirs");
    let out = ckpt_as_user(
        &env,
        user,
        &svc.socket,
        &home,
        &["dump", "--tree", &pid, "--dir", path_str(&not_theirs)],
    );
    let line = refused(&out, PERMISSION);
    assert!(line.contains("may not create files here"), "{line}");
    assert!(!not_theirs.exists());

    // Flags that would have root run, write or trust what the user names.
    for (flag, value) in [
        ("--action-script", "/bin/true"),
        ("--log-file", "/etc/ckpt.log"),
    ] {
        let out = ckpt_as_user(
            &env,
            user,
            &svc.socket,
            &home,
            &["dump", "--tree", &pid, "--dir", "y", flag, value],
        );
        let line = refused(&out, PERMISSION);
        assert!(
            line.contains(flag) && line.contains("ckpt service"),
            "{line}"
        );
    }

    // A symbolic link of the user's on the way: root does not follow it.
    std::os::unix::fs::symlink(&env.root, home.join("link")).unwrap();
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        &home.join("link"),
        Some(nix::unistd::Uid::from_raw(user.uid)),
        None,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    let out = ckpt_as_user(
        &env,
        user,
        &svc.socket,
        &home,
        &["dump", "--tree", &pid, "--dir", "link/sneaky"],
    );
    let line = refused(&out, PERMISSION);
    assert!(line.contains("link"), "{line}");
    assert!(!env.root.join("sneaky").exists());

    // The user's own checkpoint, changed by the user: refused, nothing runs.
    dump_as_user_and_kill(&env, user, &svc, &home, &mut v);

    // Another user handed that checkpoint: it verifies for its user only.
    let other = other_test_user();
    let theirs = user_dir(&env, other, "theirs");
    let copy = theirs.join("img");
    let run = |cmd: &[&str]| {
        assert!(
            Command::new(cmd[0])
                .args(&cmd[1..])
                .status()
                .unwrap()
                .success()
        )
    };
    run(&["cp", "-a", path_str(&home.join("img")), path_str(&copy)]);
    run(&[
        "chown",
        "-R",
        &format!("{}:{}", other.uid, other.gid),
        path_str(&copy),
    ]);
    for args in [&["show", "img"][..], &["restore", "--dir", "img"][..]] {
        let out = ckpt_as_user(&env, other, &svc.socket, &theirs, args);
        let line = refused(&out, PERMISSION);
        assert!(line.contains("sealed with another key"), "{args:?}: {line}");
    }
    assert!(
        proc_state(v.pid).is_none(),
        "another user's restore brought the job back"
    );

    let core = home.join("img").join(format!("core-{pid}.img"));
    let mut bytes = std::fs::read(&core).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&core, bytes).unwrap();
    let out = ckpt_as_user(&env, user, &svc.socket, &home, &["restore", "--dir", "img"]);
    let line = refused(&out, IMAGE_INVALID);
    assert!(line.contains(&format!("core-{pid}.img")), "{line}");
    assert!(
        proc_state(v.pid).is_none(),
        "a process came back from a changed image"
    );

    // No service: the user is told what is missing and how a site grants it.
    let out = ckpt_as_user(
        &env,
        user,
        &env.root.join("no-such.sock"),
        &home,
        &["dump", "--tree", &pid, "--dir", "z"],
    );
    let line = refused(&out, PERMISSION);
    assert!(line.contains("ckpt serve"), "{line}");

    // `ckpt check` tells a user whether they can checkpoint here.
    let check = |socket: &std::path::Path| ckpt_as_user(&env, user, socket, &home, &["check"]);
    let with = check(&svc.socket);
    assert_eq!(with.code(), 0, "{}", with.stdout);
    assert!(with.stdout.contains("ok   ckpt service"), "{}", with.stdout);
    let without = check(&env.root.join("no-such.sock"));
    assert_eq!(without.code(), 1, "{}", without.stdout);
    assert!(
        without.stdout.contains("FAIL ckpt service"),
        "{}",
        without.stdout
    );
    drop(svc);
}

#[test]
fn users_namespaced_job_runs_and_comes_back_through_the_service() {
    let user = test_user();
    let env = TestEnv::new("service-run");
    let svc = Service::start(&env);
    let home = user_dir(&env, user, "home");
    let pidfile = home.join("init.pid");
    let counter = victim_bin("counter");
    let socket = path_str(&svc.socket);
    // `ckpt run --pidns` needs root: the user's goes to the service, and
    // the job is the user's, with the user's environment.
    let mut v = Victim::spawn_program_as(
        &env,
        std::path::Path::new(CKPT),
        &[
            "run",
            "--pidns",
            "--pidfile",
            path_str(&pidfile),
            "--",
            path_str(&counter),
            path_str(&env.work),
        ],
        user,
        &[("CKPT_SERVICE_SOCKET", socket), ("JOB_MARK", "kept")],
    );
    v.wait_ready();
    assert!(wait_for_file(&pidfile, READY_TIMEOUT), "{}", v.diag());
    assert_eq!(std::fs::metadata(&pidfile).unwrap().uid(), user.uid);
    let init: i32 = read_to_string_lossy(&pidfile).trim().parse().unwrap();
    let job = host_tree_of(init);
    assert_eq!(job.len(), 2, "the init and the counter: {job:?}");
    for pid in &job {
        assert_eq!(
            status_line(*pid, "Uid:").split_whitespace().next(),
            Some(&*user.uid.to_string())
        );
        assert_eq!(status_line(*pid, "CapEff:"), "0000000000000000");
    }
    let environ = std::fs::read(format!("/proc/{}/environ", job[1])).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(environ.contains("JOB_MARK=kept"), "{environ}");
    assert!(
        !environ.contains("CKPT_SERVICE_CALLER") && !environ.contains("CKPT_JOB_ENV"),
        "{environ}"
    );

    let init_pid = init.to_string();
    ckpt_as_user(
        &env,
        user,
        &svc.socket,
        &home,
        &["dump", "--tree", &init_pid, "--dir", "img", "--kill"],
    )
    .assert_success();
    // The user's `ckpt run` ends as its job did.
    assert_eq!(v.wait_original_exit(DUMP_TIMEOUT).code(), Some(128 + 9));

    // Back in a fresh namespace, whatever the host's pids are now.
    let mut restore =
        CkptCmd::spawn_as_user(&env, user, &svc.socket, &home, &["restore", "--dir", "img"]);
    wait_restored_and_running(&v, &mut restore);
    let restored_init = restored_root_pid(&restore);
    assert_eq!(
        status_line(restored_init, "Uid:").split_whitespace().next(),
        Some(&*user.uid.to_string())
    );
    v.go();
    finish_restore(&v, restore);
}

/// A local "remote execution" for `ckpt job --launch exec`: every node is
/// this host.
const VIA_LOCAL: &str = "env CKPT_TEST_HOST={host}";

/// An ordinary user's multi-node job (`ckpt job run`, `ckpt job dump`)
/// goes through the service as theirs; another user cannot make ckpt
/// touch it: not its tree, its images (in place, or copied into their own
/// directory), its job directory (or a link to it), or its secret.
#[test]
fn another_user_cannot_make_ckpt_touch_a_users_job() {
    let user = test_user();
    let other = other_test_user();
    let env = TestEnv::new("service-job");
    let svc = Service::start(&env);
    let home = user_dir(&env, user, "home");
    let jobdir = home.join("job");
    let jd = path_str(&jobdir);
    let counter = victim_bin("counter");
    let mut v = Victim::spawn_program_as(
        &env,
        std::path::Path::new(CKPT),
        &[
            "job",
            "run",
            "--dir",
            jd,
            "--part",
            "a",
            "--node",
            "n1",
            "--",
            path_str(&counter),
            path_str(&env.work),
        ],
        user,
        &[("CKPT_SERVICE_SOCKET", path_str(&svc.socket))],
    );
    v.wait_ready();
    let dumped = ckpt_as_user(
        &env,
        user,
        &svc.socket,
        &home,
        &[job_args("dump", jd).as_slice(), &["--json"]].concat(),
    );
    dumped.assert_success();
    let epoch = jobdir.join("parts").join("a").join("epoch-1");
    for entry in std::fs::read_dir(&epoch)
        .unwrap()
        .map(|e| e.unwrap().path())
    {
        let m = std::fs::metadata(&entry).unwrap();
        assert_eq!(m.uid(), user.uid, "{}", entry.display());
    }
    assert!(v.ping(READY_TIMEOUT), "the job stopped: {}", v.diag());
    let init = read_to_string_lossy(&jobdir.join("parts").join("a").join("root.pid"));
    let init = init.trim();

    let theirs = user_dir(&env, other, "theirs");
    let as_other = |args: &[&str]| ckpt_as_user(&env, other, &svc.socket, &theirs, args);
    let mut refusals = Vec::new();
    // The user's tree.
    refusals.push(as_other(&["dump", "--tree", init, "--dir", "x"]));
    // The user's images, in place and copied into the other's directory.
    refusals.push(as_other(&["restore", "--dir", path_str(&epoch)]));
    let copy = theirs.join("img");
    let run = |cmd: &[&str]| {
        assert!(
            Command::new(cmd[0])
                .args(&cmd[1..])
                .status()
                .unwrap()
                .success()
        )
    };
    run(&["cp", "-a", path_str(&epoch), path_str(&copy)]);
    run(&[
        "chown",
        "-R",
        &format!("{}:{}", other.uid, other.gid),
        path_str(&copy),
    ]);
    refusals.push(as_other(&["restore", "--dir", "img"]));
    // The user's job directory, by its name and by a link of the other's.
    std::os::unix::fs::symlink(&jobdir, theirs.join("link")).unwrap();
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        &theirs.join("link"),
        Some(nix::unistd::Uid::from_raw(other.uid)),
        None,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    let link = theirs.join("link");
    for dir in [jd, path_str(&link)] {
        for verb in ["dump", "restore"] {
            refusals.push(as_other(
                &[
                    job_args(verb, dir).as_slice(),
                    &["--register-timeout", "10"],
                ]
                .concat(),
            ));
        }
    }
    // The user's job secret, named to a coordinated dump of the other's:
    // the service reads it with the other's rights.
    let secret = jobdir.join("secret");
    refusals.push(as_other(&[
        "dump",
        "--tree",
        init,
        "--dir",
        "y",
        "--coord",
        "127.0.0.1:9",
        "--job",
        "j",
        "--secret-file",
        path_str(&secret),
    ]));
    for out in &refusals {
        refused(out, PERMISSION);
    }
    assert!(!theirs.join("x").exists() && !theirs.join("y").exists());
    assert_eq!(
        std::fs::read_dir(jobdir.join("parts").join("a"))
            .unwrap()
            .filter(|e| e
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("epoch-"))
            .count(),
        1,
        "another user's commands left an epoch in the user's job"
    );
    // No service: the user's own `ckpt job dump` says in one line what is
    // missing and how a site grants it, before any agent starts.
    let out = ckpt_as_user(
        &env,
        user,
        &env.root.join("no-such.sock"),
        &home,
        &job_args("dump", jd),
    );
    let line = refused(&out, PERMISSION);
    assert!(line.contains("ckpt serve"), "{line}");
    // The user's job ran on through all of it, as the one that was dumped.
    assert!(v.ping(READY_TIMEOUT), "the job stopped: {}", v.diag());
    v.go();
    assert_eq!(v.wait_result(DUMP_TIMEOUT), "PASS", "{}", v.diag());
    drop(svc);
}

/// A user's process that set its audit login uid (4242, while it had none:
/// the kernel lets it) gets it back through the service, whose worker has
/// none to pass on (tests/c/loginuid.c checks the process and its thread).
#[test]
fn users_process_gets_its_login_uid_back_through_the_service() {
    let user = test_user();
    let env = TestEnv::new("service-loginuid");
    let svc = Service::start(&env);
    let home = user_dir(&env, user, "home");
    let mut v = Victim::spawn_as(&env, "loginuid", &[], user);
    v.wait_ready();
    dump_as_user_and_kill(&env, user, &svc, &home, &mut v);
    let mut restore =
        CkptCmd::spawn_as_user(&env, user, &svc.socket, &home, &["restore", "--dir", "img"]);
    wait_restored_and_running(&v, &mut restore);
    v.go();
    finish_restore(&v, restore);
}
