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

use std::io::{Read, Write};
use std::net::TcpStream;
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
