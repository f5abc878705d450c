//! Scheduling attributes of a thread (`Core::sched`, `ThreadCore::sched`)
//! and prctl state (`Core::prctl`, `ThreadCore::prctl`), as `ckpt show`
//! describes them.
//!
//! The messages are defined in `image/proto/task.proto`.

pub use crate::pb::{LockedRange, Prctl, Sched};

/// Policy names by number (SCHED_DEADLINE, 6, is refused at dump).
const POLICY_NAMES: &[&str] = &[
    "SCHED_OTHER",
    "SCHED_FIFO",
    "SCHED_RR",
    "SCHED_BATCH",
    "SCHED_ISO",
    "SCHED_IDLE",
];
/// I/O priority classes by number.
const IOPRIO_CLASS_NAMES: &[&str] = &["none", "realtime", "best-effort", "idle"];
/// Bits of the I/O priority value that hold the class.
const IOPRIO_CLASS_SHIFT: u32 = 13;
/// Mask of the I/O priority's level within its class.
const IOPRIO_DATA_MASK: u32 = (1 << IOPRIO_CLASS_SHIFT) - 1;
/// The timer slack a task starts with (50 µs).
pub const DEFAULT_TIMER_SLACK_NS: u64 = 50_000;
/// `PR_GET_DUMPABLE` of an ordinary process (SUID_DUMP_USER).
pub const DEFAULT_DUMPABLE: u32 = 1;

/// "0,3-5" for a CPU mask of 64-bit words, as the kernel prints cpu lists.
pub fn cpu_list(mask: &[u64]) -> String {
    let cpus: Vec<usize> = (0..mask.len() * 64)
        .filter(|c| mask[c / 64] & (1 << (c % 64)) != 0)
        .collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        out.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    out.join(",")
}

impl Sched {
    /// The CPU mask and whatever differs from a default thread, in one
    /// line, as `ckpt show` prints it.
    pub fn describe(&self) -> String {
        let mut parts = vec![format!("cpus {}", cpu_list(&self.affinity))];
        if self.policy != 0 {
            let name = POLICY_NAMES
                .get(self.policy as usize)
                .copied()
                .unwrap_or("unknown policy");
            parts.push(format!("{name} priority {}", self.priority));
        }
        if self.reset_on_fork {
            parts.push("SCHED_RESET_ON_FORK".into());
        }
        if self.nice != 0 {
            parts.push(format!("nice {}", self.nice));
        }
        if self.ioprio != 0 {
            let class = IOPRIO_CLASS_NAMES
                .get((self.ioprio >> IOPRIO_CLASS_SHIFT) as usize)
                .copied()
                .unwrap_or("unknown");
            parts.push(format!("I/O {class} {}", self.ioprio & IOPRIO_DATA_MASK));
        }
        if self.timer_slack_ns != DEFAULT_TIMER_SLACK_NS {
            parts.push(format!("timer slack {} ns", self.timer_slack_ns));
        }
        parts.join(", ")
    }
}

impl Prctl {
    /// What differs from a default process, one item each, as `ckpt show`
    /// prints it.
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.pdeath_sig != 0 {
            out.push(format!("parent-death signal {}", self.pdeath_sig));
        }
        if self.dumpable != DEFAULT_DUMPABLE {
            out.push(format!("dumpable {}", self.dumpable));
        }
        if self.child_subreaper {
            out.push("child subreaper".into());
        }
        if self.thp_disable != 0 {
            out.push(format!("THP disabled ({:#x})", self.thp_disable));
        }
        if self.mdwe != 0 {
            out.push(format!("MDWE {:#x}", self.mdwe));
        }
        if self.mlock_future {
            let onfault = if self.mlock_future_onfault {
                "|MCL_ONFAULT"
            } else {
                ""
            };
            out.push(format!("mlockall(MCL_FUTURE{onfault})"));
        }
        for l in &self.locked {
            let onfault = if l.onfault { " on fault" } else { "" };
            out.push(format!("locked {:#x}-{:#x}{onfault}", l.start, l.end));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_read_like_the_kernels() {
        assert_eq!(cpu_list(&[0b1011_1001]), "0,3-5,7");
        assert_eq!(cpu_list(&[0, 1]), "64");
    }

    #[test]
    fn only_what_differs_is_described() {
        let s = Sched {
            affinity: vec![0b10],
            timer_slack_ns: DEFAULT_TIMER_SLACK_NS,
            ..Default::default()
        };
        assert_eq!(s.describe(), "cpus 1");
        let s = Sched {
            policy: 1,
            priority: 10,
            reset_on_fork: true,
            ioprio: (1 << IOPRIO_CLASS_SHIFT) | 4,
            ..s
        };
        assert_eq!(
            s.describe(),
            "cpus 1, SCHED_FIFO priority 10, SCHED_RESET_ON_FORK, I/O realtime 4"
        );
        let p = Prctl {
            dumpable: DEFAULT_DUMPABLE,
            ..Default::default()
        };
        assert!(p.describe().is_empty());
    }
}
