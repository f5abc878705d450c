//! Scheduling attributes, set inside each thread (they are per thread in
//! the kernel) while the process still has the restorer's privileges: a
//! negative nice, SCHED_FIFO/RR or the real-time I/O class the job had at
//! dump time need them, and the image is sealed, so giving back what the
//! dump recorded grants nothing new. Then the process's `oom_score_adj`.

use ckpt_image::task::{Core, Sched};
use ckpt_parasite::ParasiteError;
use ckpt_parasite::batch::Call;
use ckpt_parasite::remote::Remote;
use nix::errno::Errno;

use crate::error::{RestoreError, Result};

/// Policies a restore may set (SCHED_OTHER, FIFO, RR, BATCH, IDLE).
const POLICIES: [u32; 5] = [0, 1, 2, 3, 5];
/// The real-time policies, whose priority is 1..=99.
const RT_POLICIES: [u32; 2] = [1, 2];
/// Highest real-time priority.
const MAX_RT_PRIORITY: u32 = 99;
/// Range of nice values.
const NICE_RANGE: std::ops::RangeInclusive<i32> = -20..=19;
/// Range of `oom_score_adj`.
const OOM_SCORE_ADJ_RANGE: std::ops::RangeInclusive<i32> = -1000..=1000;
/// Longest CPU mask accepted, in 64-bit words (8192 CPUs, the kernel's
/// largest NR_CPUS).
const MAX_AFFINITY_WORDS: usize = 128;
/// `sched_attr.sched_flags` bit: children start with the default policy.
const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;
/// `sched_attr` without the utilization clamps (SCHED_ATTR_SIZE_VER0),
/// so a restore never touches them.
const SCHED_ATTR_SIZE_VER0: u32 = 48;
/// `ioprio_set` "who" for the calling thread (with who = 0).
const IOPRIO_WHO_PROCESS: u64 = 1;
/// Largest valid I/O priority value: class (3 bits) << 13 | data.
const IOPRIO_MAX_VALUE: u32 = (1 << 16) - 1;

/// Sets the leader's scheduling attributes (behind `r`; the other
/// threads' are set as each is created, in the same stop as the rest of
/// its own state: `thread.rs`) and the process's `oom_score_adj`. A CPU
/// mask with no CPU of this host is a notice, not an error: the job may be
/// restored on a smaller node; so is an `oom_score_adj` below the
/// restorer's when ckpt lacks CAP_SYS_RESOURCE.
pub fn restore(r: &Remote<'_>, core: &Core, notice: &dyn Fn(&str)) -> Result<()> {
    if let Some(s) = &core.sched {
        set(r, core.pid, core.pid, s, notice)?;
    }
    if core.sched.is_some() {
        let pid = r.t.pid();
        if !OOM_SCORE_ADJ_RANGE.contains(&core.oom_score_adj) {
            return Err(invalid(core.pid, core.pid, "oom_score_adj out of range"));
        }
        // Lowering it needs CAP_SYS_RESOURCE: done from the restorer. Root
        // lacks that capability on some hosts (as for raising limits): the
        // process then keeps the restorer's value, with a notice.
        match std::fs::write(
            format!("/proc/{pid}/oom_score_adj"),
            core.oom_score_adj.to_string(),
        ) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => notice(&format!(
                "pid {}: oom_score_adj {} needs CAP_SYS_RESOURCE, which ckpt lacks here; it keeps the restorer's",
                core.pid, core.oom_score_adj
            )),
            Err(e) => return Err(RestoreError::os(pid, "write oom_score_adj", e)),
        }
    }
    Ok(())
}

fn invalid(pid: i32, tid: i32, what: &str) -> RestoreError {
    RestoreError::Image(ckpt_image::ImageError::Invalid {
        path: ckpt_image::core_name(pid).into(),
        what: format!("thread {tid}: {what}"),
    })
}

/// Checks `s` against what the kernel accepts, naming pid and tid.
fn validate(pid: i32, tid: i32, s: &Sched) -> Result<()> {
    if !POLICIES.contains(&s.policy) {
        return Err(invalid(
            pid,
            tid,
            &format!("scheduling policy {}", s.policy),
        ));
    }
    let rt = RT_POLICIES.contains(&s.policy);
    if (rt && !(1..=MAX_RT_PRIORITY).contains(&s.priority)) || (!rt && s.priority != 0) {
        return Err(invalid(pid, tid, &format!("priority {}", s.priority)));
    }
    if !NICE_RANGE.contains(&s.nice) {
        return Err(invalid(pid, tid, &format!("nice {}", s.nice)));
    }
    if s.affinity.len() > MAX_AFFINITY_WORDS {
        return Err(invalid(pid, tid, "CPU mask longer than 8192 CPUs"));
    }
    if s.ioprio > IOPRIO_MAX_VALUE {
        return Err(invalid(pid, tid, &format!("I/O priority {:#x}", s.ioprio)));
    }
    Ok(())
}

/// Sets one thread's attributes from inside it.
fn set(r: &Remote<'_>, pid: i32, tid: i32, s: &Sched, notice: &dyn Fn(&str)) -> Result<()> {
    let calls = thread_calls(r, pid, tid, s)?;
    run_with(r, &calls, pid, tid, s, notice)
}

/// Where in argument slot 0 a thread's attributes go: after what its
/// other calls of the same batch put there (its alternate stack, name).
const SCHED_ARG_OFFSET: u64 = 256;

/// The calls that set one thread's attributes from inside it (their
/// argument put in slot 0 at [`SCHED_ARG_OFFSET`]), to be run by
/// [`run_with`], last in their batch. The timer slack goes first:
/// switching to a real-time policy then zeroes it, as it was.
pub fn thread_calls(r: &Remote<'_>, pid: i32, tid: i32, s: &Sched) -> Result<Vec<Call>> {
    validate(pid, tid, s)?;
    let flags = if s.reset_on_fork {
        SCHED_FLAG_RESET_ON_FORK
    } else {
        0
    };
    // One argument: the sched_attr, then the affinity mask.
    let mut arg = Vec::with_capacity(AFFINITY_AT + s.affinity.len() * 8);
    arg.extend_from_slice(&SCHED_ATTR_SIZE_VER0.to_le_bytes());
    arg.extend_from_slice(&s.policy.to_le_bytes());
    arg.extend_from_slice(&flags.to_le_bytes());
    arg.extend_from_slice(&s.nice.to_le_bytes());
    arg.extend_from_slice(&s.priority.to_le_bytes());
    // runtime, deadline, period: SCHED_DEADLINE only, refused at dump.
    arg.resize(AFFINITY_AT, 0);
    let mask: Vec<u8> = s.affinity.iter().flat_map(|w| w.to_le_bytes()).collect();
    arg.extend_from_slice(&mask);
    let at = r.put_at(0, SCHED_ARG_OFFSET, &arg)?;
    // The affinity last, as the one call whose failure is not an error.
    let mut calls = vec![
        Call {
            name: "prctl(PR_SET_TIMERSLACK)",
            nr: libc::SYS_prctl,
            args: [libc::PR_SET_TIMERSLACK as u64, s.timer_slack_ns, 0, 0, 0, 0],
        },
        Call {
            name: "sched_setattr",
            nr: libc::SYS_sched_setattr,
            args: [0, at, 0, 0, 0, 0],
        },
        Call {
            name: "ioprio_set",
            nr: libc::SYS_ioprio_set,
            args: [IOPRIO_WHO_PROCESS, 0, s.ioprio as u64, 0, 0, 0],
        },
    ];
    if !mask.is_empty() {
        calls.push(Call {
            name: SET_AFFINITY,
            nr: libc::SYS_sched_setaffinity,
            args: [0, mask.len() as u64, at + AFFINITY_AT as u64, 0, 0, 0],
        });
    }
    Ok(calls)
}

/// Runs `calls` in one stop, ending with [`thread_calls`] for `s`: a CPU
/// mask with none of this host's CPUs (its call the last) is a notice.
pub fn run_with(
    r: &Remote<'_>,
    calls: &[Call],
    pid: i32,
    tid: i32,
    s: &Sched,
    notice: &dyn Fn(&str),
) -> Result<()> {
    match r.call_many(calls) {
        Ok(_) => Ok(()),
        Err(ParasiteError::RemoteSyscall {
            name: SET_AFFINITY,
            errno: Errno::EINVAL,
            ..
        }) => {
            notice(&format!(
                "pid {pid} thread {tid}: none of its CPUs ({}) is online here; it keeps the restorer's",
                ckpt_image::sched::cpu_list(&s.affinity)
            ));
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Where the affinity mask starts in the argument slot (after the
/// sched_attr, 8-byte aligned).
const AFFINITY_AT: usize = 64;
/// The name of the affinity call in the batch.
const SET_AFFINITY: &str = "sched_setaffinity";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_are_refused() {
        let ok = Sched {
            policy: 1,
            priority: 10,
            ..Default::default()
        };
        assert!(validate(1, 1, &ok).is_ok());
        for bad in [
            Sched {
                policy: 6,
                ..ok.clone()
            },
            Sched {
                priority: 0,
                ..ok.clone()
            },
            Sched {
                policy: 0,
                ..ok.clone()
            },
            Sched {
                policy: 0,
                priority: 0,
                nice: 20,
                ..ok.clone()
            },
            Sched {
                affinity: vec![1; MAX_AFFINITY_WORDS + 1],
                ..ok.clone()
            },
            Sched {
                ioprio: 1 << 16,
                ..ok.clone()
            },
        ] {
            assert!(validate(1, 1, &bad).is_err(), "{bad:?}");
        }
    }
}
