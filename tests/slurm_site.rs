//! The site's side of `ckpt slurm`: the Epilog's verification and tidying
//! (also the shipped epilog.sh with the shipped site.conf.example, in a
//! mount namespace where the paths it names are the test's), `ckpt gc`, a
//! root-run restore's stdio, and the dump-time budget without Slurm
//! (seconds), then two scenarios
//! under a real Slurm (the lab of scripts/slurm/lab-up.sh, one after the
//! other, about 4 minutes in all):
//!
//! - preemption: a job in partition `low` (GraceTime 20 s) is preempted by
//!   a job in `high`, checkpointed within its GraceTime on the warning
//!   signal, requeued, and restored when the high job is done;
//! - a dump that does not fit: a job in partition `tiny` (GraceTime 2 s)
//!   is first checkpointed by the site's controller-side trigger
//!   (PrologSlurmctld arms a strigger), then preempted while its dump is
//!   held (the dumper's `CKPT_FAULT=pause:before-commit`, as a slow dump):
//!   Slurm kills it as it intends, the Epilog removes the half-written
//!   checkpoint, and the next start restores the previous one and warns.
//!
//! Victim: tests/c/slurm_steps.c (checks its memory at every step).

use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::slurm_lab::*;

/// Job id the tests without Slurm pretend to run as.
const FAKE_JOB: &str = "4343";
const WRAPPER_TIMEOUT: Duration = Duration::from_secs(60);
/// How often a job's state or output is looked at.
const JOB_POLL: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------
// Without Slurm
// ---------------------------------------------------------------------------

/// A committed checkpoint of a running victim, for the Epilog to verify.
fn one_checkpoint(env: &TestEnv, dir: &Path) {
    let mut app = Victim::spawn_program(env, &victim_bin("slurm_steps"), &["1000", "100"]);
    let pid = app.pid.to_string();
    let out = ckpt(
        env,
        &["dump", "--tree", &pid, "--dir", path_str(dir), "--kill"],
        DUMP_TIMEOUT,
    );
    app.reap_killed(DUMP_TIMEOUT);
    out.assert_success();
}

fn epilog(env: &TestEnv, dir: &Path) -> CkptOutput {
    ckpt(
        env,
        &["slurm", "epilog", "--job", FAKE_JOB, "--dir", path_str(dir)],
        FAIL_TIMEOUT,
    )
}

#[test]
fn epilog_verifies_the_committed_checkpoint_and_removes_only_partial_ones() {
    let env = TestEnv::new("slurm-epilog");
    let dir = env.root.join("ckpt");
    std::fs::create_dir(&dir).expect("mkdir");
    one_checkpoint(&env, &dir.join("ckpt-2"));
    let copy = |to: &str| {
        let ok = std::process::Command::new("cp")
            .arg("-a")
            .arg(dir.join("ckpt-2"))
            .arg(dir.join(to))
            .status()
            .expect("cp");
        assert!(ok.success());
    };
    // ckpt-1: an older committed one (kept by --keep); ckpt-3: written by
    // a dump whose commit never came.
    copy("ckpt-1");
    copy("ckpt-3");
    std::fs::write(dir.join("LATEST"), "ckpt-2\n").unwrap();
    std::fs::write(dir.join("ckpt-2.time"), "took_ms 100\n").unwrap();
    // Litter of a killed dump and of an unfinished commit.
    let dead = unused_pid();
    let dead_tmp = dir.join(format!("ckpt-4.tmp.{dead}"));
    std::fs::create_dir(&dead_tmp).unwrap();
    std::fs::write(dead_tmp.join("pages-1.img"), "x").unwrap();
    std::fs::write(dir.join("LATEST.tmp"), "ckpt-4\n").unwrap();
    std::fs::write(dir.join("ckpt-9.time"), "took_ms 5\n").unwrap();
    std::fs::write(dir.join("ATTEMPT"), "began_unix_s 1\n").unwrap();
    // A dumper still at work (this process) and a file not ours.
    let live_tmp = dir.join(format!("ckpt-5.tmp.{}", std::process::id()));
    std::fs::create_dir(&live_tmp).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();

    let out = epilog(&env, &dir);
    out.assert_success();
    let lines: Vec<&str> = out.stdout.lines().collect();
    let prefix = format!("ckpt slurm epilog: job {FAKE_JOB}: ");
    assert!(lines.iter().all(|l| l.starts_with(&prefix)), "{lines:#?}");
    let about = |name: &str| -> Vec<&str> {
        let path = format!("{}: ", dir.join(name).display());
        lines
            .iter()
            .filter(|l| l[prefix.len()..].starts_with(&path))
            .copied()
            .collect()
    };
    let verified = about("ckpt-2");
    assert_eq!(verified.len(), 1, "{lines:#?}");
    assert!(
        verified[0].contains("committed checkpoint verified (seal and checksums of"),
        "{lines:#?}"
    );
    for (name, why) in [
        ("ckpt-3", "uncommitted checkpoint"),
        ("LATEST.tmp", "an unfinished commit of LATEST"),
        ("ckpt-9.time", "timing record of a checkpoint that is gone"),
    ] {
        let said = about(name);
        assert!(
            said.len() == 1 && said[0].contains("removed") && said[0].contains(why),
            "{name}: {lines:#?}"
        );
        assert!(!dir.join(name).exists(), "{name} not removed");
    }
    assert!(
        about("ATTEMPT")[0].contains("never committed"),
        "{lines:#?}"
    );
    for kept in [
        "ckpt-1",
        "ckpt-2",
        "LATEST",
        "ckpt-2.time",
        "ATTEMPT",
        "notes.txt",
    ] {
        assert!(dir.join(kept).exists(), "{kept} was removed: {lines:#?}");
    }
    assert!(live_tmp.exists(), "a live dumper's directory was removed");
    // Dumpers' directories are `ckpt gc`'s, which epilog.sh runs next.
    assert!(dead_tmp.exists(), "a dumper's directory was not left to gc");
    assert_eq!(
        lines.len(),
        5,
        "one line per action, nothing else: {lines:#?}"
    );

    // A committed checkpoint that fails verification is reported and kept.
    let pages = std::fs::read_dir(dir.join("ckpt-2"))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("pages-"))
        })
        .expect("a pages image");
    let mut bytes = std::fs::read(&pages).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&pages, bytes).unwrap();
    let out = epilog(&env, &dir);
    assert_eq!(out.code(), 1, "{}{}", out.stdout, out.stderr);
    assert!(
        out.stdout
            .contains("committed checkpoint fails verification, kept: "),
        "{}",
        out.stdout
    );
    assert!(dir.join("ckpt-2").is_dir());
}

/// A job of several nodes as `ckpt slurm` leaves it in DIR/job: two parts
/// started with `ckpt job run` (nodes n1 and n2, both this host), two
/// epochs committed by `ckpt job dump` (the second with `--kill`). The
/// agents go through `--launch exec` to this host: the job directory is
/// the one `--launch srun` writes. The dumps run in `main` (its image key).
fn two_part_job(main: &TestEnv, dir: &Path) -> Vec<TestEnv> {
    let jobdir = dir.join("job");
    let jd = path_str(&jobdir);
    let mut envs = Vec::new();
    let mut parts = Vec::new();
    for (part, node) in [("a", "n1"), ("b", "n2")] {
        let env = TestEnv::new(&format!("slurm-epilog-nodes-{part}"));
        let work = path_str(&env.work).to_string();
        let bin = victim_bin("counter");
        let mut v = Victim::spawn_program(
            &env,
            Path::new(CKPT),
            &[
                "job",
                "run",
                "--dir",
                jd,
                "--part",
                part,
                "--node",
                node,
                "--",
                path_str(&bin),
                &work,
            ],
        );
        v.wait_ready();
        parts.push(v);
        envs.push(env);
    }
    for kill in [false, true] {
        let mut args = vec![
            "job",
            "dump",
            "--dir",
            jd,
            "--keep",
            "2",
            "--launch",
            "exec",
            "--via",
            "env CKPT_TEST_HOST={host}",
        ];
        if kill {
            args.push("--kill");
        }
        ckpt(main, &args, DUMP_TIMEOUT).assert_success();
    }
    for v in &mut parts {
        v.wait_original_exit(DUMP_TIMEOUT);
    }
    envs
}

#[test]
fn epilog_verifies_every_part_of_the_last_committed_epoch() {
    let env = TestEnv::new("slurm-epilog-nodes");
    let dir = env.root.join("ckpt");
    std::fs::create_dir(&dir).expect("mkdir");
    let _parts = two_part_job(&env, &dir);
    let epoch_dir = |part: &str, epoch: u64| {
        dir.join("job")
            .join("parts")
            .join(part)
            .join(format!("epoch-{epoch}"))
    };
    let prefix = format!("ckpt slurm epilog: job {FAKE_JOB}: ");
    let said = |out: &CkptOutput, part: &str| -> String {
        let path = format!("{prefix}{}: part {part} ", epoch_dir(part, 2).display());
        let lines: Vec<&str> = out
            .stdout
            .lines()
            .filter(|l| l.starts_with(&path))
            .collect();
        assert_eq!(lines.len(), 1, "one line for part {part}: {}", out.stdout);
        lines[0].to_string()
    };

    let out = epilog(&env, &dir);
    out.assert_success();
    for part in ["a", "b"] {
        assert!(
            said(&out, part).contains("of committed epoch 2 verified (seal and checksums of"),
            "{}",
            out.stdout
        );
    }
    assert_eq!(
        out.stdout.lines().count(),
        2,
        "one line per part: {}",
        out.stdout
    );
    assert!(!out.stdout.contains("nothing committed"), "{}", out.stdout);

    // Part b's images of epoch 2 replaced by its epoch 1: each is sealed
    // and whole, but not what epoch 2's record names.
    let b2 = epoch_dir("b", 2);
    std::fs::rename(&b2, dir.join("b2-aside")).unwrap();
    let ok = std::process::Command::new("cp")
        .arg("-a")
        .arg(epoch_dir("b", 1))
        .arg(&b2)
        .status()
        .expect("cp");
    assert!(ok.success());
    let out = epilog(&env, &dir);
    assert_eq!(out.code(), 1, "{}{}", out.stdout, out.stderr);
    assert!(said(&out, "a").contains("verified"), "{}", out.stdout);
    assert!(
        said(&out, "b").contains(
            "fails verification, kept: its manifest is not the one the epoch's record names"
        ),
        "{}",
        out.stdout
    );

    // A damaged page image of part a fails its checksum; it is kept.
    std::fs::remove_dir_all(&b2).unwrap();
    std::fs::rename(dir.join("b2-aside"), &b2).unwrap();
    let pages = std::fs::read_dir(epoch_dir("a", 2))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("pages-"))
        })
        .expect("a pages image");
    let mut bytes = std::fs::read(&pages).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&pages, bytes).unwrap();
    let out = epilog(&env, &dir);
    assert_eq!(out.code(), 1, "{}{}", out.stdout, out.stderr);
    assert!(
        said(&out, "a").contains("of committed epoch 2 fails verification, kept: "),
        "{}",
        out.stdout
    );
    assert!(said(&out, "b").contains("verified"), "{}", out.stdout);
    assert!(epoch_dir("a", 2).is_dir(), "a failing part is kept");
}

/// `ckpt slurm` with the job's environment set by hand and a fake
/// `scontrol` that logs its calls and answers `show job` with a record
/// saying the job is preempted in partition `tiny`, whose GraceTime is 0.
struct FakeJob {
    env: TestEnv,
    dir: PathBuf,
    bin: PathBuf,
    out: PathBuf,
    err: PathBuf,
}

impl FakeJob {
    fn new() -> FakeJob {
        let env = TestEnv::new("slurm-budget");
        let bin = env.root.join("bin");
        std::fs::create_dir(&bin).unwrap();
        let log = env.root.join("scontrol.log");
        let scontrol = bin.join("scontrol");
        write_executable(
            &scontrol,
            &format!(
                r#"#!/bin/sh
echo "$@" >> {log}
case "$1 $2" in
"show job") printf 'JobId={FAKE_JOB} JobName=x\n   JobState=RUNNING Reason=None\n   RunTime=00:00:05 TimeLimit=00:10:00\n   PreemptTime=2026-11-23T16:33:12\n   Partition=tiny\n' ;;
"show partition") echo 'PartitionName=tiny PriorityTier=1 GraceTime=0 PreemptMode=REQUEUE' ;;
esac
"#,
                log = log.display()
            ),
        );
        FakeJob {
            dir: env.root.join("ckpt"),
            out: env.root.join("job.out"),
            err: env.root.join("wrapper.err"),
            bin,
            env,
        }
    }

    fn start(&self, restart: u32, extra: &[&str]) -> Child {
        let append = |p: &Path| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .unwrap()
        };
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let victim = victim_bin("slurm_steps");
        let mut cmd = self.env.ckpt_command();
        cmd.arg("slurm")
            .arg("--dir")
            .arg(&self.dir)
            .args(extra)
            .arg("--")
            .arg(victim)
            .args(["30", "100"])
            .env("PATH", path)
            .env("SLURM_JOB_ID", FAKE_JOB)
            .env("SLURM_JOB_PARTITION", "tiny")
            .env("SLURM_RESTART_COUNT", restart.to_string())
            .stdin(Stdio::null())
            .stdout(append(&self.out))
            .stderr(append(&self.err));
        cmd.spawn().expect("start ckpt slurm")
    }

    fn diag(&self) -> String {
        format!(
            "--- job output ---\n{}\n--- wrapper stderr ---\n{}\n--- scontrol.log ---\n{}",
            read_to_string_lossy(&self.out),
            read_to_string_lossy(&self.err),
            read_to_string_lossy(&self.env.root.join("scontrol.log"))
        )
    }

    fn warn_after_step(&self, child: &Child, n: u64) {
        let line = format!("step {n}/");
        assert!(
            wait_until(WRAPPER_TIMEOUT, || read_to_string_lossy(&self.out)
                .contains(&line)),
            "no step {n}\n{}",
            self.diag()
        );
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR1).expect("SIGUSR1");
    }

    fn wait(&self, mut child: Child) -> i32 {
        if !wait_until(WRAPPER_TIMEOUT, || {
            child.try_wait().ok().flatten().is_some()
        }) {
            let _ = child.kill();
            panic!("ckpt slurm did not end\n{}", self.diag());
        }
        child.wait().unwrap().code().unwrap_or(-1)
    }

    /// The wrapper's stderr lines from `since` bytes on.
    fn err_lines_since(&self, since: usize) -> Vec<String> {
        read_to_string_lossy(&self.err)[since..]
            .lines()
            .map(str::to_string)
            .collect()
    }
}

#[test]
fn budget_is_measured_recorded_and_warned_against_the_grace_time() {
    let job = FakeJob::new();
    // Preempted (says the record) in a partition with no GraceTime: any
    // dump is too slow, and the wrapper says so in one line.
    let run = job.start(0, &[]);
    job.warn_after_step(&run, 3);
    assert_eq!(job.wait(run), 0, "{}", job.diag());
    let lines = job.err_lines_since(0);
    let over: Vec<&String> = lines.iter().filter(|l| l.contains("more than")).collect();
    assert_eq!(over.len(), 1, "{}", job.diag());
    assert!(
        over[0].starts_with("ckpt slurm: checkpoint ckpt-1 took ")
            && over[0].contains("more than the 0 s lead (GraceTime of partition tiny)"),
        "{}",
        job.diag()
    );
    let done = lines
        .iter()
        .find(|l| l.contains("checkpointed into"))
        .unwrap_or_else(|| panic!("{}", job.diag()));
    assert!(
        done.contains("s after the signal, over its 0 s lead"),
        "{}",
        job.diag()
    );
    let timing = read_to_string_lossy(&job.dir.join("ckpt-1.time"));
    let took: u64 = timing
        .lines()
        .find_map(|l| l.strip_prefix("took_ms ")?.parse().ok())
        .unwrap_or_else(|| panic!("no took_ms in {timing:?}"));
    assert!(took > 0 && took < 60_000, "{timing}");
    assert!(timing.contains("lead_s 0\n"), "{timing}");
    assert!(
        !job.dir.join("ATTEMPT").exists(),
        "ATTEMPT left after a commit"
    );
    // Registered for the site's hooks: signal and absolute directory.
    let calls = read_to_string_lossy(&job.env.root.join("scontrol.log"));
    assert!(
        calls.contains(&format!(
            "update JobId={FAKE_JOB} Comment=ckpt-slurm:USR1:{}",
            job.dir.display()
        )),
        "{calls}"
    );

    // The next start: warned that the last dump does not fit, and that a
    // dump was killed (an ATTEMPT left behind, as a killed job leaves it).
    std::fs::write(job.dir.join("ATTEMPT"), "began_unix_s 1\n").unwrap();
    let since = read_to_string_lossy(&job.err).len();
    let run = job.start(1, &[]);
    assert!(
        wait_until(WRAPPER_TIMEOUT, || read_to_string_lossy(&job.err)
            .contains("restored pid")),
        "{}",
        job.diag()
    );
    let lines = job.err_lines_since(since);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("ckpt slurm: the last checkpoint")
                && l.contains("never committed")),
        "{}",
        job.diag()
    );
    assert!(
        lines.iter().any(
            |l| l.starts_with("ckpt slurm: the last checkpoint (ckpt-1) took ")
                && l.contains("more than the 0 s lead (that of the last checkpoint)")
        ),
        "{}",
        job.diag()
    );
    assert!(!job.dir.join("ATTEMPT").exists(), "ATTEMPT not cleared");
    // With a lead that fits (--lead), nothing is said about the budget.
    job.warn_after_step(&run, 10);
    assert_eq!(job.wait(run), 0, "{}", job.diag());
    let since = read_to_string_lossy(&job.err).len();
    let run = job.start(2, &["--lead", "600"]);
    assert_eq!(job.wait(run), 0, "{}", job.diag());
    let lines = job.err_lines_since(since);
    assert!(
        !lines.iter().any(|l| l.contains("more than")),
        "{}",
        job.diag()
    );
    let out = read_to_string_lossy(&job.out);
    assert!(
        out.lines()
            .any(|l| l == format!("done 30 sum {}", step_sum(30))),
        "{}",
        job.diag()
    );
}

/// The repository's scripts/slurm directory.
fn slurm_scripts() -> PathBuf {
    workspace().join("scripts/slurm")
}

/// `chown -R uid:gid path`.
fn chown_tree(path: &Path, user: &TestUser) {
    let ok = std::process::Command::new("chown")
        .arg("-R")
        .arg(format!("{}:{}", user.uid, user.gid))
        .arg(path)
        .status()
        .expect("chown");
    assert!(ok.success(), "chown -R {}", path.display());
}

/// Runs the shipped `epilog.sh` with the shipped `site.conf.example` as
/// Slurm would (root, the job's ids in the environment), in a mount
/// namespace of its own where the paths the site file names are this
/// test's: `/usr/bin/ckpt` is the ckpt under test, `/usr/bin/scontrol`
/// answers with `record`, `/var/lib` holds the test's key as
/// `ckpt/image.key` and `/var/log` the log. Returns the log.
fn run_shipped_epilog(env: &TestEnv, user: &TestUser, key: &Path, record: &str) -> String {
    let ns = env.root.join("ns");
    let var_lib = ns.join("var-lib");
    let var_log = ns.join("var-log");
    for d in [&ns, &var_lib.join("ckpt"), &var_log, &ns.join("ovl")] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::copy(key, var_lib.join("ckpt/image.key")).unwrap();
    let scontrol = ns.join("scontrol");
    write_executable(
        &scontrol,
        &format!("#!/bin/sh\n[ \"$1 $2\" = 'show job' ] && printf '%s\\n' '{record}'\nexit 0\n"),
    );
    let script = r#"set -e
mount -t tmpfs ckpt-test "$NS/ovl"
mkdir "$NS/ovl/up" "$NS/ovl/work"
ln -s "$CKPT_UNDER_TEST" "$NS/ovl/up/ckpt"
cp "$NS/scontrol" "$NS/ovl/up/scontrol"
mount -t overlay overlay -o "lowerdir=/usr/bin,upperdir=$NS/ovl/up,workdir=$NS/ovl/work" /usr/bin
mount --bind "$NS/var-lib" /var/lib
mount --bind "$NS/var-log" /var/log
exec bash "$EPILOG"
"#;
    let out = std::process::Command::new("unshare")
        .args(["--mount", "--propagation", "private", "bash", "-c", script])
        .env("NS", &ns)
        .env("CKPT_UNDER_TEST", CKPT)
        .env("EPILOG", slurm_scripts().join("epilog.sh"))
        .env("CKPT_SLURM_SITE", slurm_scripts().join("site.conf.example"))
        .env("SLURM_JOB_ID", FAKE_JOB)
        .env("SLURM_JOB_UID", user.uid.to_string())
        .env("SLURM_JOB_GID", user.gid.to_string())
        .stdin(Stdio::null())
        .output()
        .expect("run epilog.sh");
    let log = read_to_string_lossy(&var_log.join("ckpt-slurm.log"));
    assert!(
        out.status.success(),
        "epilog.sh: {}\n{}{}\nlog:\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    log
}

#[test]
fn shipped_epilog_verifies_with_the_site_key_and_tidies_as_the_jobs_user() {
    let env = TestEnv::new("slurm-shipped-epilog");
    let user = test_user();
    env.give_work_to(user);
    let dir = env.work.join("ckpt");
    std::fs::create_dir(&dir).unwrap();
    one_checkpoint(&env, &dir.join("ckpt-1"));
    std::fs::write(dir.join("LATEST"), "ckpt-1\n").unwrap();
    let ok = std::process::Command::new("cp")
        .arg("-a")
        .arg(dir.join("ckpt-1"))
        .arg(dir.join("ckpt-2"))
        .status()
        .expect("cp");
    assert!(ok.success());
    let dead = unused_pid();
    let dead_tmp = dir.join(format!("ckpt-3.tmp.{dead}"));
    std::fs::create_dir(&dead_tmp).unwrap();
    std::fs::write(dead_tmp.join("pages-1.img"), "x").unwrap();
    // As `ckpt slurm` leaves it: everything the job's user's.
    chown_tree(&dir, user);
    // The site's key stays root's 0600 (as the first dump made it).
    let key = env.image_key();
    let record = format!(
        "JobId={FAKE_JOB} JobName=x\n   JobState=COMPLETED\n   Comment=ckpt-slurm:USR1:{}",
        dir.display()
    );

    let log = run_shipped_epilog(&env, user, &key, &record);
    let says = |what: &str| log.lines().any(|l| l.contains(what));
    let job = format!("job {FAKE_JOB}: ");
    assert!(
        says(&format!(
            "ckpt slurm epilog: {job}{}: committed checkpoint verified",
            dir.join("ckpt-1").display()
        )),
        "the committed checkpoint was not verified with the site's key:\n{log}"
    );
    assert!(
        says(&format!(
            "{}: removed, uncommitted checkpoint",
            dir.join("ckpt-2").display()
        )),
        "{log}"
    );
    assert!(
        says(&format!(
            "ckpt gc: {}: removed, a dumper's temporary directory (pid {dead} is gone)",
            dead_tmp.display()
        )),
        "epilog.sh did not run ckpt gc on the job's directory:\n{log}"
    );
    assert!(!dead_tmp.exists() && !dir.join("ckpt-2").exists(), "{log}");
    assert!(dir.join("ckpt-1").is_dir() && dir.join("LATEST").exists());
    assert!(!log.contains("exit "), "a hook failed:\n{log}");
}

#[test]
fn gc_removes_dead_dumpers_own_tmp_dirs_and_nothing_else() {
    let env = TestEnv::new("gc");
    let user = test_user();
    let parent = env.root.join("ckpts");
    std::fs::create_dir(&parent).unwrap();
    let dead = unused_pid();
    let stale = parent.join(format!("job.tmp.{dead}"));
    std::fs::create_dir(&stale).unwrap();
    std::fs::write(stale.join("pages-1.img"), "x").unwrap();
    let live = parent.join(format!("job.tmp.{}", std::process::id()));
    std::fs::create_dir(&live).unwrap();
    let target = env.root.join("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("precious"), "x").unwrap();
    let link = parent.join(format!("link.tmp.{dead}"));
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let theirs = parent.join(format!("theirs.tmp.{dead}"));
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("pages-1.img"), "x").unwrap();
    chown_tree(&theirs, user);
    let committed = parent.join("job");
    std::fs::create_dir(&committed).unwrap();

    let out = ckpt(&env, &["gc", path_str(&parent)], FAIL_TIMEOUT);
    out.assert_success();
    let line = |p: &Path, what: &str| {
        let want = format!("ckpt gc: {}: {what}", p.display());
        assert!(
            out.stdout.lines().any(|l| l == want),
            "no {want:?} in\n{}",
            out.stdout
        );
    };
    line(
        &stale,
        &format!("removed, a dumper's temporary directory (pid {dead} is gone)"),
    );
    line(
        &live,
        &format!("kept, its dumper (pid {}) still runs", std::process::id()),
    );
    line(
        &link,
        "kept, a symbolic link or not a directory (never followed)",
    );
    line(
        &theirs,
        &format!("kept, owned by uid {}, not by ckpt's user 0", user.uid),
    );
    assert_eq!(out.stdout.lines().count(), 4, "{}", out.stdout);
    assert!(!stale.exists());
    assert!(live.is_dir() && committed.is_dir());
    assert!(target.join("precious").exists() && link.is_symlink());
    assert!(theirs.join("pages-1.img").exists());

    // As the directory's user, theirs goes too (root's are left).
    std::fs::set_permissions(&env.root, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o777)).unwrap();
    let as_user = format!("{}:{}", user.uid, user.gid);
    let out = ckpt(
        &env,
        &["gc", "--as-user", &as_user, path_str(&parent)],
        FAIL_TIMEOUT,
    );
    out.assert_success();
    assert!(!theirs.exists(), "{}", out.stdout);
    assert!(live.is_dir());
}

#[test]
fn root_run_restore_never_hands_a_users_job_the_hooks_log() {
    let env = TestEnv::new("slurm-hook-stdio");
    let user = test_user();
    let (mut ticks, w) = launcher_pipe();
    let w2 = w.try_clone().unwrap();
    let mut v = Victim::spawn_with_as(
        &env,
        "ticker",
        &[],
        [Stdio::null(), Stdio::from(w), Stdio::from(w2)],
        user,
    );
    v.wait_ready();
    let _ = read_ticks(&mut ticks, Duration::from_millis(50));
    dump_kill_reap(&env, &mut v);

    // As a hook does it: `exec >>"$LOG" 2>&1`, the log root's and 0600.
    let log_path = env.root.join("hook.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log_path)
        .unwrap();
    let out = env
        .ckpt_command()
        .args(["restore", "--detach", "--dir", path_str(&env.img)])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .status()
        .expect("run restore");
    let said = read_to_string_lossy(&log_path);
    assert!(out.success(), "restore failed: {said}");
    let log_id = {
        let m = std::fs::metadata(&log_path).unwrap();
        (m.dev(), m.ino())
    };
    for fd in [1, 2] {
        let proc_fd = format!("/proc/{}/fd/{fd}", v.pid);
        let m = std::fs::metadata(&proc_fd).unwrap();
        assert_ne!(
            (m.dev(), m.ino()),
            log_id,
            "the user's process got root's log as fd {fd}"
        );
        assert_eq!(
            std::fs::read_link(&proc_fd).unwrap(),
            PathBuf::from("/dev/null"),
            "fd {fd}"
        );
    }
    assert!(
        said.contains(&format!(
            "ckpt: pid {} fd 1,2: this command's fds are a file of uid 0, not of the process's user: /dev/null instead",
            v.pid
        )),
        "{said}"
    );
    v.go_and_pass();
}

// ---------------------------------------------------------------------------
// Under Slurm
// ---------------------------------------------------------------------------

/// The lab's site file, read by its PrologSlurmctld, strigger program and
/// Epilog (scripts/slurm/site.conf.example); removed when dropped.
struct SiteConf {
    path: PathBuf,
    log: PathBuf,
}

impl SiteConf {
    fn write(env: &TestEnv, trigger_partitions: &str, trigger_lead: u32) -> SiteConf {
        let site = SiteConf {
            path: lab_state().join("site.conf"),
            log: env.root.join("site.log"),
        };
        site.set(env, trigger_partitions, trigger_lead);
        site
    }

    fn set(&self, env: &TestEnv, trigger_partitions: &str, trigger_lead: u32) {
        std::fs::write(
            &self.path,
            format!(
                "CKPT={CKPT}\nCKPT_IMAGE_KEY={}\nCKPT_SLURM_LOG={}\nCKPT_TRIGGER_LEAD={trigger_lead}\nCKPT_TRIGGER_PARTITIONS={trigger_partitions}\n",
                env.image_key().display(),
                self.log.display()
            ),
        )
        .expect("write the lab's site.conf");
    }

    /// Stops arming the trigger for the job's later runs.
    fn disarm(&self, env: &TestEnv) {
        self.set(env, "none", 0);
    }

    fn log(&self) -> String {
        read_to_string_lossy(&self.log)
    }
}

impl Drop for SiteConf {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A batch job of the victim under `ckpt slurm`.
struct LabJob {
    id: String,
    out: PathBuf,
    dir: PathBuf,
}

impl LabJob {
    fn submit(
        env: &TestEnv,
        partition: &str,
        time: &str,
        steps: u64,
        fault_gate: Option<&Path>,
    ) -> LabJob {
        let script = env.root.join("job.sh");
        let out = env.root.join("job.out");
        let dir = env.root.join("ckpt");
        let fault = fault_gate.map_or_else(String::new, |g| {
            format!(
                "export CKPT_FAULT=pause:before-commit CKPT_FAULT_GATE={}\n",
                g.display()
            )
        });
        std::fs::write(
            &script,
            format!(
                "#!/bin/bash\nexport CKPT_IMAGE_KEY={key}\n{fault}exec {CKPT} slurm --dir {dir} -- {victim} {steps} 1000\n",
                key = env.image_key().display(),
                dir = dir.display(),
                victim = victim_bin("slurm_steps").display(),
            ),
        )
        .unwrap();
        // --signal: the warning on preemption too
        // (preempt_send_user_signal); its time-limit warning (31 s before
        // the limit at the latest) never comes before the job is done.
        let id = Lab::One.sbatch(&[
            "--requeue",
            "--open-mode=append",
            "--signal=B:USR1@1",
            &format!("--time={time}"),
            "--partition",
            partition,
            "--job-name=ckpt-slurm-site",
            "--output",
            path_str(&out),
            path_str(&script),
        ]);
        LabJob { id, out, dir }
    }

    fn output(&self) -> String {
        read_to_string_lossy(&self.out)
    }

    fn record(&self) -> String {
        Lab::One.record(&self.id)
    }

    fn diag(&self, site: &SiteConf) -> String {
        let listing = std::fs::read_dir(&self.dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        let ctld = read_to_string_lossy(&lab_state().join("log/slurmctld.log"));
        let tail: Vec<&str> = ctld.lines().rev().take(25).collect();
        format!(
            "job record: {}\ncheckpoint dir: {listing}\n--- job output ---\n{}\n--- site log ---\n{}\n--- slurmctld.log (newest first) ---\n{}",
            self.record(),
            self.output(),
            site.log(),
            tail.join("\n")
        )
    }

    /// Waits until `f` holds of the output, or panics.
    fn wait_output(
        &self,
        site: &SiteConf,
        what: &str,
        timeout: Duration,
        f: impl Fn(&str) -> bool,
    ) {
        let start = Instant::now();
        while !f(&self.output()) {
            if start.elapsed() > timeout {
                self.cancel();
                panic!("no {what} within {timeout:?}\n{}", self.diag(site));
            }
            std::thread::sleep(JOB_POLL);
        }
    }

    /// Waits for the job's end; returns its record.
    fn wait_end(&self, site: &SiteConf, timeout: Duration) -> String {
        let start = Instant::now();
        loop {
            let r = self.record();
            if job_over(&r) {
                return r;
            }
            if start.elapsed() > timeout {
                self.cancel();
                panic!("job did not end within {timeout:?}\n{}", self.diag(site));
            }
            std::thread::sleep(JOB_POLL);
        }
    }

    fn cancel(&self) {
        let _ = slurm("scancel").arg(&self.id).status();
    }
}

/// A job in `high` that needs the whole node, so it preempts what runs.
fn preempt(env: &TestEnv) -> String {
    Lab::One.sbatch(&[
        "--partition",
        "high",
        "--ntasks=2",
        "--time=1",
        "--job-name=ckpt-slurm-high",
        "--output",
        path_str(&env.root.join("high.out")),
        "--wrap",
        "sleep 5",
    ])
}

/// The step numbers of the output in order, each step's sum checked, and
/// the index of the line each came from.
fn steps(text: &str) -> Vec<(usize, u64)> {
    crate::slurm_lab::steps(text, &|| text.to_string())
}

/// Takes the lab for one scenario: Slurm installed (else `None`: skip),
/// the lab up, nothing else in it.
fn take_lab() -> Option<crate::slurm_lab::Taken> {
    Lab::One.take()
}

#[test]
fn preempted_job_is_checkpointed_within_grace_time_and_restored_after_the_high_job() {
    let Some(lab) = take_lab() else {
        return;
    };
    let env = TestEnv::new("slurm-preempt");
    let site = SiteConf::write(&env, "none", 0);
    const STEPS: u64 = 30;
    let job = LabJob::submit(&env, "low", "10", STEPS, None);
    job.wait_output(&site, "step 5", Duration::from_secs(60), |o| {
        o.contains("step 5/")
    });
    let high = preempt(&env);
    let end = job.wait_end(&site, Duration::from_secs(240));
    let diag = || job.diag(&site);
    assert_eq!(field(&end, "JobState"), Some("COMPLETED"), "{}", diag());
    assert_eq!(field(&end, "ExitCode"), Some("0:0"), "{}", diag());
    assert!(
        field(&end, "Restarts").is_some_and(|r| r != "0"),
        "never requeued\n{}",
        diag()
    );
    assert_eq!(
        field(&Lab::One.record(&high), "JobState"),
        Some("COMPLETED"),
        "the high job\n{}",
        diag()
    );

    let text = job.output();
    assert!(
        text.contains("DUE TO PREEMPTION") || text.contains("requeued"),
        "{}",
        diag()
    );
    let lines: Vec<&str> = text.lines().collect();
    let committed = lines
        .iter()
        .position(|l| l.contains("checkpointed into"))
        .unwrap_or_else(|| panic!("no checkpoint\n{}", diag()));
    assert!(
        lines[committed].contains("within its 20 s lead (GraceTime of partition low)"),
        "the checkpoint was not measured against the partition's GraceTime\n{}",
        diag()
    );
    assert!(!text.contains("more than"), "a budget warning\n{}", diag());
    let restored = lines
        .iter()
        .position(|l| l.contains(": restored pid "))
        .unwrap_or_else(|| panic!("no restore\n{}", diag()));
    assert!(committed < restored, "{}", diag());
    let numbers: Vec<u64> = steps(&text).iter().map(|s| s.1).collect();
    assert_eq!(
        numbers,
        (1..=STEPS).collect::<Vec<_>>(),
        "not one unbroken run\n{}",
        diag()
    );
    assert!(
        lines
            .iter()
            .any(|l| *l == format!("done {STEPS} sum {}", step_sum(STEPS))),
        "{}",
        diag()
    );
    // The Epilog after the preemption found the committed checkpoint sound.
    let latest = std::fs::read_to_string(job.dir.join("LATEST")).unwrap_or_default();
    let verified = format!(
        "ckpt slurm epilog: job {}: {}: committed checkpoint verified",
        job.id,
        job.dir.join(latest.trim()).display()
    );
    assert!(site.log().contains(&verified), "{}", diag());
    if lab.started {
        Lab::One.down();
    }
}

#[test]
fn dump_that_does_not_fit_is_killed_and_the_previous_checkpoint_restored() {
    let Some(lab) = take_lab() else {
        return;
    };
    let env = TestEnv::new("slurm-nofit");
    // The trigger: 100 s before the 2-minute limit, so about 20-40 s in.
    let site = SiteConf::write(&env, "tiny", 100);
    let gate = env.root.join("gate");
    let reached = env.root.join("gate.reached");
    std::fs::write(&gate, "").unwrap();
    // Enough that the first run is still going when the trigger fires
    // (20-45 s in) and the restored one when the high job comes.
    const STEPS: u64 = 75;
    let job = LabJob::submit(&env, "tiny", "2", STEPS, Some(&gate));
    let diag = || job.diag(&site);

    // First checkpoint: asked for by the site's trigger, fast (the gate is
    // open), committed; then every dump is held at its commit.
    job.wait_output(
        &site,
        "checkpoint by the trigger",
        Duration::from_secs(90),
        |o| o.contains("checkpointed into"),
    );
    std::fs::remove_file(&gate).unwrap();
    let _ = std::fs::remove_file(&reached);
    site.disarm(&env);
    let log = site.log();
    assert!(
        log.contains(&format!(
            "ckpt slurm prolog-slurmctld: job {}: trigger armed 100 s before its time limit",
            job.id
        )) && log.contains(&format!(
            "ckpt slurm trigger: job {}: SIGUSR1 sent to its batch step",
            job.id
        )),
        "the checkpoint was not the trigger's\n{}",
        diag()
    );
    let first = job.output();
    assert!(first.contains("ckpt-1 and committed"), "{}", diag());
    let at_ckpt = steps(&first)
        .last()
        .map(|s| s.1)
        .expect("steps before the checkpoint");

    // Restored; preempted while it runs: the dump is held past GraceTime
    // (2 s) and KillWait, and Slurm kills the job.
    job.wait_output(&site, "restore", Duration::from_secs(120), |o| {
        o.contains(": restored pid ")
    });
    let high = preempt(&env);
    let end = job.wait_end(&site, Duration::from_secs(300));
    assert_eq!(field(&end, "JobState"), Some("COMPLETED"), "{}", diag());
    assert_eq!(field(&end, "ExitCode"), Some("0:0"), "{}", diag());
    assert!(
        field(&end, "Restarts").and_then(|r| r.parse::<u32>().ok()) >= Some(2),
        "{}",
        diag()
    );
    assert_eq!(
        field(&Lab::One.record(&high), "JobState"),
        Some("COMPLETED"),
        "{}",
        diag()
    );
    assert!(
        reached.exists(),
        "the second dump never reached its commit\n{}",
        diag()
    );

    let text = job.output();
    assert!(text.contains("DUE TO PREEMPTION"), "{}", diag());
    assert_eq!(
        std::fs::read_to_string(job.dir.join("LATEST"))
            .unwrap_or_default()
            .trim(),
        "ckpt-1",
        "{}",
        diag()
    );
    // The Epilog removed what the killed dump left; nothing of it remains.
    assert!(
        site.log()
            .contains("removed, a dumper's temporary directory"),
        "{}",
        diag()
    );
    let leftovers: Vec<String> = std::fs::read_dir(&job.dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ckpt-2") || n == "ATTEMPT")
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}\n{}", diag());
    // The start after the kill says the dump did not fit, and restores the
    // previous checkpoint, whose run then goes on from where it was.
    let lines: Vec<&str> = text.lines().collect();
    let restores: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains(": restored pid "))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(restores.len(), 2, "{}", diag());
    for &r in &restores {
        assert!(lines[r].ends_with("/ckpt-1"), "{}", diag());
    }
    assert!(
        lines[..restores[1]]
            .iter()
            .any(|l| l.starts_with("ckpt slurm: the last checkpoint")
                && l.contains("never committed")),
        "no warning that the dump did not fit\n{}",
        diag()
    );
    // Steps: 1..=at_ckpt, then from at_ckpt+1 after each restore, each run
    // unbroken, the last to the end.
    steps(&text);
    let mut expected_next = 1;
    for (at, l) in lines.iter().enumerate() {
        if restores.contains(&at) {
            expected_next = at_ckpt + 1;
        }
        let Some(n) = l
            .strip_prefix("step ")
            .and_then(|r| r.split('/').next())
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        assert_eq!(n, expected_next, "line {at}: step {n}\n{}", diag());
        expected_next = n + 1;
    }
    assert_eq!(expected_next, STEPS + 1, "{}", diag());
    assert!(
        lines
            .iter()
            .any(|l| *l == format!("done {STEPS} sum {}", step_sum(STEPS))),
        "{}",
        diag()
    );
    drop(site);
    if lab.started {
        Lab::One.down();
    }
}
