//! Scheduling attributes, per thread: policy and priority (with
//! SCHED_RESET_ON_FORK), nice, CPU affinity, I/O priority and timer slack;
//! and the process's `oom_score_adj`. All but the timer slack are read
//! from outside by tid; the slack only the thread itself can report (the
//! parasite asks it).

use ckpt_image::task::Sched;

use crate::error::{DumpError, Result};
use crate::{procfile, sys};

/// SCHED_DEADLINE: needs admission control ckpt does not redo.
const SCHED_DEADLINE: u32 = 6;
/// `sched_attr.sched_flags` bit: children start with the default policy.
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;
/// The utilization clamp maximum of a task that never set one.
const UCLAMP_DEFAULT_MAX: u32 = 1024;

/// Scheduling attributes of thread `tid` of process `pid`;
/// `timer_slack_ret` is what `PR_GET_TIMERSLACK` returned in the thread.
pub fn collect(pid: i32, tid: i32, timer_slack_ret: i64) -> Result<Sched> {
    let os = |what: &str, e: std::io::Error| DumpError::Proc {
        pid,
        path: format!("thread {tid}: {what}").into(),
        source: e,
    };
    let unsupported = |what: String| DumpError::Unsupported {
        pid,
        what: format!("thread {tid}: {what}"),
    };
    let a = sys::sched_getattr(tid).map_err(|e| os("sched_getattr", e))?;
    if a.policy == SCHED_DEADLINE {
        return Err(unsupported("scheduling policy SCHED_DEADLINE".into()));
    }
    if a.util_min != 0 || (a.util_max != 0 && a.util_max != UCLAMP_DEFAULT_MAX) {
        return Err(unsupported(format!(
            "utilization clamp {}..{} (sched_setattr SCHED_FLAG_UTIL_CLAMP)",
            a.util_min, a.util_max
        )));
    }
    let timer_slack_ns = u64::try_from(timer_slack_ret).map_err(|_| {
        os(
            "prctl(PR_GET_TIMERSLACK)",
            std::io::Error::from_raw_os_error(-timer_slack_ret as i32),
        )
    })?;
    Ok(Sched {
        policy: a.policy,
        reset_on_fork: a.flags & SCHED_FLAG_RESET_ON_FORK != 0,
        priority: a.priority,
        nice: a.nice,
        affinity: sys::sched_getaffinity(tid).map_err(|e| os("sched_getaffinity", e))?,
        ioprio: sys::ioprio_get(tid).map_err(|e| os("ioprio_get", e))?,
        timer_slack_ns,
    })
}

/// The process's `oom_score_adj`.
pub fn oom_score_adj(pid: i32) -> Result<i32> {
    let text = procfile::read(pid, "oom_score_adj")?;
    text.trim()
        .parse()
        .map_err(|e: std::num::ParseIntError| DumpError::Parse {
            pid,
            path: "oom_score_adj".into(),
            what: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_thread_matches_the_getters() {
        let tid = nix::unistd::gettid().as_raw();
        // SAFETY: prctl(PR_GET_TIMERSLACK) takes only integers.
        let slack = unsafe { libc::prctl(libc::PR_GET_TIMERSLACK, 0, 0, 0, 0) };
        let s = collect(nix::unistd::getpid().as_raw(), tid, slack as i64).unwrap();
        assert_eq!(s.timer_slack_ns, slack as u64);
        // SAFETY: getpriority takes only integers.
        let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid as u32) };
        assert_eq!(s.nice, nice);
        let online = std::thread::available_parallelism().unwrap().get();
        let bits: u32 = s.affinity.iter().map(|w| w.count_ones()).sum();
        assert!(bits as usize >= online.min(1));
    }
}
