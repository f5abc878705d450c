//! prctl state: per thread the parent-death signal; per process
//! dumpable, child subreaper, THP disable, MDWE, and the memory locks
//! (locked ranges from smaps, `mlockall(MCL_FUTURE)` probed by mapping a
//! fresh page inside the process and looking at its flags). The getters
//! have no /proc file: they run inside the process through the parasite.

use ckpt_image::task::{LockedRange, Prctl};
use ckpt_parasite::proto::Getters;
use ckpt_parasite::{Infection, ParasiteError};
use nix::errno::Errno;

use crate::error::{DumpError, Result};
use crate::procfile;

/// `PR_GET_DUMPABLE` value that `PR_SET_DUMPABLE` cannot set back
/// (SUID_DUMP_ROOT, left by a set-id exec with `fs.suid_dumpable=2`).
const SUID_DUMP_ROOT: u64 = 2;
/// smaps VmFlags: the range is locked (VM_LOCKED).
const VM_FLAG_LOCKED: &str = "lo";
/// smaps VmFlags: locked as it is faulted in (VM_LOCKONFAULT).
const VM_FLAG_LOCKONFAULT: &str = "lf";
/// Size of the probe mapping.
const PAGE: u64 = 4096;

/// What the process-wide getters returned, asked in the leader while the
/// parasite is in it.
#[derive(Debug, Default, Clone)]
pub struct Asked {
    /// The process-wide part of the image, with the leader's pdeath_sig.
    pub prctl: Prctl,
    /// The leader's timer slack (`PR_GET_TIMERSLACK`).
    pub timer_slack_ret: i64,
}

/// The leader's answers to the getters, asked by the parasite's collection
/// command (`g`), and the `mlockall` probe run in it through `inf`.
pub fn ask(inf: &Infection<'_>, g: &Getters) -> Result<Asked> {
    let pid = inf.tracee().pid();
    let got = |name: &'static str, ret: i64| ckpt_parasite::check_ret(pid, name, ret);
    got("prctl(PR_GET_PDEATHSIG)", g.pdeath_sig_ret)?;
    let pdeath_sig = g.pdeath_sig;
    got("prctl(PR_GET_CHILD_SUBREAPER)", g.child_subreaper_ret)?;
    let child_subreaper = g.child_subreaper != 0;
    let dumpable = got("prctl(PR_GET_DUMPABLE)", g.dumpable_ret)?;
    if dumpable == SUID_DUMP_ROOT {
        return Err(DumpError::Unsupported {
            pid,
            what: "dumpable 2 (core dumps readable by root only, after a set-id exec)".into(),
        });
    }
    let thp_disable = got("prctl(PR_GET_THP_DISABLE)", g.thp_disable_ret)?;
    // Kernels before 6.3 have no MDWE and answer EINVAL: nothing to keep.
    let mdwe = match got("prctl(PR_GET_MDWE)", g.mdwe_ret) {
        Err(ParasiteError::RemoteSyscall {
            errno: nix::errno::Errno::EINVAL,
            ..
        }) => 0,
        other => other?,
    };
    let timer_slack = got("prctl(PR_GET_TIMERSLACK)", g.timer_slack_ret)?;
    let (mlock_future, mlock_future_onfault) = probe_mlock_future(inf)?;
    Ok(Asked {
        prctl: Prctl {
            pdeath_sig,
            dumpable: dumpable as u32,
            child_subreaper,
            thp_disable: thp_disable as u32,
            mdwe: mdwe as u32,
            mlock_future,
            mlock_future_onfault,
            locked: Vec::new(),
        },
        timer_slack_ret: timer_slack as i64,
    })
}

/// `mlockall(MCL_FUTURE)` has no getter: a page mapped now inside the
/// process comes out locked exactly when it is in effect, which the
/// process's locked total (`VmLck`) shows without walking smaps; only then
/// is smaps read, for `lf` (MCL_ONFAULT). The page is unmapped again
/// before this returns.
fn probe_mlock_future(inf: &Infection<'_>) -> Result<(bool, bool)> {
    let pid = inf.tracee().pid();
    let before = locked_kb(pid)?;
    let addr = inf.syscall(
        "mmap (mlockall probe)",
        libc::SYS_mmap,
        [
            0,
            PAGE,
            libc::PROT_NONE as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
            u64::MAX,
            0,
        ],
    )?;
    let flags = locked_kb(pid).and_then(|after| {
        if after == before {
            return Ok((false, false));
        }
        locked_ranges(pid).map(|ranges| {
            ranges
                .iter()
                .find(|r| r.start <= addr && addr < r.end)
                .map_or((false, false), |r| (true, r.onfault))
        })
    });
    inf.syscall(
        "munmap (mlockall probe)",
        libc::SYS_munmap,
        [addr, PAGE, 0, 0, 0, 0],
    )?;
    flags
}

/// The process's locked memory in kB (`VmLck` of its status).
fn locked_kb(pid: i32) -> Result<u64> {
    let status = procfile::read(pid, "status")?;
    procfile::status_field(&status, "VmLck")
        .and_then(|v| v.trim_end_matches("kB").trim().parse().ok())
        .ok_or_else(|| DumpError::Parse {
            pid,
            path: "status".into(),
            what: "no VmLck".into(),
        })
}

/// The locked ranges of `pid`'s address space (smaps VmFlags); smaps,
/// which walks the page tables, is read only when something is locked.
pub fn locked_ranges(pid: i32) -> Result<Vec<LockedRange>> {
    if locked_kb(pid)? == 0 {
        return Ok(Vec::new());
    }
    let smaps = procfile::read(pid, "smaps")?;
    let mut out = Vec::new();
    let mut cur: Option<(u64, u64)> = None;
    for line in smaps.lines() {
        if let Some(flags) = line.strip_prefix("VmFlags:") {
            let Some((start, end)) = cur.take() else {
                continue;
            };
            let has = |f: &str| flags.split_whitespace().any(|x| x == f);
            if has(VM_FLAG_LOCKED) || has(VM_FLAG_LOCKONFAULT) {
                out.push(LockedRange {
                    start,
                    end,
                    onfault: has(VM_FLAG_LOCKONFAULT),
                });
            }
        } else if let Some((range, _)) = line.split_once(' ')
            && let Some((a, b)) = range.split_once('-')
            && let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
        {
            cur = Some((a, b));
        }
    }
    Ok(out)
}

/// Names why the parasite could not be mapped when the process forbids
/// writable executable memory: memory-deny-write-execute cannot be undone
/// from outside, and ckpt's parasite needs such a mapping.
pub fn infect_error(e: ParasiteError) -> DumpError {
    match e {
        ParasiteError::RemoteSyscall {
            pid,
            name,
            errno: Errno::EACCES,
        } if name.starts_with("mmap") => DumpError::Unsupported {
            pid,
            what: "memory-deny-write-execute (PR_SET_MDWE, or a security policy refusing \
                   writable executable memory: the parasite cannot be mapped)"
                .into(),
        },
        other => other.into(),
    }
}

/// The per-thread part for another thread, from what the parasite asked it.
pub fn thread(pdeath_sig: i32, pdeath_sig_ret: i64, pid: i32, tid: i32) -> Result<Prctl> {
    if pdeath_sig_ret < 0 {
        return Err(DumpError::Proc {
            pid,
            path: format!("thread {tid}: prctl(PR_GET_PDEATHSIG)").into(),
            source: std::io::Error::from_raw_os_error(-pdeath_sig_ret as i32),
        });
    }
    Ok(Prctl {
        pdeath_sig: pdeath_sig as u32,
        ..Default::default()
    })
}
