//! The PMIx server of `srun --mpi=pmix` (Slurm's `mpi/pmix` plugin in
//! slurmstepd) takes a rank's connection made by ckpt's client handshake
//! (`ckpt_restorer::pmix`), the piece a restore into a new step of the same
//! job would need to give a restored rank a live server again.
//!
//! Two-node lab (`scripts/slurm/lab-up.sh --nodes 2`): a step of two tasks,
//! one a node, whose tasks never call `PMIx_Init` themselves; each node's
//! server accepts the connection of its own rank (as that rank's namespace,
//! rank, uid and gid, from the task's environment) and refuses the other
//! node's rank; over the accepted connections each rank finalizes as
//! libpmix does, and the step then ends as a clean one (a server that lost
//! a rank that had not finalized makes Slurm cancel the step).
//!
//! Takes about 10 s.
//!
//! And as users run it (2 to 6 minutes): `ckpt slurm -- srun --mpi=pmix
//! RING` in a batch job of two nodes, checkpointed on the time-limit
//! warning, requeued and restored by the wrapper, the ring ending with the
//! right result.
//!
//! Then the whole of it by hand (1 to 3 minutes): an Open MPI ring of two ranks,
//! one a node, launched by `srun --mpi=pmix` inside a batch job, each rank
//! under its node's `ckpt job run`, is checkpointed mid-ring with `ckpt
//! job dump --pmix-reconnect --kill`, the job requeued, and the restarted
//! batch script's first step restores it (`ckpt job restore --pmix`): each
//! rank gets a connection to its node's new slurmstepd, the ring ends with
//! the result computed without MPI, and MPI_Finalize's fence and finalize
//! go through the new servers.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use ckpt_restorer::pmix::{PmixError, PmixServer};

use crate::common::*;
use crate::slurm_lab::*;

/// Ranks of the step, one a node.
const RANKS: u32 = 2;
/// Until every task has written its environment, with slack for a lab
/// that is still starting its slurmds.
const TASKS_TIMEOUT: Duration = Duration::from_secs(60);
/// Until the step ends once its tasks may.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// PMIx's `PMIX_FINALIZE_CMD`.
const FINALIZE_CMD: u8 = 5;
/// The tag this test gives its one request (any but the handshake's).
const REQUEST_TAG: u32 = 1;
/// The count libpmix packs before every value (one), encoded.
const ONE_VALUE: u8 = 2;

/// Decodes one of libpmix 4's variable-length integers (`psquash
/// flex128`: seven bits a byte, low bits first, the top bit for "more";
/// a signed value shifted left by one with its sign in the low bit, its
/// magnitude complemented when negative) at the start of `b`.
fn flex_signed(b: &[u8]) -> i64 {
    let mut raw: u64 = 0;
    for (i, byte) in b.iter().enumerate() {
        raw |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            break;
        }
    }
    let magnitude = raw >> 1;
    if raw & 1 == 1 {
        !magnitude as i64
    } else {
        magnitude as i64
    }
}

/// The `KEY=VALUE` lines of `env` (a task's `env` output).
fn vars(env: &str) -> Vec<(&str, &str)> {
    env.lines().filter_map(|l| l.split_once('=')).collect()
}

/// Sends `PMIx_Finalize`'s request on a connected client socket, as
/// libpmix does (a header of four network-order words, then the packed
/// command: a count of one and the command byte), and returns the status
/// the server answers (packed the same way).
fn finalize(stream: &mut TcpStream) -> i32 {
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("set a read timeout");
    let body = [ONE_VALUE, FINALIZE_CMD];
    let mut msg = Vec::new();
    for word in [u32::MAX, REQUEST_TAG, body.len() as u32, 0] {
        msg.extend_from_slice(&word.to_be_bytes());
    }
    msg.extend_from_slice(&body);
    stream.write_all(&msg).expect("send the finalize request");
    let mut header = [0u8; 16];
    stream
        .read_exact(&mut header)
        .expect("read the finalize reply's header");
    let word = |at: usize| u32::from_be_bytes(header[at..at + 4].try_into().unwrap());
    assert_eq!(word(4), REQUEST_TAG, "the reply answers the request");
    let mut reply = vec![0u8; word(8) as usize];
    stream
        .read_exact(&mut reply)
        .expect("read the finalize reply");
    assert!(
        reply.len() >= 2 && reply[0] == ONE_VALUE,
        "one status in the reply: {reply:?}"
    );
    flex_signed(&reply[1..]) as i32
}

/// Kills the step's srun if the test fails midway.
struct Step(std::process::Child);

impl Drop for Step {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[test]
fn slurmstepd_accepts_a_ranks_connection_made_by_ckpts_pmix_handshake() {
    let Some(lab) = Lab::Two.take() else {
        return;
    };
    let env = TestEnv::new("slurm-pmix-handshake");
    let done = env.work.join("done");
    let task = format!(
        "env > {work}/env.$SLURM_PROCID.tmp && mv {work}/env.$SLURM_PROCID.tmp {work}/env.$SLURM_PROCID; \
         while [ ! -e {done} ]; do sleep 0.2; done",
        work = env.work.display(),
        done = done.display(),
    );
    let mut step = Step(
        Lab::Two
            .client("srun")
            .args([
                "--nodes=2",
                "--ntasks=2",
                "--ntasks-per-node=1",
                "--mpi=pmix",
                "--time=2",
                "bash",
                "-c",
                &task,
            ])
            // What ckpt would set for a job it restores: no data store of
            // the server mapped into the ranks.
            .env("PMIX_MCA_gds", "hash")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run srun"),
    );
    let env_of = |rank: u32| env.work.join(format!("env.{rank}"));
    for rank in 0..RANKS {
        assert!(
            wait_for_file(&env_of(rank), TASKS_TIMEOUT),
            "task {rank} of the step did not start"
        );
    }
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    let texts: Vec<String> = (0..RANKS)
        .map(|r| read_to_string_lossy(&env_of(r)))
        .collect();
    let identities: Vec<_> = texts
        .iter()
        .map(|t| PmixServer::from_env(vars(t), uid, gid).expect("a task's PMIx environment"))
        .collect();
    let (server0, client0) = &identities[0];
    let (server1, client1) = &identities[1];
    assert_eq!(client0.nspace, client1.nspace, "one namespace for the step");
    assert!(
        client0.nspace.starts_with("slurm.pmix."),
        "{}",
        client0.nspace
    );
    assert_ne!(server0.addr, server1.addr, "a server per node");

    // Each node's server refuses the other node's rank: it serves only
    // the ranks it registered.
    let refused = server0.connect(client1).unwrap_err();
    assert!(
        matches!(refused, PmixError::NotServed { rank: 1, .. }),
        "{refused}"
    );

    let mut connections = Vec::new();
    for (server, client) in &identities {
        let c = server.connect(client).unwrap_or_else(|e| {
            panic!("rank {}: {e}\n{}", client.rank, Lab::Two.ctld_log_tail(20))
        });
        connections.push((client.rank, c));
    }
    for (rank, c) in &mut connections {
        assert_eq!(finalize(&mut c.stream), 0, "rank {rank} finalized");
    }
    std::fs::write(&done, b"").expect("let the tasks end");
    let started = Instant::now();
    let status = loop {
        if let Some(s) = step.0.try_wait().expect("wait for srun") {
            break s;
        }
        assert!(
            started.elapsed() < STEP_TIMEOUT,
            "the step did not end once its tasks could"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(connections);
    let mut stderr = String::new();
    if let Some(mut e) = step.0.stderr.take() {
        let _ = e.read_to_string(&mut stderr);
    }
    assert!(
        status.success(),
        "the step ends cleanly after its ranks finalized over ckpt's connections ({status}):\n{stderr}"
    );
    if lab.started {
        Lab::Two.down();
    }
}

/// Rounds of tests/c/mpi_job.c's ring (2 ms a round at least): long
/// enough that the checkpoint comes mid-ring.
const RING_ROUNDS: u64 = 10_000;
/// The checkpoint is taken once the ring has done this many.
const DUMP_AT: u64 = 2_000;
/// Both runs, the requeue delay and scheduling, with slack.
const RING_TIMEOUT: Duration = Duration::from_secs(300);

/// The batch script: the first run starts the ring, checkpoints it and
/// requeues the job; the restarted one restores it in its first step.
fn ring_script(env: &TestEnv, bin: &Path, jobdir: &Path) -> String {
    format!(
        "#!/bin/bash\n\
         export CKPT_IMAGE_KEY={key}\n\
         export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n\
         export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo\n\
         # No data store of slurmstepd's mapped into the ranks.\n\
         export PMIX_MCA_gds=hash\n\
         W={work}\n\
         if [ \"${{SLURM_RESTART_COUNT:-0}}\" = 0 ]; then\n\
           srun --mpi=pmix --nodes=2 --ntasks=2 --ntasks-per-node=1 {ckpt} job run --dir {jobdir} -- {bin} $W {RING_ROUNDS} &\n\
           until [ \"$(cat $W/progress 2>/dev/null || echo 0)\" -ge {DUMP_AT} ] || [ -e $W/result ]; do sleep 0.5; done\n\
           echo \"checkpoint at round $(cat $W/progress)\"\n\
           {ckpt} job dump --dir {jobdir} --launch srun --kill --pmix-reconnect\n\
           echo \"dump exit $?\"\n\
           scontrol requeue $SLURM_JOB_ID\n\
           sleep 300\n\
         else\n\
           {ckpt} job restore --dir {jobdir} --launch srun --pmix\n\
           echo \"restore exit $?\"\n\
         fi\n",
        key = env.image_key().display(),
        work = env.work.display(),
        ckpt = CKPT,
        jobdir = jobdir.display(),
        bin = bin.display(),
    )
}

#[test]
fn open_mpi_ring_launched_by_srun_mpi_pmix_is_checkpointed_requeued_and_reconnected() {
    let Some(lab) = Lab::Two.take() else {
        return;
    };
    let env = TestEnv::new("slurm-pmix-ring");
    let bin = mpi_victim_bin("mpi_job");
    let script = env.root.join("job.sh");
    let output = env.root.join("job.out");
    std::fs::write(&script, ring_script(&env, &bin, &env.root.join("job")))
        .expect("write the batch script");
    let job = Lab::Two.sbatch(&[
        "--nodes=2",
        "--ntasks-per-node=1",
        "--requeue",
        "--open-mode=append",
        "--time=6",
        "--job-name=ckpt-slurm-pmix",
        "--output",
        path_str(&output),
        path_str(&script),
    ]);
    let diag = || {
        format!(
            "job record: {}\n--- job output ---\n{}\n--- slurmctld.log (last 20 lines) ---\n{}",
            Lab::Two.record(&job),
            read_to_string_lossy(&output),
            Lab::Two.ctld_log_tail(20)
        )
    };
    let started = Instant::now();
    let result = env.work.join("result");
    while !read_to_string_lossy(&output).contains("restore exit") {
        assert!(
            started.elapsed() < RING_TIMEOUT,
            "the job did not end its restored run\n{}",
            diag()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let _ = Lab::Two.client("scancel").arg(&job).status();
    let text = read_to_string_lossy(&output);
    assert!(text.contains("dump exit 0"), "{}", diag());
    assert!(text.contains("restore exit 0"), "{}", diag());
    let at: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("checkpoint at round "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no checkpoint line\n{}", diag()));
    assert!(at < RING_ROUNDS, "checkpointed mid-ring\n{}", diag());
    let result = read_to_string_lossy(&result);
    assert!(
        result.starts_with("PASS"),
        "ring restored at round {at}: {result}\n{}",
        diag()
    );
    // Each part's images hold its rank's link to slurmstepd, not a TCP
    // connection.
    let parts = env.root.join("job").join("parts");
    let mut links = Vec::new();
    for part in std::fs::read_dir(&parts).expect("the job's parts") {
        let part = part.expect("a part").path();
        for epoch in std::fs::read_dir(&part).expect("a part's epochs") {
            let epoch = epoch.expect("an epoch").path();
            if !epoch
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("epoch-"))
            {
                continue;
            }
            let out = std::process::Command::new(CKPT)
                .arg("show")
                .arg(&epoch)
                .arg("--image-key")
                .arg(env.image_key())
                .output()
                .expect("run ckpt show");
            let text = String::from_utf8_lossy(&out.stdout);
            links.extend(
                text.lines()
                    .filter(|l| l.contains("PMIx server link"))
                    .map(|l| l.trim().to_string()),
            );
        }
    }
    let nspace = format!("of slurm.pmix.{job}.0");
    assert_eq!(links.len(), 2, "one link a rank: {links:?}");
    assert!(links.iter().all(|l| l.ends_with(&nspace)), "{links:?}");
    if lab.started {
        Lab::Two.down();
    }
}

/// Rounds of the ring under `ckpt slurm`: about a minute, so Slurm's
/// warning (15-45 s into a run, later if its look is late) comes mid-ring.
const WRAPPED_ROUNDS: u64 = 30_000;
/// Time limit and warning lead, as tests/slurm_nodes.rs has them.
const WRAPPED_TIME_LIMIT: &str = "2:00";
const WRAPPED_WARN_LEAD_SECS: u32 = 75;
/// Every run (a restored one may be checkpointed again), requeue delays
/// and scheduling, with slack.
const WRAPPED_TIMEOUT: Duration = Duration::from_secs(480);

#[test]
fn ckpt_slurm_srun_mpi_pmix_ring_is_checkpointed_on_the_warning_requeued_and_restored() {
    let Some(lab) = Lab::Two.take() else {
        return;
    };
    let env = TestEnv::new("slurm-pmix-wrapped");
    let bin = mpi_victim_bin("mpi_job");
    let script = env.root.join("job.sh");
    let output = env.root.join("job.out");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\n\
             export CKPT_IMAGE_KEY={key}\n\
             export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1\n\
             export OMPI_MCA_btl=self,tcp OMPI_MCA_btl_tcp_if_include=lo\n\
             exec {ckpt} slurm --dir {dir} -- srun --mpi=pmix {bin} {work} {WRAPPED_ROUNDS}\n",
            key = env.image_key().display(),
            ckpt = CKPT,
            dir = env.root.join("ckpt").display(),
            bin = bin.display(),
            work = env.work.display(),
        ),
    )
    .expect("write the batch script");
    let job = Lab::Two.sbatch(&[
        "--nodes=2",
        "--ntasks-per-node=1",
        "--requeue",
        "--open-mode=append",
        &format!("--signal=B:USR1@{WRAPPED_WARN_LEAD_SECS}"),
        &format!("--time={WRAPPED_TIME_LIMIT}"),
        "--job-name=ckpt-slurm-pmix-wrapped",
        "--output",
        path_str(&output),
        path_str(&script),
    ]);
    let diag = || {
        format!(
            "job record: {}\nprogress {}\n--- job output ---\n{}\n--- slurmctld.log (last 20 lines) ---\n{}",
            Lab::Two.record(&job),
            read_to_string_lossy(&env.work.join("progress")),
            read_to_string_lossy(&output),
            Lab::Two.ctld_log_tail(20)
        )
    };
    let started = Instant::now();
    let result = env.work.join("result");
    while !(result.exists() && job_over(&Lab::Two.record(&job))) {
        assert!(
            started.elapsed() < WRAPPED_TIMEOUT,
            "the ring did not end\n{}",
            diag()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let result = read_to_string_lossy(&result);
    assert!(result.starts_with("PASS"), "{result}\n{}", diag());
    assert_two_parts_checkpointed_and_restored(
        &read_to_string_lossy(&output),
        Some("ckpt slurm: srun --mpi=pmix: the allocation's tasks, each rank a part"),
        &diag,
    );
    if lab.started {
        Lab::Two.down();
    }
}
