//! `ckpt slurm` for a job of an ordinary user (the test account
//! `ckpt-test`) under a real Slurm: the user's batch script runs the
//! wrapper as the user, and every step that needs root (`ckpt run
//! --pidns`, the dumps, the restores) goes to the ckpt service the test
//! runs (`ckpt serve`, root; the job gets its socket in
//! CKPT_SERVICE_SOCKET, as a site's default socket would be found).
//!
//! - one node: checkpointed at the time-limit warning, requeued, restored
//!   and completed as one unbroken run; the site's Epilog (root, the lab's
//!   hooks) verifies the user's checkpoint with the user's key;
//! - one node, the site's controller-side trigger (`ckpt slurm trigger`,
//!   armed by PrologSlurmctld) asks the user's job for its checkpoint;
//! - two nodes (`lab-up.sh --nodes 2`): the parts of the user's job,
//!   exchanging checked messages over TCP, are checkpointed as a whole
//!   (`ckpt job dump` with agents started by srun, each handing its
//!   coordinated dump to the service), requeued and restored.
//!
//! Each takes 2-4 minutes (Slurm's 30 s timers, the lab's 30 s credential
//! lifetime before a requeued job runs). Victims: tests/c/slurm_steps.c,
//! tests/c/netpeer.c.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common::*;
use crate::slurm_lab::*;
use crate::slurm_nodes::ROUNDS;

/// How often a job's state or output is looked at.
const JOB_POLL: Duration = Duration::from_secs(2);

/// `sbatch --parsable ARGS` in `lab`, submitted by `user` from `cwd` (a
/// job of theirs: Slurm runs it with their ids). The submitting
/// environment is the job's: without the test's image key (a user of the
/// service has no key of their own).
fn sbatch_as(lab: Lab, user: &TestUser, cwd: &Path, args: &[&str]) -> String {
    let out = lab
        .client("sbatch")
        .arg("--parsable")
        .args(args)
        .current_dir(cwd)
        .env_remove("CKPT_IMAGE_KEY")
        .uid(user.uid)
        .gid(user.gid)
        .output()
        .expect("run sbatch");
    assert!(
        out.status.success(),
        "sbatch as uid {} failed: {}",
        user.uid,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A batch script of the user's: the service's socket, then `exec ckpt
/// slurm ARGS` (nothing else: no key, no root).
fn batch_script(env: &TestEnv, svc: &Service, args: &str) -> PathBuf {
    let script = env.root.join("job.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\nexport CKPT_SERVICE_SOCKET={socket}\nexec {CKPT} slurm {args}\n",
            socket = svc.socket.display(),
        ),
    )
    .expect("write batch script");
    script
}

/// Polls the job's record in `lab` until it says the job is over (then
/// returns it), or cancels it and panics with `diag` after `timeout`.
/// `each` sees every record on the way.
fn wait_over(
    lab: Lab,
    job: &str,
    timeout: Duration,
    diag: &dyn Fn() -> String,
    mut each: impl FnMut(&str),
) -> String {
    let started = Instant::now();
    loop {
        let r = lab.record(job);
        each(&r);
        if job_over(&r) {
            eprintln!(
                "job {job} ended after {:.0} s: {}",
                started.elapsed().as_secs_f64(),
                field(&r, "JobState").unwrap_or("?")
            );
            return r;
        }
        if started.elapsed() > timeout {
            let _ = lab.client("scancel").arg(job).status();
            panic!("job {job} did not end within {timeout:?}\n{}", diag());
        }
        std::thread::sleep(JOB_POLL);
    }
}

/// The lab's site file, read by its PrologSlurmctld, strigger program and
/// Epilog (scripts/slurm/site.conf.example); removed when dropped.
struct SiteConf {
    path: PathBuf,
    log: PathBuf,
}

impl SiteConf {
    /// Site hooks on, the trigger armed for `partitions` `lead` seconds
    /// before a job's time limit.
    fn write(env: &TestEnv, partitions: &str, lead: u32) -> SiteConf {
        let site = SiteConf {
            path: lab_state().join("site.conf"),
            log: env.root.join("site.log"),
        };
        site.set(env, partitions, lead);
        site
    }

    fn set(&self, env: &TestEnv, partitions: &str, lead: u32) {
        std::fs::write(
            &self.path,
            format!(
                "CKPT={CKPT}\nCKPT_IMAGE_KEY={}\nCKPT_SLURM_LOG={}\nCKPT_TRIGGER_LEAD={lead}\nCKPT_TRIGGER_PARTITIONS={partitions}\n",
                env.image_key().display(),
                self.log.display()
            ),
        )
        .expect("write the lab's site.conf");
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

/// The steps of tests/c/slurm_steps.c's output: one unbroken run 1..=`n`
/// (each sum checked), ending in its `done` line.
fn assert_one_unbroken_run(text: &str, n: u64, diag: &dyn Fn() -> String) {
    let numbers: Vec<u64> = steps(text, diag).iter().map(|s| s.1).collect();
    assert_eq!(
        numbers,
        (1..=n).collect::<Vec<_>>(),
        "not one unbroken run 1..{n}\n{}",
        diag()
    );
    let done = format!("done {n} sum {}", step_sum(n));
    assert!(text.lines().any(|l| l == done), "no `{done}`\n{}", diag());
}

/// What a single-node job of the user needs: the service, the user's
/// directory (job output and checkpoints) and the diagnosis.
struct UserJob {
    env: TestEnv,
    svc: Service,
    home: PathBuf,
    out: PathBuf,
    dir: PathBuf,
}

impl UserJob {
    fn new(name: &str) -> UserJob {
        let env = TestEnv::new(name);
        let svc = Service::start(&env);
        let home = user_dir(&env, test_user(), "home");
        UserJob {
            out: home.join("job.out"),
            dir: home.join("ckpt"),
            env,
            svc,
            home,
        }
    }

    /// `ckpt slurm -- slurm_steps STEPS 1000` submitted by the user in
    /// the one-node lab with `sbatch_args`.
    fn submit(&self, steps: u64, sbatch_args: &[&str]) -> String {
        let script = batch_script(
            &self.env,
            &self.svc,
            &format!(
                "--dir {} -- {} {steps} 1000",
                self.dir.display(),
                victim_bin("slurm_steps").display()
            ),
        );
        let mut args = vec![
            "--requeue",
            "--open-mode=append",
            "--job-name=ckpt-slurm-user",
            "--output",
            path_str(&self.out),
        ];
        args.extend_from_slice(sbatch_args);
        args.push(path_str(&script));
        sbatch_as(Lab::One, test_user(), &self.home, &args)
    }

    fn output(&self) -> String {
        read_to_string_lossy(&self.out)
    }

    fn diag(&self, job: &str, site: Option<&SiteConf>) -> String {
        format!(
            "job record: {}\n--- job output ---\n{}\n--- site log ---\n{}\n--- ckpt serve log ---\n{}\n--- slurmctld.log (last 30 lines, newest first) ---\n{}",
            Lab::One.record(job),
            self.output(),
            site.map(SiteConf::log).unwrap_or_default(),
            read_to_string_lossy(&self.svc.log),
            Lab::One.ctld_log_tail(30)
        )
    }

    /// The committed checkpoint is the user's, and the wrapper went
    /// through the service for the restore.
    fn assert_users_checkpoint(&self, diag: &dyn Fn() -> String) -> PathBuf {
        use std::os::unix::fs::MetadataExt;
        let latest = std::fs::read_to_string(self.dir.join("LATEST")).unwrap_or_default();
        let committed = self.dir.join(latest.trim());
        let m = std::fs::metadata(&committed)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", committed.display(), diag()));
        assert_eq!(m.uid(), test_user().uid, "{}", diag());
        assert!(
            self.output().contains("through the ckpt service"),
            "{}",
            diag()
        );
        committed
    }
}

#[test]
fn users_job_is_checkpointed_at_its_warning_requeued_and_restored_through_the_service() {
    let Some(lab) = Lab::One.take() else {
        return;
    };
    let job = UserJob::new("slurm-user");
    // The Epilog on; no trigger.
    let site = SiteConf::write(&job.env, "none", 0);
    // As tests/slurm.rs: the warning 60-120 s into a 130 s run.
    const STEPS: u64 = 130;
    let id = job.submit(STEPS, &["--signal=B:USR1@60", "--time=2:30"]);
    let diag = || job.diag(&id, Some(&site));
    let end = wait_over(Lab::One, &id, Duration::from_secs(600), &diag, |_| {});
    assert_eq!(field(&end, "JobState"), Some("COMPLETED"), "{}", diag());
    assert_eq!(field(&end, "ExitCode"), Some("0:0"), "{}", diag());
    assert!(
        field(&end, "Restarts").is_some_and(|r| r != "0"),
        "never requeued\n{}",
        diag()
    );
    assert_eq!(
        field(&end, "UserId").map(|u| u.starts_with("ckpt-test(")),
        Some(true),
        "{}",
        diag()
    );
    let text = job.output();
    assert_one_unbroken_run(&text, STEPS, &diag);
    let lines: Vec<&str> = text.lines().collect();
    let committed = lines
        .iter()
        .position(|l| l.starts_with("ckpt slurm: pid ") && l.contains("checkpointed into"))
        .unwrap_or_else(|| panic!("no checkpoint\n{}", diag()));
    let restored = lines
        .iter()
        .position(|l| l.contains(": restored pid "))
        .unwrap_or_else(|| panic!("no restore\n{}", diag()));
    assert!(committed < restored, "{}", diag());
    let ckpt = job.assert_users_checkpoint(&diag);
    // The Epilog (root) verified the user's checkpoint with the user's key.
    let verified = format!(
        "ckpt slurm epilog: job {id}: {}: committed checkpoint verified",
        ckpt.display()
    );
    assert!(site.log().contains(&verified), "{}", diag());
    drop(site);
    if lab.started {
        Lab::One.down();
    }
}

#[test]
fn site_trigger_checkpoints_a_users_job_which_is_restored_through_the_service() {
    let Some(lab) = Lab::One.take() else {
        return;
    };
    let job = UserJob::new("slurm-user-trigger");
    // The trigger: 100 s before the 2-minute limit, so about 20-45 s in.
    let site = SiteConf::write(&job.env, "tiny", 100);
    const STEPS: u64 = 75;
    let id = job.submit(
        STEPS,
        &["--signal=B:USR1@1", "--time=2", "--partition", "tiny"],
    );
    let diag = || job.diag(&id, Some(&site));
    let start = Instant::now();
    while !job.output().contains("checkpointed into") {
        if start.elapsed() > Duration::from_secs(120) {
            let _ = Lab::One.client("scancel").arg(&id).status();
            panic!("no checkpoint by the trigger\n{}", diag());
        }
        std::thread::sleep(JOB_POLL);
    }
    // The restored run gets no trigger: it ends within its limit.
    site.set(&job.env, "none", 0);
    let log = site.log();
    assert!(
        log.contains(&format!(
            "ckpt slurm trigger: job {id}: SIGUSR1 sent to its batch step"
        )),
        "the checkpoint was not the trigger's\n{}",
        diag()
    );
    let end = wait_over(Lab::One, &id, Duration::from_secs(300), &diag, |_| {});
    assert_eq!(field(&end, "JobState"), Some("COMPLETED"), "{}", diag());
    assert_eq!(field(&end, "ExitCode"), Some("0:0"), "{}", diag());
    assert_one_unbroken_run(&job.output(), STEPS, &diag);
    job.assert_users_checkpoint(&diag);
    drop(site);
    if lab.started {
        Lab::One.down();
    }
}

/// The server's port on 127.0.0.1 (both fake nodes are this host); not
/// tests/slurm_nodes.rs's, should both labs' tests overlap.
const PORT: u16 = 47133;

#[test]
fn users_job_of_two_nodes_is_checkpointed_requeued_and_restored_through_the_service() {
    let Some(lab) = Lab::Two.take() else {
        return;
    };
    let user = test_user();
    let env = TestEnv::new("slurm-user-nodes");
    let svc = Service::start(&env);
    let home = user_dir(&env, user, "home");
    // The parts' results and progress: the user's to write.
    env.give_work_to(user);
    let netpeer = victim_bin("netpeer");
    let role = env.root.join("role.sh");
    let side = |r: &str| {
        format!(
            "{} {r} {} 127.0.0.1 {PORT} {ROUNDS}",
            netpeer.display(),
            env.work.display()
        )
    };
    std::fs::write(
        &role,
        format!(
            "#!/bin/sh\ncase \"$SLURM_NODEID\" in\n0) exec {} ;;\n1) exec {} ;;\n*) exit 2 ;;\nesac\n",
            side("server"),
            side("client")
        ),
    )
    .expect("write role script");
    let dir = home.join("ckpt");
    let output = home.join("job.out");
    let script = batch_script(
        &env,
        &svc,
        &format!("--dir {} -- /bin/sh {}", dir.display(), role.display()),
    );
    let expected = std::thread::spawn(|| crate::slurm_nodes::expected_digest(ROUNDS));
    let id = sbatch_as(
        Lab::Two,
        user,
        &home,
        &[
            "--nodes=2",
            "--ntasks-per-node=1",
            "--requeue",
            "--open-mode=append",
            "--signal=B:USR1@75",
            "--time=2:00",
            "--job-name=ckpt-slurm-user-nodes",
            "--output",
            path_str(&output),
            path_str(&script),
        ],
    );
    let diag = || {
        format!(
            "job record: {}\n--- job output ---\n{}\n--- ckpt serve log ---\n{}\n--- slurmctld.log (last 30 lines, newest first) ---\n{}",
            Lab::Two.record(&id),
            read_to_string_lossy(&output),
            read_to_string_lossy(&svc.log),
            Lab::Two.ctld_log_tail(30)
        )
    };
    let end = wait_over(Lab::Two, &id, Duration::from_secs(330), &diag, |_| {});
    assert_eq!(field(&end, "JobState"), Some("COMPLETED"), "{}", diag());
    assert_eq!(field(&end, "ExitCode"), Some("0:0"), "{}", diag());
    assert!(
        field(&end, "Restarts").is_some_and(|r| r != "0"),
        "never requeued\n{}",
        diag()
    );
    let expected = expected.join().expect("digest thread");
    for r in ["server", "client"] {
        let got = read_to_string_lossy(&env.work.join(format!("result-{r}")));
        assert_eq!(got, expected, "{r}'s result\n{}", diag());
    }
    assert_two_parts_checkpointed_and_restored(&read_to_string_lossy(&output), None, &diag);
    // Every part's images are the user's.
    use std::os::unix::fs::MetadataExt;
    for node in ["n1", "n2"] {
        let part = dir.join("job").join("parts").join(node);
        let epochs: Vec<PathBuf> = std::fs::read_dir(&part)
            .unwrap_or_else(|e| panic!("{}: {e}\n{}", part.display(), diag()))
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with("epoch-")
            })
            .collect();
        assert!(!epochs.is_empty(), "part {node}: no epoch\n{}", diag());
        for e in epochs {
            assert_eq!(
                std::fs::metadata(&e).unwrap().uid(),
                user.uid,
                "{}",
                e.display()
            );
        }
    }
    if lab.started {
        Lab::Two.down();
    }
}

/// Rounds of tests/c/mpi_job.c's ring: about a minute in the lab.
const MPI_ROUNDS: u64 = 6_000;

/// An MPI job of an ordinary user as they write it, in a batch job of
/// two nodes with two tasks each: the launcher runs once, as node n1's
/// part, the daemon it starts on n2 (through ckpt's stand-in) is n2's
/// part; every part's `ckpt job run`, dump and restore goes to the
/// service. Checkpointed at the warning, requeued, restored; the ring ends
/// with the result computed without MPI, and the images are the user's.
struct UsersMpiJob {
    /// The test's name (its directory, the Slurm job's name).
    name: &'static str,
    /// Exports the batch script makes before the launch (both fake nodes
    /// are this host: the ranks talk TCP on loopback).
    exports: String,
    /// The launcher and its placement words.
    launch: &'static str,
    /// Builds a victim against this MPI.
    victim: fn(&str) -> PathBuf,
    /// How `ckpt slurm` names the launcher it runs once.
    runs_once: &'static str,
    /// The ring's pause after each round, in microseconds: with its
    /// rounds, a floor under the job's length, so that the warning comes
    /// while the ring runs (two ranks over MPICH do a round in little more
    /// than the pause).
    pause_us: u32,
    /// How many parts the job has (a node's, or a rank's each).
    parts: usize,
    /// A part that runs on n2, whose images must be the user's.
    part_on_n2: &'static str,
}

fn users_mpi_job_across_two_nodes(job: &UsersMpiJob) {
    let Some(lab) = Lab::Two.take() else {
        return;
    };
    let user = test_user();
    let env = TestEnv::new(job.name);
    let svc = Service::start(&env);
    let home = user_dir(&env, user, "home");
    env.give_work_to(user);
    let bin = (job.victim)("mpi_job");
    let dir = home.join("ckpt");
    let output = home.join("job.out");
    let script = env.root.join("job.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n\
             export CKPT_SERVICE_SOCKET={socket}\n\
             export {exports}\n\
             exec {CKPT} slurm --dir {dir} -- {launch} {bin} {work} {MPI_ROUNDS} {pause}\n",
            socket = svc.socket.display(),
            exports = job.exports,
            launch = job.launch,
            dir = dir.display(),
            bin = bin.display(),
            work = env.work.display(),
            pause = job.pause_us,
        ),
    )
    .expect("write batch script");
    let job_name = format!("--job-name=ckpt-{}", job.name);
    let id = sbatch_as(
        Lab::Two,
        user,
        &home,
        &[
            "--nodes=2",
            "--ntasks-per-node=2",
            "--requeue",
            "--open-mode=append",
            "--signal=B:USR1@75",
            "--time=2:00",
            &job_name,
            "--output",
            path_str(&output),
            path_str(&script),
        ],
    );
    let diag = || {
        format!(
            "job record: {}\nprogress {:?} result {:?}\n--- job output ---\n{}\n--- ckpt serve log ---\n{}\n--- slurmctld.log (last 30 lines, newest first) ---\n{}",
            Lab::Two.record(&id),
            read_to_string_lossy(&env.work.join("progress")),
            read_to_string_lossy(&env.work.join("result")),
            read_to_string_lossy(&output),
            read_to_string_lossy(&svc.log),
            Lab::Two.ctld_log_tail(30)
        )
    };
    let mut ended_before_requeue = None;
    // Each run is warned 15 to 45 s in and requeued; a loaded machine
    // needs several runs to finish the ring.
    let end = wait_over(Lab::Two, &id, Duration::from_secs(480), &diag, |r| {
        if ended_before_requeue.is_none() && field(r, "Restarts").is_some_and(|n| n != "0") {
            ended_before_requeue = Some(env.work.join("result").exists());
        }
    });
    assert_eq!(field(&end, "JobState"), Some("COMPLETED"), "{}", diag());
    assert_eq!(field(&end, "ExitCode"), Some("0:0"), "{}", diag());
    assert_eq!(
        ended_before_requeue,
        Some(false),
        "requeued while the ring ran\n{}",
        diag()
    );
    let result = read_to_string_lossy(&env.work.join("result"));
    assert!(result.starts_with("PASS"), "ring: {result}\n{}", diag());
    assert_parts_checkpointed_and_restored(
        &read_to_string_lossy(&output),
        job.parts,
        Some(job.runs_once),
        &diag,
    );
    use std::os::unix::fs::MetadataExt;
    let epoch = std::fs::read_dir(dir.join("job/parts").join(job.part_on_n2))
        .unwrap_or_else(|e| panic!("part {}: {e}\n{}", job.part_on_n2, diag()))
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with("epoch-"))
        .unwrap_or_else(|| panic!("no epoch of n2\n{}", diag()));
    assert_eq!(
        epoch.metadata().expect("epoch").uid(),
        user.uid,
        "the daemon's part's images are the user's\n{}",
        diag()
    );
    if lab.started {
        Lab::Two.down();
    }
}

#[test]
fn users_open_mpi_job_across_two_nodes_is_checkpointed_requeued_and_restored() {
    users_mpi_job_across_two_nodes(&UsersMpiJob {
        name: "slurm-user-mpirun",
        exports:
            "OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo"
                .into(),
        launch: "mpirun -np 4",
        victim: mpi_victim_bin,
        runs_once: "ckpt slurm: mpirun (Open MPI) runs once, as node n1's part",
        pause_us: 2_000,
        parts: 2,
        part_on_n2: "n2",
    });
}

/// MPICH's `mpiexec` (hydra), two ranks a node: MPICH 5 as pip installs
/// it, its venv's `bin` first on the user's PATH, so the launcher is a
/// plain `mpiexec` (a copy of `mpiexec.hydra`, which ckpt tells by the
/// hydra proxy beside it). Debian's MPICH 4.0 hangs in `MPI_Finalize` with
/// two ranks a node, with or without ckpt (docs/slurm.md says why; its
/// one rank a node is tests/slurm.rs's). The proxy on n2 comes through
/// ckpt's ssh stand-in.
#[test]
fn users_mpich_job_across_two_nodes_is_checkpointed_requeued_and_restored() {
    let bin = pip_mpich_prefix().join("bin");
    users_mpi_job_across_two_nodes(&UsersMpiJob {
        name: "slurm-user-mpich",
        exports: format!("PATH={}:$PATH HYDRA_IFACE=lo", bin.display()),
        launch: "mpiexec -ppn 2 -np 4",
        victim: pip_mpich_victim_bin,
        runs_once: "ckpt slurm: mpiexec (MPICH (hydra)) runs once, as node n1's part",
        pause_us: 10_000,
        parts: 2,
        part_on_n2: "n2",
    });
}

/// `srun --mpi=pmix`, two ranks a node (the allocation's tasks): the
/// ranks are the parts, each started by slurmstepd as the user, linked to
/// its node's PMIx server (inside slurmstepd), which checks the user of
/// every connection; each restored rank comes back as the same task of
/// the requeued job's first step, its link made again to that step's
/// server.
#[test]
fn users_srun_mpi_pmix_job_across_two_nodes_is_checkpointed_requeued_and_restored() {
    users_mpi_job_across_two_nodes(&UsersMpiJob {
        name: "slurm-user-pmix",
        exports: "OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo".into(),
        launch: "srun --mpi=pmix",
        victim: mpi_victim_bin,
        runs_once: "ckpt slurm: srun --mpi=pmix: the allocation's tasks, each rank a part",
        // Four ranks: a round is four hops; 42 s of pauses keep a quiet
        // machine's ring running past the first warning.
        pause_us: 7_000,
        parts: 4,
        part_on_n2: "task-000002",
    });
}
