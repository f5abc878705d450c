//! Round time of checkpoint rounds through the PMIx backend, for comparison with the TCP
//! coordinator's (`examples/bench.rs`). Run every rank under a PMIx server:
//!
//! ```sh
//! cargo build --release -p ckpt-coord --features pmix --example pmix_bench
//! srun --mpi=pmix -N2 -n 8 target/release/examples/pmix_bench --rounds 20 --state-dir DIR
//! ```
//!
//! Each rank runs `--rounds` checkpoint rounds (REGISTER, FREEZE, DRAIN, DUMP, COMMIT,
//! RESUME: the first round's REGISTER barrier is `PMIx_Init`'s, which is timed apart) and
//! reports every phase at once, as the TCP bench's simulated agents do. Rank 0 prints one
//! line: the ranks, the init time, and the rounds' times (min, median, max) from its
//! `start_round` to its RESUME barrier's return, in milliseconds. With `--state-dir`, rank
//! 0 reserves every epoch and commits its manifest there (fsynced), as the coordinator does.

use std::time::{Duration, Instant};

use ckpt_coord::pmix::{PmixBackend, PmixOptions};
use ckpt_coord::{AfterCommit, ClientError, Phase, PhaseBackend, PhaseInfo, RoundKind};

/// Parsed command line.
struct Args {
    /// Rounds after the first.
    rounds: u32,
    /// Epoch store directory for rank 0.
    state_dir: Option<String>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut a = Args {
        rounds: 20,
        state_dir: None,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut val = || it.next().cloned().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--rounds" => a.rounds = val()?.parse().map_err(|e| format!("--rounds: {e}"))?,
            "--state-dir" => a.state_dir = Some(val()?),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(a)
}

/// One checkpoint round's barriers after REGISTER.
fn round(b: &mut PmixBackend) -> Result<(), ClientError> {
    for p in [Phase::Freeze, Phase::Drain, Phase::Dump] {
        b.wait_phase(p)?;
        let info = match p {
            Phase::Dump => PhaseInfo::Dump {
                image_dir: format!("/ckpt/{}", b.node()),
                manifest_crc32c: b.rank(),
            },
            _ => PhaseInfo::None,
        };
        b.report_done(p, info)?;
    }
    b.wait_phase(Phase::Commit)?;
    b.wait_phase(Phase::Resume)?;
    b.report_done(Phase::Resume, PhaseInfo::None)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn run(args: &[String]) -> Result<Option<String>, String> {
    let a = parse(args)?;
    let kind = RoundKind::Checkpoint {
        then: AfterCommit::Resume,
    };
    let mut opts = PmixOptions::new(kind).fence_timeout(Duration::from_secs(60));
    if let Some(d) = &a.state_dir {
        opts = opts.store(d, "pmix-bench");
    }
    let started = Instant::now();
    let mut b = PmixBackend::init(opts).map_err(|e| e.to_string())?;
    let init = started.elapsed();
    round(&mut b).map_err(|e| format!("round 1: {e}"))?;
    let mut times = Vec::new();
    for r in 0..a.rounds {
        let t = Instant::now();
        b.start_round(kind)
            .and_then(|()| round(&mut b))
            .map_err(|e| format!("round {}: {e}", r + 2))?;
        times.push(t.elapsed());
    }
    if b.rank() != 0 || times.is_empty() {
        return Ok(None);
    }
    times.sort_unstable();
    Ok(Some(format!(
        "pmix_bench ranks={} init_ms={:.2} rounds={} round_ms_min={:.2} round_ms_median={:.2} round_ms_max={:.2}",
        b.size(),
        ms(init),
        times.len(),
        ms(times[0]),
        ms(times[times.len() / 2]),
        ms(times[times.len() - 1]),
    )))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(Some(line)) => println!("{line}"),
        Ok(None) => {}
        Err(e) => {
            eprintln!("pmix_bench: {e}");
            std::process::exit(1);
        }
    }
}
