//! `ckpt slurm` under a real Slurm (a one-node lab on localhost, brought up
//! by scripts/slurm/lab-up.sh): a batch job whose application checks its
//! memory at every step is checkpointed on the time-limit warning,
//! requeued, restored when Slurm starts it again, and completes; its output
//! file shows one unbroken run (victim: tests/c/slurm_steps.c).
//!
//! Takes about 3 minutes: Slurm's warning comes on a 30 s timer, and a
//! requeued job waits the lab's credential lifetime (30 s) before it runs.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::slurm_lab::*;

/// Steps of the application, one per [`STEP_MS`].
const STEPS: u64 = 130;
const STEP_MS: u64 = 1000;
/// Time limit and warning lead. Slurm looks at time limits every 30 s, so
/// the warning comes somewhere from 30 s before to 30 s after "lead
/// seconds before the limit" (here: 60-120 s into a run; both ends were
/// seen on this machine). The application (130 s) is always still running
/// then. A restored run with more than 60 s of work left may be
/// checkpointed again, which the test accepts (every run must continue
/// the same sequence).
const TIME_LIMIT: &str = "2:30";
const WARN_LEAD_SECS: u32 = 60;
/// First run, requeue delay, scheduling and second run, with slack.
const JOB_TIMEOUT: Duration = Duration::from_secs(600);
/// How often the job's state is asked for.
const JOB_POLL: Duration = Duration::from_secs(2);
fn diagnose(env: &TestEnv, job: &str, output: &Path) -> String {
    let listing = std::fs::read_dir(env.root.join("ckpt"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    format!(
        "job record: {}\ncheckpoint dir: {listing}\n--- job output ---\n{}\n--- slurmctld.log (last 30 lines, newest first) ---\n{}",
        Lab::One.record(job),
        read_to_string_lossy(output),
        Lab::One.ctld_log_tail(30)
    )
}

#[test]
fn job_is_checkpointed_requeued_and_restored_with_its_memory_and_output() {
    let Some(lab) = Lab::One.take() else {
        return;
    };

    let env = TestEnv::new("slurm");
    let victim = victim_bin("slurm_steps");
    let script = env.root.join("job.sh");
    let output = env.root.join("job.out");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\nexport CKPT_IMAGE_KEY={key}\nexec {ckpt} slurm --dir {dir} -- {victim} {STEPS} {STEP_MS}\n",
            key = env.image_key().display(),
            ckpt = CKPT,
            dir = env.root.join("ckpt").display(),
            victim = victim.display(),
        ),
    )
    .expect("write batch script");
    let started = Instant::now();
    let job = Lab::One.sbatch(&[
        "--requeue",
        "--open-mode=append",
        &format!("--signal=B:USR1@{WARN_LEAD_SECS}"),
        &format!("--time={TIME_LIMIT}"),
        "--job-name=ckpt-slurm-test",
        "--output",
        path_str(&output),
        path_str(&script),
    ]);

    // Until the job record says it ended (REQUEUED/PENDING/RUNNING between).
    let mut last;
    let ended = loop {
        let out = slurm("scontrol")
            .args(["show", "job", "-o", &job])
            .output()
            .expect("run scontrol");
        last = String::from_utf8_lossy(&out.stdout).into_owned();
        if job_over(&last) {
            break true;
        }
        if started.elapsed() > JOB_TIMEOUT {
            break false;
        }
        std::thread::sleep(JOB_POLL);
    };
    if !ended {
        let _ = slurm("scancel").arg(&job).status();
        panic!(
            "job {job} did not end within {JOB_TIMEOUT:?}\n{}",
            diagnose(&env, &job, &output)
        );
    }
    eprintln!(
        "job {job} ended after {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        field(&last, "JobState").unwrap_or("?")
    );
    let diag = || diagnose(&env, &job, &output);
    assert_eq!(field(&last, "JobState"), Some("COMPLETED"), "{}", diag());
    assert_eq!(field(&last, "ExitCode"), Some("0:0"), "{}", diag());
    let restarts: u32 = field(&last, "Restarts")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    assert!(restarts >= 1, "job was never requeued\n{}", diag());

    // One unbroken run in the one output file: every step once, in order,
    // each with the sum of its memory, a restore somewhere in the middle.
    let text = read_to_string_lossy(&output);
    let lines: Vec<&str> = text.lines().collect();
    let steps: Vec<(usize, u64, &str)> = lines
        .iter()
        .enumerate()
        .filter_map(|(at, l)| {
            let rest = l.strip_prefix("step ")?;
            let (n, sum) = rest.split_once(" sum ")?;
            let (n, _) = n.split_once('/')?;
            Some((at, n.parse().ok()?, sum))
        })
        .collect();
    let numbers: Vec<u64> = steps.iter().map(|s| s.1).collect();
    assert_eq!(
        numbers,
        (1..=STEPS).collect::<Vec<_>>(),
        "steps not one unbroken sequence 1..{STEPS}\n{}",
        diag()
    );
    for (_, n, sum) in &steps {
        assert_eq!(*sum, step_sum(*n), "step {n}: wrong memory sum\n{}", diag());
    }
    let done = format!("done {STEPS} sum {}", step_sum(STEPS));
    assert!(
        lines.iter().any(|l| *l == done),
        "no `{done}` line\n{}",
        diag()
    );
    assert!(!text.contains("BAD step"), "{}", diag());
    let committed = lines
        .iter()
        .position(|l| l.starts_with("ckpt slurm: pid ") && l.contains("checkpointed into"))
        .unwrap_or_else(|| panic!("no checkpoint line\n{}", diag()));
    let restored = lines
        .iter()
        .position(|l| l.contains(": restored pid "))
        .unwrap_or_else(|| panic!("no restore line\n{}", diag()));
    assert!(
        steps[0].0 < committed && committed < restored && restored < steps[steps.len() - 1].0,
        "the checkpoint and restore are not between the first and the last step\n{}",
        diag()
    );
    // The committed checkpoint is still there; older ones pruned to --keep.
    let latest = std::fs::read_to_string(env.root.join("ckpt/LATEST")).expect("read LATEST");
    assert!(
        env.root.join("ckpt").join(latest.trim()).is_dir(),
        "LATEST names {latest:?}, which is missing"
    );

    if lab.started {
        Lab::One.down();
    }
}

/// Steps of the application in the tests without Slurm, one per
/// [`FAST_STEP_MS`].
const FAST_STEPS: u64 = 40;
const FAST_STEP_MS: u64 = 100;
/// Job id the tests without Slurm pretend to run as.
const FAKE_JOB: &str = "4242";
const WRAPPER_TIMEOUT: Duration = Duration::from_secs(60);

/// `ckpt slurm` as a batch script would run it, without Slurm: the job's
/// environment is set by hand and `scontrol` is a script that logs its
/// arguments. stdout is the job's output file (opened for append, as
/// `--open-mode=append` does), stderr goes to `wrapper.err`.
struct FakeJob {
    env: TestEnv,
    out: PathBuf,
    dir: PathBuf,
    bin: PathBuf,
    victim: PathBuf,
}

impl FakeJob {
    fn new(test: &str) -> FakeJob {
        let env = TestEnv::new(test);
        let bin = env.root.join("bin");
        std::fs::create_dir(&bin).expect("create fake bin dir");
        let scontrol = bin.join("scontrol");
        write_executable(
            &scontrol,
            &format!(
                "#!/bin/sh\necho \"$@\" >> {}\n",
                env.root.join("scontrol.log").display()
            ),
        );
        FakeJob {
            out: env.root.join("job.out"),
            dir: env.root.join("ckpt"),
            victim: victim_bin("slurm_steps"),
            bin,
            env,
        }
    }

    /// Starts the wrapper as run `restart` of the job; `app` replaces the
    /// default application (the victim) if given.
    fn start(
        &self,
        restart: u32,
        extra: &[&str],
        app: Option<&[&str]>,
        stdin: std::process::Stdio,
    ) -> std::process::Child {
        self.start_with(restart, extra, app, stdin, &[])
    }

    /// [`FakeJob::start`] with more of the job's environment.
    fn start_with(
        &self,
        restart: u32,
        extra: &[&str],
        app: Option<&[&str]>,
        stdin: std::process::Stdio,
        vars: &[(&str, &str)],
    ) -> std::process::Child {
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.out)
                .expect("open job output")
        };
        let err = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.env.root.join("wrapper.err"))
            .expect("open wrapper stderr");
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let victim = self.victim.to_string_lossy().into_owned();
        let steps = FAST_STEPS.to_string();
        let period = FAST_STEP_MS.to_string();
        let default_app = [victim.as_str(), steps.as_str(), period.as_str()];
        let mut cmd = self.env.ckpt_command();
        cmd.arg("slurm")
            .arg("--dir")
            .arg(&self.dir)
            .args(extra)
            .arg("--")
            .args(app.unwrap_or(&default_app))
            .env("PATH", path)
            .env("SLURM_JOB_ID", FAKE_JOB)
            .env_remove("SLURM_RESTART_COUNT")
            .env_remove("SLURM_SUBMIT_DIR")
            .stdin(stdin)
            .stdout(open())
            .stderr(err);
        if restart > 0 {
            cmd.env("SLURM_RESTART_COUNT", restart.to_string());
        }
        cmd.envs(vars.iter().copied());
        cmd.spawn().expect("start ckpt slurm")
    }

    fn output(&self) -> String {
        read_to_string_lossy(&self.out)
    }

    fn diag(&self) -> String {
        format!(
            "--- job output ---\n{}\n--- wrapper stderr ---\n{}\n--- scontrol.log ---\n{}",
            self.output(),
            read_to_string_lossy(&self.env.root.join("wrapper.err")),
            read_to_string_lossy(&self.env.root.join("scontrol.log"))
        )
    }

    /// Waits until the output shows step `n`, then sends the warning.
    fn warn_after_step(&self, child: &std::process::Child, n: u64) {
        let line = format!("step {n}/");
        assert!(
            wait_until(WRAPPER_TIMEOUT, || self.output().contains(&line)),
            "no step {n}\n{}",
            self.diag()
        );
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR1).expect("send SIGUSR1");
    }

    fn wait(&self, child: std::process::Child) -> i32 {
        self.wait_within(child, WRAPPER_TIMEOUT)
    }

    fn wait_within(&self, mut child: std::process::Child, timeout: Duration) -> i32 {
        let ok = wait_until(timeout, || child.try_wait().ok().flatten().is_some());
        if !ok {
            let _ = child.kill();
            panic!("ckpt slurm did not end\n{}", self.diag());
        }
        child.wait().expect("wait").code().unwrap_or(-1)
    }

    fn latest(&self) -> String {
        std::fs::read_to_string(self.dir.join("LATEST"))
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// The step numbers in the output, in order; each step's sum checked.
    fn steps(&self) -> Vec<u64> {
        crate::slurm_lab::steps(&self.output(), &|| self.diag())
            .into_iter()
            .map(|(_, n)| n)
            .collect()
    }
}

#[test]
fn wrapper_checkpoints_twice_prunes_and_restores_without_slurm() {
    let job = FakeJob::new("slurm-fake");
    // First run: checkpoint, "requeue".
    let run = job.start(0, &["--keep", "1"], None, Stdio::null());
    job.warn_after_step(&run, 5);
    assert_eq!(job.wait(run), 0, "{}", job.diag());
    assert_eq!(job.latest(), "ckpt-1", "{}", job.diag());
    // Asked for the job's record (to register it for the site's hooks;
    // the fake has none), then requeued it, once.
    let calls = read_to_string_lossy(&job.env.root.join("scontrol.log"));
    assert_eq!(
        calls
            .lines()
            .filter(|l| l.starts_with("requeue"))
            .collect::<Vec<_>>(),
        [format!("requeue {FAKE_JOB}")],
        "{}",
        job.diag()
    );
    // The application ran in a PID namespace of its own, so a restart on
    // a node where its pids are taken still gets them back.
    let ckpt1 = job.dir.join("ckpt-1");
    let show = ckpt(
        &job.env,
        &["show", path_str(&ckpt1), "--json"],
        Duration::from_secs(30),
    );
    show.assert_success();
    assert!(
        show.stdout.contains("\"pid_namespace\":{"),
        "the checkpoint is of a PID namespace: {}",
        show.stdout
    );
    // Second run: restored, checkpointed again; --keep 1 removes ckpt-1.
    let run = job.start(1, &["--keep", "1"], None, Stdio::null());
    job.warn_after_step(&run, 15);
    assert_eq!(job.wait(run), 0, "{}", job.diag());
    assert_eq!(job.latest(), "ckpt-2", "{}", job.diag());
    assert!(
        !job.dir.join("ckpt-1").exists(),
        "ckpt-1 not pruned\n{}",
        job.diag()
    );
    // Third run: restored from ckpt-2, runs to the end.
    let run = job.start(2, &["--keep", "1"], None, Stdio::null());
    assert_eq!(job.wait(run), 0, "{}", job.diag());
    assert_eq!(
        job.steps(),
        (1..=FAST_STEPS).collect::<Vec<_>>(),
        "steps not one unbroken sequence\n{}",
        job.diag()
    );
    let done = format!("done {FAST_STEPS} sum {}", step_sum(FAST_STEPS));
    assert!(job.output().lines().any(|l| l == done), "{}", job.diag());
    let err = read_to_string_lossy(&job.env.root.join("wrapper.err"));
    assert_eq!(err.matches("restored pid").count(), 2, "{}", job.diag());
}

#[test]
fn failed_checkpoint_leaves_the_app_running_and_nothing_committed() {
    let job = FakeJob::new("slurm-fail");
    // The application holds a pipe to outside its tree as fd 5, which a
    // dump refuses.
    let victim = job.victim.to_string_lossy().into_owned();
    let steps = FAST_STEPS.to_string();
    let period = FAST_STEP_MS.to_string();
    let script = format!("exec 5<&0; exec {victim} {steps} {period}");
    let app = ["/bin/sh", "-c", script.as_str()];
    // stdin is a pipe from this test, so fd 5 is one to outside the tree.
    let mut run = job.start(0, &[], Some(&app), Stdio::piped());
    let _writer = run.stdin.take();
    job.warn_after_step(&run, 5);
    let code = job.wait(run);
    assert_eq!(
        code,
        0,
        "the application did not run to its end\n{}",
        job.diag()
    );
    assert_eq!(
        job.steps(),
        (1..=FAST_STEPS).collect::<Vec<_>>(),
        "{}",
        job.diag()
    );
    let err = read_to_string_lossy(&job.env.root.join("wrapper.err"));
    let failed: Vec<&str> = err.lines().filter(|l| l.contains("failed")).collect();
    assert_eq!(
        failed.len(),
        1,
        "not one line about the failure\n{}",
        job.diag()
    );
    assert!(
        failed[0].contains("keeps running") && failed[0].contains("fd 5"),
        "{}",
        job.diag()
    );
    assert_eq!(
        job.latest(),
        "",
        "a failed dump was committed\n{}",
        job.diag()
    );
    assert!(
        !read_to_string_lossy(&job.env.root.join("scontrol.log")).contains("requeue"),
        "requeued after a failed dump\n{}",
        job.diag()
    );
}

/// The numbered checkpoint directories (`ckpt-N`) in `dir`, ascending.
fn checkpoint_numbers(dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str()?.strip_prefix("ckpt-")?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// SIGKILLs the process group of every child of `pid` (the application's
/// `ckpt run`, a dump in progress), then `pid`: a node lost outright.
fn kill_node(pid: u32) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGSTOP);
    for c in children
        .split_whitespace()
        .filter_map(|c| c.parse::<i32>().ok())
    {
        let _ = kill(Pid::from_raw(-c), Signal::SIGKILL);
        let _ = kill(Pid::from_raw(c), Signal::SIGKILL);
    }
    let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
}

/// `--every 1 --keep 2 --incremental`: the application is checkpointed
/// every second while it runs on (each checkpoint on the one before),
/// only the two newest stay; the node then dies outright (wrapper and
/// application SIGKILLed), and the job's next start restores the newest
/// committed checkpoint, checkpoints it periodically again and then on
/// the warning (killed, requeued); the third start runs to the end with
/// the right memory.
#[test]
fn periodic_checkpoints_keep_the_newest_and_a_lost_node_restarts_from_it() {
    let job = FakeJob::new("slurm-every");
    let victim = job.victim.to_string_lossy().into_owned();
    let steps: u64 = 80;
    let (steps_arg, period) = (steps.to_string(), FAST_STEP_MS.to_string());
    let app = [victim.as_str(), steps_arg.as_str(), period.as_str()];
    let args = ["--keep", "2", "--every", "1", "--incremental"];
    let mut run = job.start(0, &args, Some(&app), Stdio::null());
    let wrapper_err = job.env.root.join("wrapper.err");
    // Lost right after the third periodic checkpoint is reported (so
    // committed and pruned), a second before the next one is due.
    let periodic = || {
        read_to_string_lossy(&wrapper_err)
            .matches("(periodic,")
            .count()
    };
    assert!(
        wait_until(WRAPPER_TIMEOUT, || periodic() >= 3),
        "no third periodic checkpoint\n{}",
        job.diag()
    );
    kill_node(run.id());
    let _ = run.wait();
    let latest = job.latest();
    let newest: u64 = latest
        .strip_prefix("ckpt-")
        .and_then(|n| n.parse().ok())
        .expect("LATEST names a checkpoint");
    let kept: Vec<u64> = checkpoint_numbers(&job.dir)
        .into_iter()
        .filter(|n| *n <= newest)
        .collect();
    assert_eq!(
        kept,
        [newest - 1, newest],
        "--keep 2 keeps the two newest\n{}",
        job.diag()
    );
    assert!(
        !job.output().contains(&format!("done {steps}")),
        "the application ended before the node was lost\n{}",
        job.diag()
    );
    let err = read_to_string_lossy(&wrapper_err);
    assert!(!err.contains("failed"), "{}", job.diag());
    assert!(
        !read_to_string_lossy(&job.env.root.join("scontrol.log")).contains("requeue"),
        "a periodic checkpoint requeued the job\n{}",
        job.diag()
    );

    // The requeued job restores the newest committed checkpoint, is
    // checkpointed periodically again, then gets the warning: the last
    // checkpoint (--kill, on the periodic one before) and a requeue.
    let err = read_to_string_lossy(&wrapper_err);
    let before = periodic();
    let run = job.start(1, &args, Some(&app), Stdio::null());
    assert!(
        wait_until(WRAPPER_TIMEOUT, || periodic() > before),
        "no periodic checkpoint after the restore\n{}",
        job.diag()
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(run.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR1).expect("send SIGUSR1");
    assert_eq!(job.wait(run), 0, "{}", job.diag());
    let calls = read_to_string_lossy(&job.env.root.join("scontrol.log"));
    assert!(
        calls.contains(&format!("requeue {FAKE_JOB}")),
        "{}",
        job.diag()
    );
    assert_ne!(job.latest(), latest, "{}", job.diag());
    let err_now = read_to_string_lossy(&wrapper_err);
    assert!(
        err_now[err.len()..]
            .lines()
            .any(|l| l.contains("restored pid") && l.ends_with(&format!("/{latest}"))),
        "not restored from {latest}\n{}",
        job.diag()
    );
    let run = job.start(2, &["--keep", "2"], Some(&app), Stdio::null());
    assert_eq!(job.wait(run), 0, "{}", job.diag());
    // Every step's memory was right (checked by `steps`), and the job ends.
    assert_eq!(job.steps().last(), Some(&steps), "{}", job.diag());
    let done = format!("done {steps} sum {}", step_sum(steps));
    assert!(job.output().lines().any(|l| l == done), "{}", job.diag());
}

/// `--every 1 --keep 2 --background` on a job of two "nodes" (a fake
/// `srun` running the step's tasks here, SLURM_JOB_NUM_NODES=2): the two
/// parts are checkpointed together in background rounds while they run on,
/// `ckpt job dump` keeping the two newest epochs; then everything is lost
/// (wrapper, step and both parts SIGKILLed) and the next start restores
/// both parts from the newest committed epoch, each completing with the
/// right memory at every step.
#[test]
fn periodic_background_checkpoints_of_two_nodes_restart_from_the_newest() {
    let job = FakeJob::new("slurm-every-nodes");
    write_executable(&job.bin.join("srun"), FAKE_SRUN);
    let srun_log = job.env.root.join("srun.log");
    let vars = [
        ("SLURM_JOB_NUM_NODES", "2"),
        ("FAKE_SRUN_NODES", "n1,n2"),
        ("FAKE_SRUN_LOG", path_str(&srun_log)),
    ];
    let victim = job.victim.to_string_lossy().into_owned();
    let steps: u64 = 80;
    let (steps_arg, period) = (steps.to_string(), FAST_STEP_MS.to_string());
    let app = [victim.as_str(), steps_arg.as_str(), period.as_str()];
    let args = ["--keep", "2", "--every", "1", "--background"];
    let mut run = job.start_with(0, &args, Some(&app), Stdio::null(), &vars);
    let wrapper_err = job.env.root.join("wrapper.err");
    let periodic = || {
        read_to_string_lossy(&wrapper_err)
            .matches("(periodic,")
            .count()
    };
    assert!(
        wait_until(WRAPPER_TIMEOUT, || periodic() >= 3),
        "no third periodic checkpoint\n{}",
        job.diag()
    );
    let jobdir = job.dir.join("job");
    let roots: Vec<i32> = ["n1", "n2"]
        .iter()
        .map(|p| {
            read_to_string_lossy(&jobdir.join("parts").join(p).join("root.pid"))
                .trim()
                .parse()
                .expect("part root pid")
        })
        .collect();
    kill_node(run.id());
    for pid in &roots {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = run.wait();
    assert!(
        wait_until(WRAPPER_TIMEOUT, || roots
            .iter()
            .all(|p| !Path::new(&format!("/proc/{p}")).exists())),
        "the parts did not die"
    );
    let err = read_to_string_lossy(&wrapper_err);
    assert!(!err.contains("failed"), "{}", job.diag());
    let last: u64 = read_to_string_lossy(&jobdir.join("last-committed"))
        .trim()
        .parse()
        .expect("last-committed");
    for p in ["n1", "n2"] {
        let mut epochs: Vec<u64> = std::fs::read_dir(jobdir.join("parts").join(p))
            .expect("part dir")
            .filter_map(|e| {
                e.ok()?
                    .file_name()
                    .to_str()?
                    .strip_prefix("epoch-")?
                    .parse()
                    .ok()
            })
            .filter(|e| *e <= last)
            .collect();
        epochs.sort_unstable();
        assert_eq!(
            epochs,
            [last - 1, last],
            "part {p}: --keep 2\n{}",
            job.diag()
        );
    }
    let before = job.output().matches(&format!("done {steps}")).count();
    assert_eq!(before, 0, "a part ended before the loss\n{}", job.diag());

    let run = job.start_with(1, &["--keep", "2"], Some(&app), Stdio::null(), &vars);
    assert_eq!(job.wait(run), 0, "{}", job.diag());
    let err = read_to_string_lossy(&wrapper_err);
    assert!(
        err.contains(&format!("epoch-{last}")),
        "not restored from epoch {last}\n{}",
        job.diag()
    );
    job.steps();
    let done = format!("done {steps} sum {}", step_sum(steps));
    assert_eq!(
        job.output().lines().filter(|l| *l == done).count(),
        2,
        "both parts complete\n{}",
        job.diag()
    );
}

/// Rounds of tests/c/mpi_job.c: a few seconds at its pace, long enough that
/// the warning comes while every rank is busy.
const MPI_ROUNDS: u64 = 4000;
/// How long the rest of the ring may take after the restore: four ranks
/// share two cores with whatever else the tests run.
const MPI_TIMEOUT: Duration = Duration::from_secs(300);

/// The job environment of a two-node allocation as Slurm gives a batch
/// script (what an MPI launcher reads to find its nodes and slots).
fn mpi_allocation_vars(nodes: &str, srun_log: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("SLURM_JOB_NUM_NODES", "2".into()),
        ("SLURM_NNODES", "2".into()),
        ("SLURM_JOBID", FAKE_JOB.into()),
        ("SLURM_JOB_NODELIST", "n[1-2]".into()),
        ("SLURM_NODELIST", "n[1-2]".into()),
        ("SLURM_TASKS_PER_NODE", "2(x2)".into()),
        ("SLURM_JOB_CPUS_PER_NODE", "2(x2)".into()),
        ("SLURMD_NODENAME", "n1".into()),
        ("FAKE_SRUN_NODES", nodes.into()),
        ("FAKE_SRUN_LOG", path_str(srun_log).into()),
    ]
}

/// An MPI launcher under `ckpt slurm` in an allocation of two "nodes" (a
/// fake `srun` running the step's tasks here), `launcher PLACEMENT
/// mpi_job`: the launcher runs once, as node n1's part with its ranks,
/// and the daemon it starts for node n2 (only: in its own UTS namespace
/// the launcher finds n1 in the allocation), through ckpt's stand-in for
/// `via` (srun or ssh), is n2's part with the others. The warning
/// checkpoints both parts (after at least one periodic checkpoint in the
/// background, the ring running on) and requeues; the restart restores
/// them on swapped nodes, the stand-in learns that its daemon ended from
/// the restored part, and the ring's result is right.
fn mpi_launcher_across_a_restart(
    test: &str,
    launcher: &str,
    placement: &[&str],
    bin: &Path,
    daemon: &str,
    mpi_vars: &[(&str, &str)],
) {
    let job = FakeJob::new(test);
    write_executable(&job.bin.join("srun"), FAKE_SRUN);
    let srun_log = job.env.root.join("srun.log");
    let work = job.env.work.display().to_string();
    let rounds = MPI_ROUNDS.to_string();
    let app: Vec<&str> = std::iter::once(launcher)
        .chain(placement.iter().copied())
        .chain([
            bin.to_str().expect("utf-8 path"),
            work.as_str(),
            rounds.as_str(),
        ])
        .collect();
    let progress = || -> u64 {
        read_to_string_lossy(&job.env.work.join("progress"))
            .trim()
            .parse()
            .unwrap_or(0)
    };
    let diag = || {
        format!(
            "{}\n--- srun.log ---\n{}\nprogress {}",
            job.diag(),
            read_to_string_lossy(&srun_log),
            progress()
        )
    };
    let first = mpi_allocation_vars("n1,n2", &srun_log);
    let vars: Vec<(&str, &str)> = first
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .chain(mpi_vars.iter().copied())
        .collect();
    // Periodic background checkpoints while the ring runs, then the
    // warning's.
    let run = job.start_with(
        0,
        &["--every", "2", "--background"],
        Some(app.as_slice()),
        Stdio::null(),
        &vars,
    );
    let periodic = || {
        read_to_string_lossy(&job.env.root.join("wrapper.err"))
            .matches("(periodic,")
            .count()
    };
    assert!(
        wait_until(WRAPPER_TIMEOUT, || progress() >= 500 && periodic() >= 1),
        "the ring does not run, or no periodic checkpoint\n{}",
        diag()
    );
    assert!(
        !read_to_string_lossy(&job.env.root.join("wrapper.err")).contains("failed"),
        "{}",
        diag()
    );
    let launches: Vec<String> = read_to_string_lossy(&srun_log)
        .lines()
        .filter(|l| l.contains(daemon))
        .map(str::to_string)
        .collect();
    assert_eq!(launches.len(), 1, "one daemon launch\n{}", diag());
    assert!(
        launches[0].contains("--nodelist=n2") && launches[0].contains("job run --dir"),
        "the daemon goes to n2 only, as a part\n{}",
        diag()
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(run.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR1).expect("send SIGUSR1");
    assert_eq!(job.wait(run), 0, "{}", diag());
    let at_dump = progress();
    let calls = read_to_string_lossy(&job.env.root.join("scontrol.log"));
    assert!(calls.contains(&format!("requeue {FAKE_JOB}")), "{}", diag());
    assert!(
        !job.env.work.join("result").exists(),
        "the ring ended before its checkpoint\n{}",
        diag()
    );

    let swapped = mpi_allocation_vars("n2,n1", &srun_log);
    let vars: Vec<(&str, &str)> = swapped
        .iter()
        .map(|(k, v)| (*k, v.as_str()))
        .chain(mpi_vars.iter().copied())
        .collect();
    let run = job.start_with(1, &[], Some(app.as_slice()), Stdio::null(), &vars);
    assert_eq!(job.wait_within(run, MPI_TIMEOUT), 0, "{}", diag());
    let result = read_to_string_lossy(&job.env.work.join("result"));
    assert!(
        result.starts_with("PASS"),
        "ring after a restore at round {at_dump}: {result}\n{}",
        diag()
    );
    let node_of_mpirun = read_to_string_lossy(&job.dir.join("job/parts/n1/node"));
    assert_eq!(
        node_of_mpirun.trim(),
        "n2",
        "restored on swapped nodes\n{}",
        diag()
    );
    let launches = read_to_string_lossy(&srun_log)
        .lines()
        .filter(|l| l.contains(daemon))
        .count();
    assert_eq!(launches, 1, "no daemon launched again\n{}", diag());
}

/// Open MPI's `mpirun`: its `orted` for n2 comes through the srun
/// stand-in with ckpt's launch agent.
#[test]
fn mpi_launcher_runs_once_and_its_daemon_is_the_other_part_across_a_restart() {
    let bin = mpi_victim_bin("mpi_job");
    let vars = [
        ("OMPI_ALLOW_RUN_AS_ROOT", "1"),
        ("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"),
        ("OMPI_MCA_btl", "self,tcp"),
        ("OMPI_MCA_btl_tcp_if_include", "lo"),
        ("OMPI_MCA_oob_tcp_if_include", "lo"),
    ];
    mpi_launcher_across_a_restart(
        "slurm-mpirun",
        "mpirun",
        &["-np", "4"],
        &bin,
        " orted ",
        &vars,
    );
}

/// MPICH's `mpiexec` (hydra): its proxy for n2 comes through the ssh
/// stand-in, the one for n1 is forked inside mpiexec's part; the ranks
/// talk through UCX (nested epolls, shared-memory segments, SysV). One
/// rank per node: with more, MPICH 4.0 over UCX 1.13's TCP transport
/// hangs in `MPI_Finalize` in most runs, with or without ckpt (a rank
/// closing its endpoints waits for a peer already blocked in the PMI
/// barrier; `UCX_TLS=tcp,self mpiexec -np 4` on one host shows it).
#[test]
fn mpich_launcher_runs_once_and_its_proxy_is_the_other_part_across_a_restart() {
    let bin = mpich_victim_bin("mpi_job");
    // The fake nodes' names resolve nowhere: hydra's proxies dial back
    // on loopback.
    let vars = [("HYDRA_IFACE", "lo")];
    mpi_launcher_across_a_restart(
        "slurm-mpich",
        "mpiexec.mpich",
        &["-ppn", "1", "-np", "2"],
        &bin,
        "hydra_pmi_proxy",
        &vars,
    );
}
