//! Phase 1, freeze: every task of the tree seized and stopped, after the
//! checks that refuse what cannot be dumped before anything is touched;
//! and the way back, thawing the tree exactly as it was.

use std::time::Instant;

use ckpt_parasite::ParasiteError;
use nix::errno::Errno;

use crate::blockers::Blockers;
use crate::error::{DumpError, Result};
use crate::options::FreezeOptions;
use crate::stats::ms_since;
use crate::{Frozen, pidns, procfile, srun_pmix, stopped, tree};

/// Freezes `root` and every descendant (see [`crate::freeze_with`]).
pub(crate) fn tree(root: i32, opts: FreezeOptions) -> Result<Frozen> {
    if root <= 0 {
        return Err(DumpError::NoProcess { pid: root });
    }
    let frozen_at = Instant::now();
    let mut blockers = Blockers::default();
    log::info!("freeze: pid {root} and its descendants");
    let ns = pidns::of_root(root)?;
    if let pidns::TreeNs::RootInit { .. } = ns {
        log::info!(
            "freeze: pid {root} is PID 1 of its own PID namespace: saving that namespace's pids"
        );
    }
    let caller = ckpt_image::caller::acting_for();
    // Acting for a caller, another user's process is not even seized: the
    // check before the seize spares it, the one after the freeze decides.
    let check = |pid| {
        precheck(pid, ns)?;
        caller.map_or(Ok(()), |c| crate::caller::check_task(pid, pid, c))?;
        srun_pmix::refuse_rank(pid, root, opts.pmix_reconnect)
    };
    let procs = tree::freeze(root, check, seize_error, &mut blockers)?;
    ckpt_parasite::fault::inject(ckpt_parasite::fault::FaultPoint::AfterSeize);
    let freeze_ms = ms_since(frozen_at);
    log::info!(
        "freeze: {} processes, {} threads frozen ({freeze_ms:.3} ms)",
        procs.len(),
        procs.iter().map(|p| p.tasks.len()).sum::<usize>()
    );
    let mut frozen = Frozen {
        root,
        ns,
        procs,
        frozen_at,
        freeze_ms,
        blockers,
        drain_opts: None,
        tcp: None,
        thawed_after: None,
        retired: Vec::new(),
    };
    // On failure, dropping `frozen` thaws the tree untouched.
    crate::shared_tables::mark(&mut frozen.procs, &mut frozen.blockers)?;
    if let Some(c) = caller {
        // On failure, dropping `frozen` thaws the tree untouched.
        crate::caller::check(&frozen.procs, c)?;
    }
    Ok(frozen)
}

impl Frozen {
    /// A process that died while frozen makes whatever touched it next fail
    /// with an obscure error (a short read of its memory, ESRCH from ptrace):
    /// name the death instead.
    pub(crate) fn explain(&self, e: DumpError) -> DumpError {
        let dead = || {
            self.procs
                .iter()
                .filter(|p| p.zombie_status.is_none())
                .find(|p| !tree::is_alive(p.pid))
        };
        // SIGKILL takes a moment to turn a traced task into a zombie; only
        // errors of controlling a task can be that symptom, so only those
        // wait for it.
        let mut died = dead();
        if matches!(e, DumpError::Parasite(_)) {
            for _ in 0..DEATH_SETTLE_POLLS {
                if died.is_some() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
                died = dead();
            }
        }
        match died {
            Some(p) => DumpError::Exited {
                pid: p.pid,
                detail: e.to_string(),
            },
            None => e,
        }
    }

    /// Lets the tree run before the checkpoint is committed (a background
    /// dump or a pre-dump, once what must be saved frozen is), and records
    /// how long it was frozen.
    pub(crate) fn thaw_early(&mut self) -> Result<()> {
        self.thaw()?;
        self.thawed_after = Some(self.frozen_at.elapsed());
        self.retired.clear();
        Ok(())
    }

    /// How long the tree was frozen, or has been so far.
    pub(crate) fn frozen_for(&self) -> std::time::Duration {
        self.thawed_after
            .unwrap_or_else(|| self.frozen_at.elapsed())
    }

    /// Detaches every task, children first so no parent runs while a child
    /// is still stopped.
    pub(crate) fn thaw(&mut self) -> Result<()> {
        // Connections go on where they were before the tree does.
        let mut tcp = self.tcp.take().unwrap_or_default();
        tcp.release();
        let mut first_err = None;
        for p in std::mem::take(&mut self.procs).into_iter().rev() {
            for t in p.tasks {
                if let Err(e) = tcp.detach(p.pid, t) {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = self.thaw();
    }
}

/// How many 10 ms polls [`Frozen::explain`] gives a killed task to show as
/// dead.
const DEATH_SETTLE_POLLS: u32 = 50;

/// `PF_KTHREAD` in the flags field of `/proc/PID/stat`.
const PF_KTHREAD: u64 = 0x0020_0000;

/// Refuses what this version cannot dump, before touching the process.
pub(crate) fn precheck(pid: i32, ns: pidns::TreeNs) -> Result<()> {
    if pid <= 0 {
        return Err(DumpError::NoProcess { pid });
    }
    if pid == std::process::id() as i32 {
        return Err(DumpError::Unsupported {
            pid,
            what: "dumping ckpt itself".into(),
        });
    }
    let status = procfile::read(pid, "status")?;
    // Kernel threads have no user memory to save; ptrace refuses them with
    // a bare EPERM, so say what they are first.
    let flags = procfile::stat_fields(pid)?
        .get(procfile::stat_index(9))
        .copied()
        .unwrap_or(0);
    if procfile::status_field(&status, "Kthread") == Some("1") || flags & PF_KTHREAD != 0 {
        return Err(DumpError::Unsupported {
            pid,
            what: "kernel thread".into(),
        });
    }
    pidns::check_member(pid, &status, ns)?;
    if let Some(state) = procfile::status_field(&status, "State")
        && (state.starts_with('Z') || state.starts_with('X'))
    {
        return Err(DumpError::Unsupported {
            pid,
            what: "zombie process (its parent has not reaped it)".into(),
        });
    }
    stopped::check_tracer(pid, &status)?;
    if procfile::status_field(&status, "Tgid") != Some(&pid.to_string()) {
        return Err(DumpError::Unsupported {
            pid,
            what: "dumping a single thread of a process (give the process id)".into(),
        });
    }
    Ok(())
}

fn seize_error(pid: i32, e: ParasiteError) -> DumpError {
    match e {
        ParasiteError::Ptrace {
            op: "seize",
            source: Errno::ESRCH,
            ..
        } => DumpError::NoProcess { pid },
        ParasiteError::Ptrace {
            op: "seize",
            source: Errno::EPERM,
            ..
        } => DumpError::Permission {
            pid,
            what: "ptrace attach refused".into(),
        },
        other => other.into(),
    }
}
