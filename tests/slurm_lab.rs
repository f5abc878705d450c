//! Helpers shared by the tests under a real Slurm (tests/slurm.rs,
//! tests/slurm_site.rs, tests/slurm_nodes.rs): the labs on localhost
//! (scripts/slurm/lab-up.sh, one node or `--nodes 2`),
//! its clients, job records, and the arithmetic of the victim
//! tests/c/slurm_steps.c. A module of the test binaries that use a lab.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};

/// Words of the victim's buffer (4 MiB of u64).
pub const WORDS: u64 = 4 * 1024 * 1024 / 8;

pub fn lab_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/slurm")
}

/// The lab's state directory ($CKPT_SLURM_LAB, as lab-up.sh uses it).
pub fn lab_state() -> PathBuf {
    std::env::var_os("CKPT_SLURM_LAB")
        .map_or_else(|| PathBuf::from("/var/tmp/ckpt-slurm-lab"), PathBuf::from)
}

/// Whether Slurm is installed. `Err` says how to get it: the test tiers'
/// prerequisites are installed by one explicit step, never by a test.
pub fn slurm_installed() -> Result<(), String> {
    if Path::new("/usr/sbin/slurmctld").exists() && Path::new("/usr/bin/sbatch").exists() {
        return Ok(());
    }
    Err("Slurm is not installed: run scripts/test-deps.sh --lab (as root) first".into())
}

/// One scenario at a time in each lab, whichever test file of the binary
/// it comes from: a scenario preempts what runs there, and one that
/// started the lab brings it down when it is done.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
static TWO_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A lab held by one test (see [`Lab::take`]).
pub struct Taken {
    _held: MutexGuard<'static, ()>,
    /// The same across test processes (other worktrees' runs share the
    /// lab): an exclusive lock on a file beside its state directory,
    /// released when the process lets go of it.
    _file_lock: nix::fcntl::Flock<std::fs::File>,
    /// This test brought the lab up (and brings it down when done).
    pub started: bool,
}

/// One of the labs on localhost: `scripts/slurm/lab-up.sh` (one node) or
/// `lab-up.sh --nodes 2` (two fake nodes), each its own cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lab {
    /// One node ($CKPT_SLURM_LAB).
    One,
    /// Two fake nodes on this host ($CKPT_SLURM_LAB2).
    Two,
}

impl Lab {
    /// Its state directory, as lab-up.sh uses it.
    pub fn state(self) -> PathBuf {
        match self {
            Lab::One => lab_state(),
            Lab::Two => lab2_state(),
        }
    }

    /// lab-up.sh's and lab-down.sh's arguments for it.
    fn script_args(self) -> &'static [&'static str] {
        match self {
            Lab::One => &[],
            Lab::Two => &["--nodes", "2"],
        }
    }

    /// For a test under a real Slurm: `None` (the test skips, saying why)
    /// when Slurm is not installed, else the lab brought up and held for
    /// this test alone until the returned [`Taken`] is dropped.
    pub fn take(self) -> Option<Taken> {
        if let Err(why) = slurm_installed() {
            eprintln!("SKIPPED: {why}");
            return None;
        }
        let lock = match self {
            Lab::One => &ONE_AT_A_TIME,
            Lab::Two => &TWO_AT_A_TIME,
        };
        let held = lock.lock().unwrap_or_else(|e| e.into_inner());
        let path = self.state().with_extension("lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let file_lock = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .unwrap_or_else(|(_, e)| panic!("{}: lock: {e}", path.display()));
        Some(Taken {
            _held: held,
            _file_lock: file_lock,
            started: self.up(),
        })
    }

    /// Brings it up; returns whether this call started it (then the
    /// caller brings it down when done).
    pub fn up(self) -> bool {
        let up = Command::new(lab_dir().join("lab-up.sh"))
            .args(self.script_args())
            .output()
            .expect("run scripts/slurm/lab-up.sh");
        assert!(
            up.status.success(),
            "scripts/slurm/lab-up.sh {} could not bring up the Slurm lab ({}):\n{}{}",
            self.script_args().join(" "),
            up.status,
            String::from_utf8_lossy(&up.stdout),
            String::from_utf8_lossy(&up.stderr)
        );
        String::from_utf8_lossy(&up.stdout)
            .trim_end()
            .ends_with("started")
    }

    /// Brings it down.
    pub fn down(self) {
        let _ = Command::new(lab_dir().join("lab-down.sh"))
            .args(self.script_args())
            .status();
    }

    /// A Slurm client command talking to it.
    pub fn client(self, cmd: &str) -> Command {
        let mut c = Command::new(cmd);
        c.env("SLURM_CONF", self.state().join("slurm.conf"));
        c
    }

    /// `sbatch --parsable ARGS`: the job id.
    pub fn sbatch(self, args: &[&str]) -> String {
        let out = self
            .client("sbatch")
            .arg("--parsable")
            .args(args)
            .output()
            .expect("run sbatch");
        assert!(
            out.status.success(),
            "sbatch failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `scontrol show job -o JOB` (empty if Slurm cannot tell).
    pub fn record(self, job: &str) -> String {
        self.client("scontrol")
            .args(["show", "job", "-o", job])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The last `lines` lines of slurmctld's log, newest first.
    pub fn ctld_log_tail(self, lines: usize) -> String {
        let log =
            std::fs::read_to_string(self.state().join("log/slurmctld.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(lines).collect();
        tail.join("\n")
    }
}

/// The two-node lab's state directory ($CKPT_SLURM_LAB2, as `lab-up.sh
/// --nodes 2` uses it).
pub fn lab2_state() -> PathBuf {
    std::env::var_os("CKPT_SLURM_LAB2")
        .map_or_else(|| PathBuf::from("/var/tmp/ckpt-slurm-lab2"), PathBuf::from)
}

/// A Slurm client command talking to the one-node lab.
pub fn slurm(cmd: &str) -> Command {
    Lab::One.client(cmd)
}

/// The `step N[/M] sum S` lines of tests/c/slurm_steps.c's output, in
/// order: each line's index and step number, every sum checked against
/// the memory the step must have (`context` goes into a failure).
pub fn steps(text: &str, context: &dyn Fn() -> String) -> Vec<(usize, u64)> {
    let mut v = Vec::new();
    for (at, l) in text.lines().enumerate() {
        let Some((n, sum)) = l.strip_prefix("step ").and_then(|r| r.split_once(" sum ")) else {
            continue;
        };
        let n: u64 = n
            .split('/')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("step number");
        assert_eq!(
            sum,
            step_sum(n),
            "step {n}: wrong memory sum\n{}",
            context()
        );
        v.push((at, n));
    }
    v
}

/// The victim's word `i` at step `s` (tests/c/slurm_steps.c `mix`).
pub fn mix(i: u64, s: u64) -> u64 {
    let mut z = i
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(s.wrapping_mul(0xbf58_476d_1ce4_e5b9))
        .wrapping_add(1);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The sum the victim prints after step `s`.
pub fn step_sum(s: u64) -> String {
    let sum = (0..WORDS).fold(0u64, |acc, i| acc.wrapping_add(mix(i, s)));
    format!("{sum:016x}")
}

/// `Key=Value` of `scontrol show job -o`.
pub fn field<'a>(record: &'a str, key: &str) -> Option<&'a str> {
    record
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// Whether a job record says the job is over: its state is one Slurm does
/// not leave without an operator. Everything else, including the passing
/// flags Slurm shows in place of the base state while it preempts, signals
/// or requeues a job (SIGNALING, REQUEUED, COMPLETING, ...), means wait.
pub fn job_over(record: &str) -> bool {
    matches!(
        field(record, "JobState"),
        Some(
            "COMPLETED"
                | "CANCELLED"
                | "FAILED"
                | "TIMEOUT"
                | "NODE_FAIL"
                | "PREEMPTED"
                | "BOOT_FAIL"
                | "DEADLINE"
                | "OUT_OF_MEMORY"
                | "SPECIAL_EXIT"
                | "REQUEUE_HOLD"
        )
    )
}

/// A fake `srun` for the tests without Slurm: logs its arguments to
/// $FAKE_SRUN_LOG, then runs the step's tasks here, one per node of
/// `--nodelist` (else of $FAKE_SRUN_NODES, the allocation), with
/// SLURM_NODEID, SLURM_PROCID and SLURMD_NODENAME set; exits with the
/// worst task's code.
pub const FAKE_SRUN: &str = r#"#!/bin/sh
echo "$@" >> "$FAKE_SRUN_LOG"
k=1; nodelist=
while [ $# -gt 0 ]; do
  case "$1" in
    --nodes=*) k=${1#--nodes=} ;;
    --nodelist=*) nodelist=${1#--nodelist=} ;;
    --*) ;;
    *) break ;;
  esac
  shift
done
[ -n "$nodelist" ] || nodelist=$FAKE_SRUN_NODES
i=0; pids=
for node in $(echo "$nodelist" | tr , ' '); do
  [ $i -lt $k ] || break
  SLURM_NODEID=$i SLURM_PROCID=$i SLURMD_NODENAME=$node "$@" &
  pids="$pids $!"
  i=$((i + 1))
done
rc=0
for p in $pids; do wait $p || rc=$?; done
exit $rc
"#;

/// What `ckpt slurm` said in the output of a two-node job checkpointed at
/// its warning and restored after the requeue: how it launched the job
/// (`launched`, if the test knows), that both parts were checkpointed and
/// then restored, and no failed checkpoint.
pub fn assert_two_parts_checkpointed_and_restored(
    output: &str,
    launched: Option<&str>,
    diag: &dyn Fn() -> String,
) {
    assert_parts_checkpointed_and_restored(output, 2, launched, diag);
}

/// [`assert_two_parts_checkpointed_and_restored`] for a job of `parts`
/// parts (ranks of `srun --mpi=pmix`, several a node).
pub fn assert_parts_checkpointed_and_restored(
    output: &str,
    parts: usize,
    launched: Option<&str>,
    diag: &dyn Fn() -> String,
) {
    if let Some(line) = launched {
        assert!(output.contains(line), "no `{line}`\n{}", diag());
    }
    for said in [
        format!("ckpt slurm: the job's {parts} parts checkpointed into "),
        format!(": restoring the job's {parts} parts from "),
    ] {
        assert!(output.contains(&said), "no `{said}`\n{}", diag());
    }
    assert!(
        !output.contains("ckpt slurm: checkpoint of"),
        "a checkpoint failed\n{}",
        diag()
    );
}
