//! Task state other than memory and files: registers and xstate, signals,
//! timers, credentials, limits and identity.

use ckpt_image::task::{
    AltStack, ControllingTerminal, Core, GpRegs, ITimer, PendingSignal, RemovedDir, Rlimit,
    RobustList, Rseq, SigAction, ThreadCore,
};
use ckpt_parasite::proto::MiscState;
use ckpt_parasite::{Infection, Regs, ThreadState, Tracee};
use std::os::unix::fs::MetadataExt;

use crate::error::{DumpError, Result};
use crate::procfile;

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
    /// The process's POSIX timers (asked in the leader only).
    pub posix_timers: Vec<ckpt_image::timer::PosixTimer>,
    /// The leader's `prctl(PR_GET_SECUREBITS)`.
    pub securebits: i64,
    /// The prctl getters' answers (asked in the leader only).
    pub prctl: crate::prctl::Asked,
    /// The process's membarrier registrations.
    pub membarrier: u32,
}

/// Runs the parasite's collection command in the process's leader (and
/// asks for its POSIX timers), collects every other thread through the
/// same infection ([`Infection::thread_state`]), runs `with_parasite`
/// (what else a dump needs done inside the process), and cures the leader.
/// `texts`: every task's status, the leader's first, read before the
/// parasite (the signals they have pending tell which it may stop on).
pub fn run_parasite(
    leader: &Tracee,
    threads: &[Tracee],
    texts: &[procfile::TaskTexts],
    with_parasite: &mut dyn FnMut(&Infection<'_>) -> Result<()>,
) -> Result<(TaskMisc, Vec<ThreadState>)> {
    let quiet_leader = quiet_signal_of_leader(&texts[0]);
    let inf: Infection<'_> = leader.infect().map_err(crate::prctl::infect_error)?;
    let args = inf.dump_misc(quiet_leader)?;
    ckpt_parasite::fault::inject(ckpt_parasite::fault::FaultPoint::ParasiteLoaded);
    let posix_timers = crate::timer::collect(&inf, leader.pid())?;
    let getters = &args.misc.getters;
    let securebits = ckpt_parasite::check_ret(
        leader.pid(),
        "prctl(PR_GET_SECUREBITS)",
        getters.securebits_ret,
    )? as i64;
    let prctl = crate::prctl::ask(&inf, getters)?;
    let membarrier = crate::membarrier::registrations(leader.pid(), getters.membarrier_ret)?;
    crate::aio::check_owned(&inf, leader.pid())?;
    let out = TaskMisc {
        securebits,
        prctl,
        membarrier,
        posix_timers,
        regs: *inf.saved_regs(),
        xstate: inf.saved_xstate().to_vec(),
        sigmask: inf.saved_sigmask(),
        misc: Box::new(args.misc),
    };
    // A signal pending for the whole process could be the one a thread
    // stops on: the leader's choice excludes those already.
    let threads = threads
        .iter()
        .zip(&texts[1..])
        .map(|(t, text)| inf.thread_state(t, quiet_leader.filter(|&s| !pending_in(text, s))))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    with_parasite(&inf)?;
    inf.cure()?;
    Ok((out, threads))
}

/// Before the blob has read the dispositions: a signal the process
/// ignores, as the leader's status tells (not caught), and that neither the
/// process nor its leader has pending, which the blob's own would take
/// the place of. `None`: the leader's blob stops at its syscalls.
fn quiet_signal_of_leader(leader: &procfile::TaskTexts) -> Option<i32> {
    let caught = status_mask(leader, "SigCgt")?;
    let shared = status_mask(leader, "ShdPnd")?;
    QUIET_CANDIDATES
        .into_iter()
        .find(|&sig| (caught | shared) & sig_bit(sig) == 0 && !pending_in(leader, sig))
}

/// A signal mask field of a task's status (`None`: unreadable).
fn status_mask(text: &procfile::TaskTexts, field: &str) -> Option<u64> {
    procfile::status_field(&text.status, field).and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// The bit of `sig` in a signal mask.
fn sig_bit(sig: i32) -> u64 {
    1u64 << (sig - 1)
}

/// Whether the thread whose status is `text` has `sig` pending: its stop
/// would take that one's place. Unreadable: taken as pending.
fn pending_in(text: &procfile::TaskTexts, sig: i32) -> bool {
    status_mask(text, "SigPnd").is_none_or(|pnd| pnd & sig_bit(sig) != 0)
}

/// Signals whose default action is to be ignored, the least used first:
/// what a task running ckpt's blob can stop itself with.
const QUIET_CANDIDATES: [i32; 3] = [libc::SIGURG, libc::SIGWINCH, libc::SIGCHLD];

/// Builds the core image of a frozen task.
pub fn collect(t: &Tracee, tm: &TaskMisc, texts: &procfile::TaskTexts) -> Result<Core> {
    let pid = t.pid();
    let proc = procfs::process::Process::new(pid).map_err(|e| procfs_err(pid, "", e))?;
    let status = proc.status().map_err(|e| procfs_err(pid, "status", e))?;
    let limits = proc.limits().map_err(|e| procfs_err(pid, "limits", e))?;
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
    let mut pending = pending_signals(t, false)?;
    pending.extend(pending_signals(t, true)?);
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
    let stat = procfile::stat_fields(pid)?;
    let cwd = working_directory(pid)?;

    Ok(Core {
        ib: None,
        pid,
        comm: procfile::read(pid, "comm")?
            .trim_end_matches('\n')
            .to_string(),
        exe: procfile::readlink(pid, "exe")?,
        cwd: cwd.path,
        root: root_directory(pid)?,
        umask: status.umask.unwrap_or(0o022),
        personality: u32::from_str_radix(procfile::read(pid, "personality")?.trim(), 16).map_err(
            |e| DumpError::Parse {
                pid,
                path: "personality".into(),
                what: e.to_string(),
            },
        )?,
        creds: Some(crate::creds::collect(
            pid,
            pid,
            &texts.status,
            tm.securebits,
        )?),
        regs: Some(gp_regs(&tm.regs)),
        xstate: tm.xstate.clone(),
        sigmask: tm.sigmask,
        sigactions,
        pending,
        itimers,
        altstack: altstack(m),
        tid_address: tid_address(m),
        robust_list: robust_list(t)?,
        rseq: rseq(t)?,
        rlimits: rlimits(&limits),
        mm: Some(crate::mm::mm_fields(pid, &stat, m.brk)?),
        pgid: stat[procfile::stat_index(5)] as i32,
        sid: stat[procfile::stat_index(6)] as i32,
        threads: Vec::new(),
        posix_timers: tm.posix_timers.clone(),
        sched: Some(crate::sched::collect(pid, pid, tm.prctl.timer_slack_ret)?),
        prctl: Some(ckpt_image::task::Prctl {
            locked: crate::prctl::locked_ranges(pid)?,
            ..tm.prctl.prctl.clone()
        }),
        oom_score_adj: crate::sched::oom_score_adj(pid)?,
        loginuid: crate::loginuid::collect(pid)?,
        membarrier_registrations: tm.membarrier,
        seccomp: None,
        seccomp_filters: Vec::new(),
        job_stop: None,
        ctty: controlling_terminal(pid, &stat),
        cwd_removed: cwd.removed,
        // Known only across the tree: set by the caller.
        shared_with_parent: None,
    })
}

/// How `/proc/PID/cwd` and `/proc/PID/root` name a removed directory.
const DELETED: &str = " (deleted)";

/// A working directory as the image records it.
struct WorkingDirectory {
    /// Its path, without the suffix of a removed one.
    path: String,
    /// Owner and mode of a removed one, to make it again.
    removed: Option<RemovedDir>,
}

/// The working directory; one removed while in use (no links left) is
/// told by its inode, not by its name, which could end in " (deleted)".
fn working_directory(pid: i32) -> Result<WorkingDirectory> {
    let link = procfile::readlink(pid, "cwd")?;
    let meta = dir_meta(pid, "cwd")?;
    match link.strip_suffix(DELETED) {
        Some(path) if meta.nlink() == 0 => Ok(WorkingDirectory {
            path: path.to_string(),
            removed: Some(RemovedDir {
                mode: meta.mode(),
                uid: meta.uid(),
                gid: meta.gid(),
            }),
        }),
        _ => Ok(WorkingDirectory {
            path: link,
            removed: None,
        }),
    }
}

/// The root directory; a removed one is refused (a process in it could
/// reach nothing outside, and nothing is left inside to come back to).
fn root_directory(pid: i32) -> Result<String> {
    let link = procfile::readlink(pid, "root")?;
    if link.ends_with(DELETED) && dir_meta(pid, "root")?.nlink() == 0 {
        return Err(DumpError::Unsupported {
            pid,
            what: format!("root directory {link}: removed while the process is chrooted into it,"),
        });
    }
    Ok(link)
}

fn dir_meta(pid: i32, name: &str) -> Result<std::fs::Metadata> {
    let path = std::path::PathBuf::from(format!("/proc/{pid}/{name}"));
    std::fs::metadata(&path).map_err(|source| DumpError::Proc { pid, path, source })
}

/// The controlling terminal of the session `pid` leads, if it has one
/// (members share the leader's; only the leader can take it back). Which
/// pair it is, and the leader's fd on it, are filled in once the tree's
/// files are known (`pty::link_controlling_terminals`).
fn controlling_terminal(pid: i32, stat: &[u64]) -> Option<ControllingTerminal> {
    let sid = stat[procfile::stat_index(6)] as i32;
    let rdev = stat[procfile::stat_index(7)];
    if sid != pid || rdev == 0 {
        return None;
    }
    // tpgid is -1 when the terminal has no foreground group.
    let foreground_pgid = (stat[procfile::stat_index(8)] as i64).max(0) as i32;
    Some(ControllingTerminal {
        rdev,
        path: String::new(),
        pty_master_file_id: 0,
        foreground_pgid,
        fd: -1,
    })
}

/// Builds the image of a thread other than the leader.
pub fn collect_thread(
    t: &Tracee,
    pid: i32,
    ts: ThreadState,
    texts: &procfile::TaskTexts,
) -> Result<ThreadCore> {
    let tid = t.pid();
    let sched = crate::sched::collect(pid, tid, ts.timer_slack_ret)?;
    let prctl = crate::prctl::thread(ts.pdeath_sig, ts.pdeath_sig_ret, pid, tid)?;
    Ok(ThreadCore {
        tid,
        sched: Some(sched),
        prctl: Some(prctl),
        comm: texts.comm.clone(),
        regs: Some(gp_regs(&ts.regs)),
        sigmask: ts.sigmask,
        pending: pending_signals(t, false)?,
        altstack: (ts.altstack_ret == 0 && ts.altstack.flags & libc::SS_DISABLE == 0).then_some(
            AltStack {
                sp: ts.altstack.sp,
                flags: ts.altstack.flags,
                size: ts.altstack.size,
            },
        ),
        tid_address: if ts.tid_address_ret == 0 {
            ts.tid_address
        } else {
            0
        },
        xstate: ts.xstate,
        robust_list: robust_list(t)?,
        rseq: rseq(t)?,
        creds: Some(crate::creds::collect(
            pid,
            tid,
            &texts.status,
            ts.securebits,
        )?),
        seccomp: None,
    })
}

fn pending_signals(t: &Tracee, shared: bool) -> Result<Vec<PendingSignal>> {
    Ok(t.pending_signals(shared)?
        .into_iter()
        .map(|info| PendingSignal {
            shared,
            siginfo: info.to_vec(),
        })
        .collect())
}

fn altstack(m: &MiscState) -> Option<AltStack> {
    (m.altstack_ret == 0 && m.altstack.flags & libc::SS_DISABLE == 0).then_some(AltStack {
        sp: m.altstack.sp,
        flags: m.altstack.flags,
        size: m.altstack.size,
    })
}

fn tid_address(m: &MiscState) -> u64 {
    if m.tid_address_ret == 0 {
        m.tid_address
    } else {
        0
    }
}

fn robust_list(t: &Tracee) -> Result<Option<RobustList>> {
    let (head, len) = t.robust_list()?;
    Ok((head != 0).then_some(RobustList { head, len }))
}

fn rseq(t: &Tracee) -> Result<Option<Rseq>> {
    let r = t.rseq()?;
    Ok((r.rseq_abi_pointer != 0).then_some(Rseq {
        addr: r.rseq_abi_pointer,
        len: r.rseq_abi_size,
        signature: r.signature,
    }))
}

/// Resource limits from `/proc/PID/limits` (prlimit on another uid's task
/// needs CAP_SYS_RESOURCE, which root lacks on some hosts).
fn rlimits(l: &procfs::process::Limits) -> Vec<Rlimit> {
    use procfs::process::LimitValue;
    let value = |v: &LimitValue| match v {
        LimitValue::Unlimited => u64::MAX,
        LimitValue::Value(n) => *n,
    };
    // In RLIMIT_* order (resource.h).
    [
        &l.max_cpu_time,
        &l.max_file_size,
        &l.max_data_size,
        &l.max_stack_size,
        &l.max_core_file_size,
        &l.max_resident_set,
        &l.max_processes,
        &l.max_open_files,
        &l.max_locked_memory,
        &l.max_address_space,
        &l.max_file_locks,
        &l.max_pending_signals,
        &l.max_msgqueue_size,
        &l.max_nice_priority,
        &l.max_realtime_priority,
        &l.max_realtime_timeout,
    ]
    .iter()
    .enumerate()
    .map(|(resource, lim)| Rlimit {
        resource: resource as u32,
        soft: value(&lim.soft_limit),
        hard: value(&lim.hard_limit),
    })
    .collect()
}

/// Maps a procfs crate error to the dumper's, naming pid and file.
fn procfs_err(pid: i32, file: &str, e: procfs::ProcError) -> DumpError {
    use procfs::ProcError;
    match e {
        ProcError::NotFound(_) => DumpError::NoProcess { pid },
        ProcError::PermissionDenied(_) => DumpError::Permission {
            pid,
            what: format!("reading /proc/{pid}/{file}"),
        },
        other => DumpError::Parse {
            pid,
            path: file.into(),
            what: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_limits_match_getrlimit() {
        let me = procfs::process::Process::myself().unwrap();
        let l = rlimits(&me.limits().unwrap());
        let nofile = l
            .iter()
            .find(|r| r.resource == libc::RLIMIT_NOFILE)
            .unwrap();
        let (soft, hard) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!((nofile.soft, nofile.hard), (soft, hard));
    }
}
