//! A checkpoint round and a restart round with a key/value exchange through the PMIx
//! backend. Run every rank under a PMIx server:
//!
//! ```sh
//! cargo build -p ckpt-coord --features pmix --example pmix_agent
//! mpirun --allow-run-as-root --oversubscribe -n 4 target/debug/examples/pmix_agent [OPTIONS]
//! srun --mpi=pmix -n 4 target/debug/examples/pmix_agent [OPTIONS]
//! ```
//!
//! Options: `--state-dir DIR` (rank 0 reserves epochs and commits manifests there), `--job J`
//! (default `pmix-demo`), `--fail-dump RANK` (that rank reports failure in DUMP),
//! `--stall-dump RANK` (that rank sleeps past the barrier timeout before reporting DUMP),
//! `--keys N` (keys each rank publishes, default 16), `--timeout SECS` (barrier timeout,
//! default 30).
//!
//! Each rank prints one line:
//!
//! ```text
//! pmix_agent rank=R size=N node=rankR phases=E:FREEZE,...,E:RESUME,E2:RESTORE,... restore_from=E keys=K/K result=ok
//! ```
//!
//! or, after an abort, `result=aborted epoch=E phase=P failed=NODE reason=...`.

use std::time::Duration;

use ckpt_coord::pmix::{PmixBackend, PmixOptions};
use ckpt_coord::{AfterCommit, ClientError, Phase, PhaseBackend, PhaseInfo, RoundKind};

/// Parsed command line.
#[derive(Debug, Default)]
pub struct Args {
    /// Epoch store directory for rank 0.
    pub state_dir: Option<String>,
    /// Job id for the store.
    pub job: String,
    /// Rank that fails DUMP.
    pub fail_dump: Option<u32>,
    /// Rank that is too late for the DUMP barrier.
    pub stall_dump: Option<u32>,
    /// Keys per rank.
    pub keys: u32,
    /// Barrier timeout.
    pub timeout: Duration,
}

/// Parses `args` (without the program name).
pub fn parse(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        job: "pmix-demo".into(),
        keys: 16,
        timeout: Duration::from_secs(30),
        ..Args::default()
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut val = || it.next().cloned().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--state-dir" => a.state_dir = Some(val()?),
            "--job" => a.job = val()?,
            "--fail-dump" => a.fail_dump = Some(val()?.parse().map_err(|e| format!("{e}"))?),
            "--stall-dump" => a.stall_dump = Some(val()?.parse().map_err(|e| format!("{e}"))?),
            "--keys" => a.keys = val()?.parse().map_err(|e| format!("{e}"))?,
            "--timeout" => {
                a.timeout = Duration::from_secs(val()?.parse().map_err(|e| format!("{e}"))?)
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

/// What one rank saw.
#[derive(Debug, Default)]
struct Seen {
    phases: Vec<String>,
    restore_from: Option<u64>,
    keys_expected: u32,
    keys_ok: u32,
}

fn rounds(b: &mut PmixBackend, a: &Args, seen: &mut Seen) -> Result<(), ClientError> {
    let rank = b.rank();
    let enter = |b: &mut PmixBackend, p: Phase, seen: &mut Seen| {
        b.wait_phase(p)
            .inspect(|s| seen.phases.push(format!("{}:{}", s.epoch, s.phase)))
    };
    // Checkpoint round.
    for p in [Phase::Freeze, Phase::Drain, Phase::Dump] {
        enter(b, p, seen)?;
        if p == Phase::Dump && a.fail_dump == Some(rank) {
            b.report_failed(p, &format!("injected DUMP failure on rank {rank}"))?;
            continue;
        }
        if p == Phase::Dump && a.stall_dump == Some(rank) {
            std::thread::sleep(a.timeout + Duration::from_secs(2));
        }
        let info = match p {
            Phase::Dump => PhaseInfo::Dump {
                image_dir: format!("/ckpt/{}", b.node()),
                manifest_crc32c: rank,
            },
            _ => PhaseInfo::None,
        };
        b.report_done(p, info)?;
    }
    enter(b, Phase::Commit, seen)?;
    enter(b, Phase::Resume, seen)?;
    b.report_done(Phase::Resume, PhaseInfo::None)?;

    // Restart round: every rank publishes its keys and fetches every other rank's.
    b.start_round(RoundKind::Restart)?;
    let s = enter(b, Phase::Restore, seen)?;
    seen.restore_from = s.last_committed;
    b.report_done(Phase::Restore, PhaseInfo::None)?;
    let epoch = enter(b, Phase::Publish, seen)?.epoch;
    for k in 0..a.keys {
        b.put(
            &format!("r{rank}.k{k}"),
            format!("v{rank}.{k}.{epoch}").as_bytes(),
        )?;
    }
    b.report_done(Phase::Publish, PhaseInfo::None)?;
    enter(b, Phase::Subscribe, seen)?;
    for r in (0..b.size()).filter(|r| *r != rank) {
        for k in 0..a.keys {
            seen.keys_expected += 1;
            let v = b.get(&format!("r{r}.k{k}"), a.timeout)?;
            if v == format!("v{r}.{k}.{epoch}").as_bytes() {
                seen.keys_ok += 1;
            }
        }
    }
    b.report_done(Phase::Subscribe, PhaseInfo::None)?;
    enter(b, Phase::Resume, seen)?;
    b.report_done(Phase::Resume, PhaseInfo::None)?;
    Ok(())
}

/// Runs both rounds and returns this rank's report line.
pub fn run(args: &[String]) -> Result<String, String> {
    let a = parse(args)?;
    let kind = RoundKind::Checkpoint {
        then: AfterCommit::Resume,
    };
    let mut opts = PmixOptions::new(kind).fence_timeout(a.timeout);
    if let Some(d) = &a.state_dir {
        opts = opts.store(d, &a.job);
    }
    let mut b = PmixBackend::init(opts).map_err(|e| e.to_string())?;
    let mut seen = Seen::default();
    let res = rounds(&mut b, &a, &mut seen);
    let result = match res {
        Ok(()) => "result=ok".to_string(),
        Err(ClientError::Aborted {
            epoch,
            phase,
            node,
            reason,
        }) => format!("result=aborted epoch={epoch} phase={phase} failed={node} reason={reason}"),
        Err(e) => format!("result=error {e}"),
    };
    Ok(format!(
        "pmix_agent rank={} size={} node={} phases={} restore_from={} keys={}/{} {result}",
        b.rank(),
        b.size(),
        b.node(),
        seen.phases.join(","),
        seen.restore_from
            .map(|e| e.to_string())
            .unwrap_or_else(|| "none".into()),
        seen.keys_ok,
        seen.keys_expected,
    ))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("pmix_agent: {e}");
            std::process::exit(1);
        }
    }
}
