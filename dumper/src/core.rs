//! Task state other than memory and files: registers and xstate, signals,
//! timers, credentials, limits and identity.

use ckpt_image::core::{
    AltStack, Core, Creds, GpRegs, ITimer, PendingSignal, Rlimit, RobustList, Rseq, SigAction,
};
use ckpt_parasite::proto::MiscState;
use ckpt_parasite::{Infection, Regs, Tracee};

use crate::error::{DumpError, Result};
use crate::procfs::{self, status_field};

/// Copies registers into the image type.
pub fn gp_regs(r: &Regs) -> GpRegs {
    GpRegs {
        r15: r.r15,
        r14: r.r14,
        r13: r.r13,
        r12: r.r12,
        rbp: r.rbp,
        rbx: r.rbx,
        r11: r.r11,
        r10: r.r10,
        r9: r.r9,
        r8: r.r8,
        rax: r.rax,
        rcx: r.rcx,
        rdx: r.rdx,
        rsi: r.rsi,
        rdi: r.rdi,
        orig_rax: r.orig_rax,
        rip: r.rip,
        cs: r.cs,
        eflags: r.eflags,
        rsp: r.rsp,
        ss: r.ss,
        fs_base: r.fs_base,
        gs_base: r.gs_base,
        ds: r.ds,
        es: r.es,
        fs: r.fs,
        gs: r.gs,
    }
}

/// State only the task itself can report, gathered by the parasite.
pub struct TaskMisc {
    /// Registers before the parasite touched them.
    pub regs: Regs,
    /// XSAVE area before the parasite touched it.
    pub xstate: Vec<u8>,
    /// Blocked mask before the parasite blocked everything.
    pub sigmask: u64,
    /// What the blob collected.
    pub misc: Box<MiscState>,
}

/// Runs the parasite's collection command and cures the task.
pub fn run_parasite(t: &Tracee) -> Result<TaskMisc> {
    let inf: Infection<'_> = t.infect()?;
    let args = inf.call(ckpt_parasite::proto::CMD_DUMP_MISC)?;
    crate::fault::inject(crate::fault::FaultPoint::ParasiteLoaded);
    let out = TaskMisc {
        regs: *inf.saved_regs(),
        xstate: inf.saved_xstate().to_vec(),
        sigmask: inf.saved_sigmask(),
        misc: Box::new(args.misc),
    };
    inf.cure()?;
    Ok(out)
}

/// Builds the core image of a frozen task.
pub fn collect(t: &Tracee, tm: &TaskMisc) -> Result<Core> {
    let pid = t.pid();
    let status = procfs::read(pid, "status")?;
    let m = &tm.misc;

    let mut sigactions = Vec::new();
    for (i, sa) in m.sigactions.iter().enumerate() {
        let signo = i as u32 + 1;
        if m.sigaction_ret[i] < 0 || (sa.handler == 0 && sa.flags == 0 && sa.mask == 0) {
            continue;
        }
        sigactions.push(SigAction {
            signo,
            handler: sa.handler,
            flags: sa.flags,
            restorer: sa.restorer,
            mask: sa.mask,
        });
    }
    let mut pending = Vec::new();
    for shared in [false, true] {
        for info in t.pending_signals(shared)? {
            pending.push(PendingSignal {
                shared,
                siginfo: info.to_vec(),
            });
        }
    }
    let itimers = m
        .itimers
        .iter()
        .enumerate()
        .filter(|(i, it)| m.itimer_ret[*i] == 0 && (it.value.sec != 0 || it.value.usec != 0))
        .map(|(i, it)| ITimer {
            which: i as i32,
            interval_us: (it.interval.sec as u64) * 1_000_000 + it.interval.usec as u64,
            value_us: (it.value.sec as u64) * 1_000_000 + it.value.usec as u64,
        })
        .collect();
    let altstack =
        (m.altstack_ret == 0 && m.altstack.flags & libc::SS_DISABLE == 0).then_some(AltStack {
            sp: m.altstack.sp,
            flags: m.altstack.flags,
            size: m.altstack.size,
        });
    let (head, len) = t.robust_list()?;
    let stat = procfs::stat_fields(pid)?;
    let rseq = t.rseq()?;

    Ok(Core {
        pid,
        comm: procfs::read(pid, "comm")?
            .trim_end_matches('\n')
            .to_string(),
        exe: procfs::readlink(pid, "exe")?,
        cwd: procfs::readlink(pid, "cwd")?,
        root: procfs::readlink(pid, "root")?,
        umask: status_field(&status, "Umask")
            .and_then(|v| u32::from_str_radix(v, 8).ok())
            .unwrap_or(0o022),
        personality: u32::from_str_radix(procfs::read(pid, "personality")?.trim(), 16).map_err(
            |e| DumpError::Parse {
                pid,
                path: "personality".into(),
                what: e.to_string(),
            },
        )?,
        creds: Some(creds(pid, &status)?),
        regs: Some(gp_regs(&tm.regs)),
        xstate: tm.xstate.clone(),
        sigmask: tm.sigmask,
        sigactions,
        pending,
        itimers,
        altstack,
        tid_address: if m.tid_address_ret == 0 {
            m.tid_address
        } else {
            0
        },
        robust_list: (head != 0).then_some(RobustList { head, len }),
        rseq: (rseq.rseq_abi_pointer != 0).then_some(Rseq {
            addr: rseq.rseq_abi_pointer,
            len: rseq.rseq_abi_size,
            signature: rseq.signature,
        }),
        rlimits: rlimits(pid)?,
        mm: None,
        pgid: stat[procfs::stat_index(5)] as i32,
        sid: stat[procfs::stat_index(6)] as i32,
    })
}

fn creds(pid: i32, status: &str) -> Result<Creds> {
    let bad = |what: &str| DumpError::Parse {
        pid,
        path: "status".into(),
        what: format!("bad {what} line"),
    };
    let ids = |key: &str| -> Result<Vec<u32>> {
        status_field(status, key)
            .ok_or_else(|| bad(key))?
            .split_whitespace()
            .map(|v| v.parse().map_err(|_| bad(key)))
            .collect()
    };
    let cap = |key: &str| -> Result<u64> {
        u64::from_str_radix(status_field(status, key).ok_or_else(|| bad(key))?, 16)
            .map_err(|_| bad(key))
    };
    Ok(Creds {
        uids: ids("Uid")?,
        gids: ids("Gid")?,
        groups: ids("Groups")?,
        cap_eff: cap("CapEff")?,
        cap_prm: cap("CapPrm")?,
        cap_inh: cap("CapInh")?,
        cap_bnd: cap("CapBnd")?,
        cap_amb: cap("CapAmb")?,
    })
}

/// Resource limits from `/proc/PID/limits` (prlimit on another uid's task
/// needs CAP_SYS_RESOURCE, which root lacks on some hosts).
fn rlimits(pid: i32) -> Result<Vec<Rlimit>> {
    // The rows of /proc/PID/limits in RLIMIT_* order (resource.h).
    const NAMES: [&str; 16] = [
        "Max cpu time",
        "Max file size",
        "Max data size",
        "Max stack size",
        "Max core file size",
        "Max resident set",
        "Max processes",
        "Max open files",
        "Max locked memory",
        "Max address space",
        "Max file locks",
        "Max pending signals",
        "Max msgqueue size",
        "Max nice priority",
        "Max realtime priority",
        "Max realtime timeout",
    ];
    let text = procfs::read(pid, "limits")?;
    let value = |s: &str| -> Option<u64> {
        if s == "unlimited" {
            Some(u64::MAX)
        } else {
            s.parse().ok()
        }
    };
    let mut out = Vec::new();
    for (resource, name) in NAMES.iter().enumerate() {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .ok_or_else(|| DumpError::Parse {
                pid,
                path: "limits".into(),
                what: format!("no {name:?} row"),
            })?;
        let mut f = line[name.len()..].split_whitespace();
        let (Some(soft), Some(hard)) = (f.next().and_then(value), f.next().and_then(value)) else {
            return Err(DumpError::Parse {
                pid,
                path: "limits".into(),
                what: format!("bad {name:?} row"),
            });
        };
        out.push(Rlimit {
            resource: resource as u32,
            soft,
            hard,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_limits_match_getrlimit() {
        let l = rlimits(std::process::id() as i32).unwrap();
        let nofile = l
            .iter()
            .find(|r| r.resource == libc::RLIMIT_NOFILE)
            .unwrap();
        let (soft, hard) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!((nofile.soft, nofile.hard), (soft, hard));
    }
}
