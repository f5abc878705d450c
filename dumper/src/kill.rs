//! The end of a dump with `--kill`: the tree killed once its checkpoint is
//! checked, and its deaths collected.

use std::time::Instant;

use crate::error::{DumpError, Result};
use crate::{DumpReport, Written, ipc};

/// Kills the tree of `w` (see [`Written::kill`]).
pub(crate) fn tree(mut w: Written) -> Result<DumpReport> {
    if w.frozen.thawed_after.is_some() {
        return Err(DumpError::Unsupported {
            pid: w.report.pid,
            what: "killing a tree after a background dump (it ran on meanwhile)".into(),
        });
    }
    ckpt_parasite::fault::inject(ckpt_parasite::fault::FaultPoint::BeforeKill);
    // Dropping `w` on error resumes the tree.
    w.committed.verify(&w.key)?;
    for pid in w.frozen.procs.iter().map(|p| p.pid) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    // Children before parents, threads before their leader: a parent
    // (an init above all) finishes dying only after them.
    let tasks: Vec<ckpt_parasite::Tracee> = std::mem::take(&mut w.frozen.procs)
        .into_iter()
        .rev()
        .flat_map(|p| p.tasks.into_iter().rev())
        .collect();
    // "Killed" means past the point of no return, not gone: the kernel
    // then frees the tree's memory on its own (some 50 ms per GiB
    // here), which a restore of the same pids waits for.
    let tids: Vec<i32> = tasks.iter().map(|t| t.pid()).collect();
    wait_exiting(&tids, KILL_SETTLE);
    // Their deaths are ours to collect, as their tracer (until then they
    // stay zombies their parents cannot reap): on another thread, which
    // ends with ckpt if ckpt ends first, when the kernel hands them back
    // to their parents.
    std::thread::spawn(move || {
        let until = Instant::now() + KILL_SETTLE;
        for t in tasks {
            let pid = t.pid();
            if !t.reap_killed(until) {
                log::warn!("kill: task {pid} has not died after {KILL_SETTLE:?}");
            }
        }
    });
    ipc::remove(w.report.pid, &w.ipc);
    // Closed in repair mode: nothing reaches the peers.
    if let Some(mut tcp) = w.frozen.tcp.take() {
        tcp.abandon();
    }
    let r = w.finish();
    log::info!(
        "kill: {} processes killed, frozen {:.3} ms",
        r.processes,
        r.stats.frozen_ms
    );
    Ok(r)
}

/// How long `--kill` waits for the killed processes to finish exiting.
const KILL_SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits (bounded) until every task of `tids` is exiting, a zombie or
/// gone. A task that does not get there in time (asleep where a kill does
/// not wake it) is logged, not an error: the checkpoint is committed and
/// the kill was sent.
fn wait_exiting(tids: &[i32], limit: std::time::Duration) {
    let until = Instant::now() + limit;
    for &tid in tids {
        while !ckpt_parasite::proc_read::leaving(tid) {
            if Instant::now() >= until {
                log::warn!("kill: task {tid} is not exiting after {limit:?}");
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}
