//! Seccomp state of each thread. A thread in seccomp mode would have the
//! parasite's syscalls filtered (or be killed by strict mode), so its
//! seccomp is suspended for as long as ckpt traces it
//! (`PTRACE_O_SUSPEND_SECCOMP`, lifted by the kernel at detach). Filters
//! are read with `PTRACE_SECCOMP_GET_FILTER` and stored oldest first; a
//! filter threads share (inherited at clone, or synchronised with TSYNC)
//! is stored once. The kernel's index counts from the oldest filter
//! (`get_nth_filter` walks back `count - index` links), whatever ptrace(2)
//! says; tests/seccomp.rs checks the order through which filter's errno
//! wins.

use ckpt_image::seccomp::{MAX_INSNS, MAX_PATH_INSNS, MODE_FILTER, MODE_STRICT};
use ckpt_image::seccomp::{Seccomp, SeccompFilter};
use ckpt_image::task::Core;
use ckpt_parasite::{ParasiteError, Tracee};
use nix::errno::Errno;

use crate::error::{DumpError, Result};
use crate::procfile;

/// `SECCOMP_MODE_DISABLED`.
const MODE_DISABLED: u32 = 0;
/// Most filters a chain can hold: each costs at least one instruction plus
/// the kernel's 4 of overhead.
const MAX_FILTERS: u64 = (MAX_PATH_INSNS / 5) as u64;

/// A numeric field of thread `tid`'s status (`Seccomp`, `Seccomp_filters`),
/// 0 when the kernel does not show it.
fn status_number(pid: i32, tid: i32, key: &str) -> Result<u64> {
    let status = procfile::read(pid, &format!("task/{tid}/status"))?;
    status_text_number(pid, tid, &status, key)
}

/// [`status_number`] from a `status` text already read.
fn status_text_number(pid: i32, tid: i32, status: &str, key: &str) -> Result<u64> {
    let file = format!("task/{tid}/status");
    procfile::status_field(status, key)
        .unwrap_or("0")
        .parse()
        .map_err(|e: std::num::ParseIntError| DumpError::Parse {
            pid,
            path: file,
            what: format!("{key}: {e}"),
        })
}

/// The `Seccomp:` mode of thread `tid` of `pid`.
fn mode(pid: i32, tid: i32) -> Result<u32> {
    Ok(status_number(pid, tid, "Seccomp")? as u32)
}

/// Suspends the seccomp of a thread just seized, if it has any, so that
/// no syscall ckpt runs in it is filtered. Suspending needs CAP_SYS_ADMIN.
pub fn suspend(pid: i32, t: &Tracee) -> Result<()> {
    let tid = t.pid();
    if mode(pid, tid)? == MODE_DISABLED {
        return Ok(());
    }
    t.suspend_seccomp().map_err(|e| match e {
        ParasiteError::Ptrace {
            source: Errno::EPERM,
            ..
        } => DumpError::Permission {
            pid,
            what: format!("thread {tid}: suspending seccomp needs CAP_SYS_ADMIN"),
        },
        ParasiteError::Ptrace {
            source: Errno::EINVAL,
            ..
        } => DumpError::Unsupported {
            pid,
            what: format!(
                "thread {tid}: seccomp on a kernel without PTRACE_O_SUSPEND_SECCOMP (CONFIG_CHECKPOINT_RESTORE)"
            ),
        },
        other => other.into(),
    })
}

/// Fills the seccomp state of the leader (`tasks[0]`) and every thread of
/// `core` (in the order of `tasks[1..]`) and the shared filter table;
/// `texts` are the tasks' /proc texts, in the same order.
pub fn collect(
    pid: i32,
    tasks: &[Tracee],
    texts: &[procfile::TaskTexts],
    core: &mut Core,
) -> Result<()> {
    let mut table = Vec::new();
    core.seccomp = of_thread(pid, &tasks[0], &texts[0].status, &mut table)?;
    for ((t, tc), x) in tasks[1..]
        .iter()
        .zip(core.threads.iter_mut())
        .zip(&texts[1..])
    {
        tc.seccomp = of_thread(pid, t, &x.status, &mut table)?;
    }
    core.seccomp_filters = table;
    Ok(())
}

/// The seccomp state of task `t`, whose `status` text (read while it is
/// frozen, so still true) gives its mode and filter count.
fn of_thread(
    pid: i32,
    t: &Tracee,
    status: &str,
    table: &mut Vec<SeccompFilter>,
) -> Result<Option<Seccomp>> {
    let tid = t.pid();
    let mode = status_text_number(pid, tid, status, "Seccomp")? as u32;
    match mode {
        MODE_DISABLED => return Ok(None),
        MODE_STRICT => {
            return Ok(Some(Seccomp {
                mode,
                filters: Vec::new(),
            }));
        }
        MODE_FILTER => {}
        other => {
            return Err(DumpError::Unsupported {
                pid,
                what: format!("thread {tid}: seccomp mode {other}"),
            });
        }
    }
    let mut oldest_first = Vec::new();
    for index in 0.. {
        if index >= MAX_FILTERS {
            return Err(DumpError::Unsupported {
                pid,
                what: format!("thread {tid}: more than {MAX_FILTERS} seccomp filters"),
            });
        }
        let Some(insns) = t.seccomp_filter(index, MAX_INSNS)? else {
            break;
        };
        let flags = match t.seccomp_filter_flags(index) {
            Ok(f) => f,
            // Kernels without PTRACE_SECCOMP_GET_METADATA: no flags known.
            Err(ParasiteError::Ptrace {
                source: Errno::EIO | Errno::EINVAL,
                ..
            }) => 0,
            Err(e) => return Err(e.into()),
        };
        let f = SeccompFilter { insns, flags };
        if f.notifies_user() {
            return Err(DumpError::Unsupported {
                pid,
                what: format!(
                    "thread {tid}: seccomp filter {index} returning SECCOMP_RET_USER_NOTIF (its supervisor's listener cannot be saved)"
                ),
            });
        }
        oldest_first.push(f);
    }
    // The kernel's own count of the chain: a mismatch means the filters
    // were not all read.
    let counted = status_text_number(pid, tid, status, "Seccomp_filters")?;
    if counted != oldest_first.len() as u64 {
        return Err(DumpError::Parse {
            pid,
            path: format!("task/{tid}/status"),
            what: format!(
                "Seccomp_filters: {counted}, but {} filters could be read",
                oldest_first.len()
            ),
        });
    }
    let filters = oldest_first
        .into_iter()
        .map(|f| {
            let ix = table.iter().position(|g| *g == f).unwrap_or_else(|| {
                table.push(f);
                table.len() - 1
            });
            ix as u32
        })
        .collect();
    Ok(Some(Seccomp { mode, filters }))
}
