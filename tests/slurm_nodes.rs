//! `ckpt slurm` for a job of two nodes under a real Slurm (the two-node lab
//! on localhost, `scripts/slurm/lab-up.sh --nodes 2`: nodes n1 and n2 are
//! two slurmds of this host): a batch job `-N 2` whose two parts exchange
//! checked messages over TCP (tests/c/netpeer.c, the server on node 0, the
//! client on node 1, each choosing its role from SLURM_NODEID) is
//! checkpointed as a whole on the time-limit warning, requeued, restored
//! when Slurm starts it again, and completes: both sides end with the
//! digest of the whole uninterrupted exchange.
//!
//! Takes 2-4 minutes: Slurm's warning comes on a 30 s timer, and a
//! requeued job waits the lab's credential lifetime (30 s) before it runs.
//!
//! Without Slurm (a fake `srun` and `scontrol`, seconds): a part that
//! cannot be dumped makes the checkpoint fail in one line naming the part,
//! its node and the reason, and both parts run on unharmed, nothing
//! committed or requeued.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::*;
use crate::slurm_lab::*;

/// Rounds of the exchange: about 60 s at netpeer's pace (1 ms a round
/// plus the work), long enough that the warning always comes during it.
pub(crate) const ROUNDS: u64 = 52_000;
/// Bytes of a message after its sequence number (netpeer.c `PAYLOAD`).
const PAYLOAD: usize = 4000;
/// The server's port on 127.0.0.1 (both fake nodes are this host).
const PORT: u16 = 47131;
/// Time limit and warning lead: Slurm looks at time limits every 30 s and
/// warns at the first look that is less than lead + 30 s before the
/// limit, here 15-45 s into a run (later if the look is late). A restored
/// run with more of the exchange left than that is checkpointed again,
/// which the test accepts (the exchange must stay one).
const TIME_LIMIT: &str = "2:00";
const WARN_LEAD_SECS: u32 = 75;
/// Every run, requeue delay and scheduling, with slack.
const JOB_TIMEOUT: Duration = Duration::from_secs(330);
/// How often the job's state is asked for.
const JOB_POLL: Duration = Duration::from_secs(2);

/// netpeer.c's `mix`.
fn mix(mut h: u64, v: u64) -> u64 {
    h ^= v
        .wrapping_add(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(h << 6)
        .wrapping_add(h >> 2);
    h.wrapping_mul(0x100_0000_01b3)
}

/// The digest both sides report after `rounds` rounds of an exchange in
/// which nothing was lost, repeated or reordered (netpeer.c's loop: each
/// message's last payload byte, from `fill`, enters the digest).
pub(crate) fn expected_digest(rounds: u64) -> String {
    let mut digest: u64 = 1_469_598_103_934_665_603;
    for seq in 0..rounds {
        let mut seed = mix(digest, seq);
        for i in 0..PAYLOAD as u64 {
            seed = mix(seed, i);
        }
        let last = (seed >> 24) & 0xff;
        digest = mix(digest, mix(seq, last));
    }
    format!("PASS {digest:016x}")
}

fn progress(work: &Path) -> u64 {
    read_to_string_lossy(&work.join("progress-server"))
        .trim()
        .parse()
        .unwrap_or(0)
}

fn diagnose(env: &TestEnv, job: &str, output: &Path) -> String {
    let results: Vec<String> = ["server", "client"]
        .iter()
        .map(|r| {
            format!(
                "{r}: result {:?} progress {:?}",
                read_to_string_lossy(&env.work.join(format!("result-{r}"))),
                read_to_string_lossy(&env.work.join(format!("progress-{r}")))
            )
        })
        .collect();
    format!(
        "job record: {}\n{}\n--- job output ---\n{}\n--- slurmctld.log (last 30 lines, newest first) ---\n{}",
        Lab::Two.record(job),
        results.join("\n"),
        read_to_string_lossy(output),
        Lab::Two.ctld_log_tail(30)
    )
}

/// A script that runs `node0` on the job's node 0 and `node1` on node 1
/// (by `SLURM_NODEID`), each replacing the shell.
fn role_script(env: &TestEnv, node0: &str, node1: &str) -> std::path::PathBuf {
    let role = env.root.join("role.sh");
    std::fs::write(
        &role,
        format!(
            "#!/bin/sh\n\
             case \"$SLURM_NODEID\" in\n\
             0) exec {node0} ;;\n\
             1) exec {node1} ;;\n\
             *) echo \"role.sh: SLURM_NODEID=$SLURM_NODEID: no role\" >&2; exit 2 ;;\n\
             esac\n"
        ),
    )
    .expect("write role script");
    role
}

/// Waits until `job` ends, within [`JOB_TIMEOUT`] of `started`, and
/// checks that it completed with exit 0 after a requeue. Returns its last
/// record and what `at_requeue` (the application's progress, and whether
/// it had ended) said when the first requeue was seen.
fn await_requeued_job<T>(
    job: &str,
    started: Instant,
    diag: &dyn Fn() -> String,
    at_requeue: impl Fn() -> T,
) -> (String, Option<T>) {
    let mut seen = None;
    let mut last;
    let ended = loop {
        let out = Lab::Two
            .client("scontrol")
            .args(["show", "job", "-o", job])
            .output()
            .expect("run scontrol");
        last = String::from_utf8_lossy(&out.stdout).into_owned();
        let restarts: u32 = field(&last, "Restarts")
            .and_then(|r| r.parse().ok())
            .unwrap_or(0);
        if restarts >= 1 && seen.is_none() {
            seen = Some(at_requeue());
        }
        if job_over(&last) {
            break true;
        }
        if started.elapsed() > JOB_TIMEOUT {
            break false;
        }
        std::thread::sleep(JOB_POLL);
    };
    if !ended {
        let _ = Lab::Two.client("scancel").arg(job).status();
        panic!("job {job} did not end within {JOB_TIMEOUT:?}\n{}", diag());
    }
    eprintln!(
        "job {job} ended after {:.0} s: {}",
        started.elapsed().as_secs_f64(),
        field(&last, "JobState").unwrap_or("?")
    );
    assert_eq!(field(&last, "JobState"), Some("COMPLETED"), "{}", diag());
    assert_eq!(field(&last, "ExitCode"), Some("0:0"), "{}", diag());
    let restarts: u32 = field(&last, "Restarts")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    assert!(restarts >= 1, "job was never requeued\n{}", diag());
    (last, seen)
}

#[test]
fn job_of_two_nodes_exchanging_over_tcp_is_checkpointed_requeued_and_restored() {
    let Some(lab) = Lab::Two.take() else {
        return;
    };

    let env = TestEnv::new("slurm-nodes");
    let netpeer = victim_bin("netpeer");
    let role = role_script(
        &env,
        &format!(
            "{} server {} 127.0.0.1 {PORT} {ROUNDS}",
            netpeer.display(),
            env.work.display()
        ),
        &format!(
            "{} client {} 127.0.0.1 {PORT} {ROUNDS}",
            netpeer.display(),
            env.work.display()
        ),
    );
    let script = env.root.join("job.sh");
    let output = env.root.join("job.out");
    let dir = env.root.join("ckpt");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\nexport CKPT_IMAGE_KEY={key}\nexec {ckpt} slurm --dir {dir} -- /bin/sh {role}\n",
            key = env.image_key().display(),
            ckpt = CKPT,
            dir = dir.display(),
            role = role.display(),
        ),
    )
    .expect("write batch script");
    // Computed while the job runs.
    let expected = std::thread::spawn(|| expected_digest(ROUNDS));

    let started = Instant::now();
    let job = Lab::Two.sbatch(&[
        "--nodes=2",
        "--ntasks-per-node=1",
        "--requeue",
        "--open-mode=append",
        &format!("--signal=B:USR1@{WARN_LEAD_SECS}"),
        &format!("--time={TIME_LIMIT}"),
        "--job-name=ckpt-slurm-nodes",
        "--output",
        path_str(&output),
        path_str(&script),
    ]);
    let diag = || diagnose(&env, &job, &output);

    // Until the job record says it ended; the exchange's progress when
    // the job was first requeued says where the checkpoint fell.
    let (last, at_requeue) = await_requeued_job(&job, started, &diag, || {
        (
            progress(&env.work),
            env.work.join("result-server").exists() || env.work.join("result-client").exists(),
        )
    });
    let restarts: u32 = field(&last, "Restarts")
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    let (progress_at_requeue, ended_at_requeue) =
        at_requeue.unwrap_or_else(|| panic!("the requeue was not seen\n{}", diag()));
    assert!(
        !ended_at_requeue && progress_at_requeue < ROUNDS,
        "the checkpoint came after the exchange ended (round {progress_at_requeue})\n{}",
        diag()
    );

    // Both sides checked every byte and end with the digest of the whole
    // exchange as if it had never stopped: nothing lost or repeated.
    let expected = expected.join().expect("digest thread");
    for r in ["server", "client"] {
        let got = read_to_string_lossy(&env.work.join(format!("result-{r}")));
        assert_eq!(got, expected, "{r}'s result\n{}", diag());
    }

    // One part per node, each checkpointed and restored with the job.
    let text = read_to_string_lossy(&output);
    let lines: Vec<&str> = text.lines().collect();
    let checkpoints: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| {
            l.starts_with("ckpt slurm: the job's 2 parts checkpointed into ")
                && l.contains(" epoch-")
        })
        .map(|(at, _)| at)
        .collect();
    let restores: Vec<usize> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains(": restoring the job's 2 parts from "))
        .map(|(at, _)| at)
        .collect();
    assert_eq!(
        checkpoints.len(),
        usize::try_from(restarts).unwrap(),
        "one checkpoint per requeue\n{}",
        diag()
    );
    assert_eq!(
        restores.len(),
        checkpoints.len(),
        "one restore per checkpoint\n{}",
        diag()
    );
    assert!(
        checkpoints.iter().zip(&restores).all(|(c, r)| c < r),
        "every restore follows its checkpoint\n{}",
        diag()
    );
    assert!(!text.contains("ckpt slurm: checkpoint of"), "{}", diag());
    let jobdir = dir.join("job");
    for node in ["n1", "n2"] {
        assert_eq!(
            read_to_string_lossy(&jobdir.join("parts").join(node).join("node")).trim(),
            node,
            "part {node} ran on its node\n{}",
            diag()
        );
    }

    if lab.started {
        Lab::Two.down();
    }
}

/// Rounds of tests/c/mpi_job.c's ring: about a minute in the lab (four
/// ranks and Slurm share two cores), so the warning comes while every rank
/// is busy.
const MPI_ROUNDS: u64 = 6_000;

/// An Open MPI job as users run it: `mpirun -np 4` inside a batch job of
/// two nodes with two tasks each, under `ckpt slurm`. mpirun runs once,
/// as node n1's part with two ranks; the `orted` it starts on n2 through
/// Slurm's srun (behind ckpt's stand-in) is n2's part with the other two.
/// The time-limit warning checkpoints both parts, the job is requeued and
/// restored, and the ring (every value depending on every earlier message
/// of every rank) ends with the result computed without MPI.
#[test]
fn open_mpi_job_launched_by_mpirun_across_two_nodes_is_checkpointed_requeued_and_restored() {
    let Some(lab) = Lab::Two.take() else {
        return;
    };
    let env = TestEnv::new("slurm-mpirun");
    let bin = mpi_victim_bin("mpi_job");
    let script = env.root.join("job.sh");
    let output = env.root.join("job.out");
    let dir = env.root.join("ckpt");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n\
             export CKPT_IMAGE_KEY={key}\n\
             # Both fake nodes are this host: ranks talk TCP on loopback.\n\
             export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n\
             export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo\n\
             exec {ckpt} slurm --dir {dir} -- mpirun -np 4 {bin} {work} {MPI_ROUNDS}\n",
            key = env.image_key().display(),
            ckpt = CKPT,
            dir = dir.display(),
            bin = bin.display(),
            work = env.work.display(),
        ),
    )
    .expect("write batch script");
    let progress = || -> u64 {
        read_to_string_lossy(&env.work.join("progress"))
            .trim()
            .parse()
            .unwrap_or(0)
    };
    let started = Instant::now();
    let job = Lab::Two.sbatch(&[
        "--nodes=2",
        "--ntasks-per-node=2",
        "--requeue",
        "--open-mode=append",
        &format!("--signal=B:USR1@{WARN_LEAD_SECS}"),
        &format!("--time={TIME_LIMIT}"),
        "--job-name=ckpt-slurm-mpirun",
        "--output",
        path_str(&output),
        path_str(&script),
    ]);
    let diag = || {
        format!(
            "job record: {}\nprogress {} result {:?}\n--- job output ---\n{}\n--- slurmctld.log (last 30 lines, newest first) ---\n{}",
            Lab::Two.record(&job),
            progress(),
            read_to_string_lossy(&env.work.join("result")),
            read_to_string_lossy(&output),
            Lab::Two.ctld_log_tail(30)
        )
    };
    let (_, at_requeue) = await_requeued_job(&job, started, &diag, || {
        (progress(), env.work.join("result").exists())
    });
    let (at_requeue, ended) =
        at_requeue.unwrap_or_else(|| panic!("the requeue was not seen\n{}", diag()));
    assert!(
        !ended,
        "the checkpoint came after the ring ended (round {at_requeue})\n{}",
        diag()
    );
    let result = read_to_string_lossy(&env.work.join("result"));
    assert!(
        result.starts_with("PASS"),
        "ring restored at round {at_requeue}: {result}\n{}",
        diag()
    );
    assert_two_parts_checkpointed_and_restored(
        &read_to_string_lossy(&output),
        Some("ckpt slurm: mpirun (Open MPI) runs once, as node n1's part"),
        &diag,
    );
    if lab.started {
        Lab::Two.down();
    }
}

/// Ends what the test without Slurm started if it fails midway: the
/// wrapper (our child) and the parts' PID-namespace inits (only pids that
/// are still ckpt processes), which takes their trees with them.
struct Cleanup {
    wrapper: std::process::Child,
    jobdir: std::path::PathBuf,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.wrapper.try_wait().ok().flatten().is_some() {
            return;
        }
        for part in ["fake1", "fake2"] {
            let root = read_to_string_lossy(&self.jobdir.join("parts").join(part).join("root.pid"));
            if let Ok(pid) = root.trim().parse::<i32>()
                && exe_of(pid).is_some_and(|e| e == Path::new(CKPT))
            {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        let _ = self.wrapper.kill();
        let _ = self.wrapper.wait();
    }
}

/// Job id the test without Slurm pretends to run as.
const FAKE_JOB: &str = "4243";
const FAKE_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn refused_part_fails_the_checkpoint_in_one_line_and_every_part_runs_on() {
    let env = TestEnv::new("slurm-nodes-refused");
    let bin = env.root.join("bin");
    std::fs::create_dir(&bin).expect("create fake bin dir");
    let srun_log = env.root.join("srun.log");
    let scontrol_log = env.root.join("scontrol.log");
    for (name, text) in [
        ("srun", FAKE_SRUN.to_string()),
        (
            "scontrol",
            format!("#!/bin/sh\necho \"$@\" >> {}\n", scontrol_log.display()),
        ),
    ] {
        let path = bin.join(name);
        write_executable(&path, &text);
    }
    // Node 0 runs an ordinary victim, node 1 one holding a netlink socket.
    let works = [env.root.join("work-0"), env.root.join("work-1")];
    for w in &works {
        std::fs::create_dir(w).expect("create part work dir");
    }
    let role = role_script(
        &env,
        &format!("{} {}", victim_bin("counter").display(), works[0].display()),
        &format!(
            "{} {}",
            victim_bin("unsupported").display(),
            works[1].display()
        ),
    );
    let err_path = env.root.join("wrapper.err");
    let err = std::fs::File::create(&err_path).expect("create wrapper stderr");
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let wrapper = env
        .ckpt_command()
        .arg("slurm")
        .arg("--dir")
        .arg(env.root.join("ckpt"))
        .arg("--")
        .arg("/bin/sh")
        .arg(&role)
        .env("PATH", path)
        .env("SLURM_JOB_ID", FAKE_JOB)
        .env("SLURM_JOB_NUM_NODES", "2")
        .env("FAKE_SRUN_NODES", "fake1,fake2")
        .env("FAKE_SRUN_LOG", &srun_log)
        .env_remove("SLURM_RESTART_COUNT")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(err)
        .spawn()
        .expect("start ckpt slurm");
    let mut run = Cleanup {
        wrapper,
        jobdir: env.root.join("ckpt/job"),
    };
    let diag = || {
        format!(
            "--- wrapper stderr ---\n{}\n--- srun.log ---\n{}\n--- scontrol.log ---\n{}",
            read_to_string_lossy(&err_path),
            read_to_string_lossy(&srun_log),
            read_to_string_lossy(&scontrol_log)
        )
    };
    assert!(
        wait_until(FAKE_TIMEOUT, || works
            .iter()
            .all(|w| w.join("ready").exists())),
        "the parts did not start\n{}",
        diag()
    );
    let pid = nix::unistd::Pid::from_raw(i32::try_from(run.wrapper.id()).expect("pid"));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGUSR1).expect("send SIGUSR1");
    assert!(
        wait_until(FAKE_TIMEOUT, || read_to_string_lossy(&err_path)
            .contains("ckpt slurm: checkpoint of")),
        "no line about the checkpoint\n{}",
        diag()
    );
    let text = read_to_string_lossy(&err_path);
    let failed: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("ckpt slurm: checkpoint of"))
        .collect();
    assert_eq!(failed.len(), 1, "{}", diag());
    assert!(
        failed[0].starts_with(
            "ckpt slurm: checkpoint of the job's 2 parts failed, the application keeps running (no checkpoint committed): "
        ) && failed[0].contains("part fake2 (node fake2)")
            && failed[0].contains("netlink socket not supported"),
        "one line naming the part, its node and the reason\n{}",
        diag()
    );
    assert!(
        !read_to_string_lossy(&scontrol_log).contains("requeue"),
        "requeued after a failed checkpoint\n{}",
        diag()
    );
    // Both parts run on unharmed and pass their own checks; the wrapper
    // ends with them.
    for w in &works {
        std::fs::write(w.join("go"), "").expect("write go");
    }
    assert!(
        wait_until(FAKE_TIMEOUT, || works
            .iter()
            .all(|w| w.join("result").exists())),
        "the parts did not report\n{}",
        diag()
    );
    for w in &works {
        assert_eq!(
            read_to_string_lossy(&w.join("result")),
            "PASS",
            "{}\n{}",
            w.display(),
            diag()
        );
    }
    let ended = wait_until(FAKE_TIMEOUT, || {
        run.wrapper.try_wait().ok().flatten().is_some()
    });
    assert!(ended, "ckpt slurm did not end with its parts\n{}", diag());
    let status = run.wrapper.wait().expect("wait for ckpt slurm");
    assert_eq!(status.code(), Some(0), "{}", diag());
}
