//! Freeze a process, collect its state and write a checkpoint image.
//!
//! Data flows one way: **freeze** ([`ckpt_parasite::Tracee::seize`]) →
//! **collect** (parasite for what only the task knows, then /proc, pagemap
//! and ptrace for the rest) → **write** (pages streamed in parallel into the
//! image directory, metadata, then the manifest and an atomic rename).
//!
//! The target is never left stopped or changed by a failed dump: the
//! [`ckpt_parasite::Infection`] cures itself and the `Tracee` detaches when
//! dropped, and the temporary image directory removes itself unless
//! committed. Only after the manifest is durable does `--kill` kill it.

#![warn(missing_docs)]

pub mod core;
pub mod error;
pub mod fault;
pub mod fds;
pub mod features;
pub mod mm;
pub mod pages;
mod procfile;
mod sys;
mod threads;

use std::path::PathBuf;
use std::time::Instant;

use ckpt_image::manifest::{Manifest, ProcessEntry};
use ckpt_image::mm::Mm;
use ckpt_image::{ImageKind, ImageWriter};
use ckpt_parasite::ParasiteError;
use nix::errno::Errno;

pub use error::{DumpError, Result};

/// What happens to the target once its images are complete and synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FinalState {
    /// Detach; the process carries on (the default).
    #[default]
    LeaveRunning,
    /// SIGKILL it.
    Kill,
}

/// Options of one dump.
pub struct DumpOptions<'a> {
    /// The process to dump.
    pub pid: i32,
    /// The checkpoint directory to create (must not exist).
    pub dir: PathBuf,
    /// What to do with the process afterwards.
    pub final_state: FinalState,
    /// Called with (bytes of page data written, total) while pages are copied.
    pub progress: Option<&'a (dyn Fn(u64, u64) + Sync)>,
    /// Store pages as LZ4 blocks (smaller images of compressible memory;
    /// restore decompresses instead of mapping the file).
    pub compress: bool,
}

/// What a dump produced.
#[derive(Debug, Clone)]
pub struct DumpReport {
    /// The dumped pid.
    pub pid: i32,
    /// The checkpoint directory.
    pub dir: PathBuf,
    /// Number of VMAs.
    pub vmas: usize,
    /// Bytes of page data saved.
    pub pages_bytes: u64,
    /// Number of fds.
    pub fds: usize,
    /// How long the process was frozen, in milliseconds.
    pub frozen_ms: u64,
}

/// Dumps one process (all its threads, no children) into `opts.dir`.
pub fn dump(opts: &DumpOptions<'_>) -> Result<DumpReport> {
    let pid = opts.pid;
    precheck(pid)?;
    let frozen_at = Instant::now();
    let tasks = threads::freeze(pid, |e| seize_error(pid, e))?;
    fault::inject(fault::FaultPoint::AfterSeize);
    // It could have forked between the check and the freeze.
    precheck(pid)?;
    let tracee = &tasks[0];

    let misc = core::run_parasite(tracee)?;
    let mut core = core::collect(tracee, &misc)?;
    core.mm = Some(mm::mm_fields(pid, misc.misc.brk)?);
    for t in &tasks[1..] {
        let tm = core::run_parasite(t)?;
        core.threads.push(core::collect_thread(t, pid, &tm)?);
    }
    let mut vmas = mm::collect_vmas(pid)?;
    let vdso = mm::vdso_info(tracee, &vmas)?;
    let pages_bytes = mm::plan_pages(pid, &mut vmas)?;
    let mut ghosts = Vec::new();
    let files = fds::collect(pid, &mut ghosts)?;

    // Everything is known to be supported: now write.
    let mut w = ImageWriter::create(&opts.dir)?;
    let pw = w.pages(&ckpt_image::pages_name(pid))?;
    let progress = |done: u64| {
        fault::inject(fault::FaultPoint::DuringPages);
        if let Some(p) = opts.progress {
            p(done, pages_bytes)
        }
    };
    let chunks = if opts.compress {
        pages::copy_pages_compressed(tracee, &vmas, &pw, &progress)?
    } else {
        pages::copy_pages(tracee, &vmas, &pw, &progress)?;
        Vec::new()
    };
    w.finish_pages(pw)?;
    for g in &ghosts {
        w.write_raw(&g.name, &g.data)?;
    }
    let nvmas = vmas.len();
    let nfds = files.fds.len();
    w.write_meta(&ckpt_image::files_name(pid), ImageKind::Files, &files)?;
    let mm = Mm {
        vmas,
        vdso,
        pages_bytes,
        compressed: opts.compress,
        chunks,
    };
    w.write_meta(&ckpt_image::mm_name(pid), ImageKind::Mm, &mm)?;
    let manifest = manifest(pid, &core)?;
    w.write_meta(&ckpt_image::core_name(pid), ImageKind::Core, &core)?;
    let dir = w.commit(manifest)?;

    if opts.final_state == FinalState::Kill {
        // The images are durable; only now may the original go.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        drop(tasks);
    } else {
        for t in tasks {
            t.detach()?;
        }
    }
    Ok(DumpReport {
        pid,
        dir,
        vmas: nvmas,
        pages_bytes,
        fds: nfds,
        frozen_ms: frozen_at.elapsed().as_millis() as u64,
    })
}

/// Refuses what this version cannot dump, before touching the process.
fn precheck(pid: i32) -> Result<()> {
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
    if let Some(state) = procfile::status_field(&status, "State")
        && (state.starts_with('Z') || state.starts_with('X'))
    {
        return Err(DumpError::NoProcess { pid });
    }
    if let Some(state) = procfile::status_field(&status, "State")
        && state.starts_with('T')
    {
        return Err(DumpError::Unsupported {
            pid,
            what: "job-control-stopped process (state T; send SIGCONT first)".into(),
        });
    }
    if procfile::status_field(&status, "Tgid") != Some(&pid.to_string()) {
        return Err(DumpError::Unsupported {
            pid,
            what: "dumping a single thread of a process (give the process id)".into(),
        });
    }
    // Children are listed per thread that created them.
    let task_dir = procfile::path(pid, "task");
    let tids: Vec<String> = std::fs::read_dir(&task_dir)
        .map_err(|e| procfile::proc_err(pid, task_dir.clone(), e))?
        .filter_map(|e| Some(e.ok()?.file_name().to_str()?.to_string()))
        .collect();
    for tid in tids {
        // A thread that exits meanwhile has no children to report.
        let children = procfile::read(pid, &format!("task/{tid}/children")).unwrap_or_default();
        if !children.trim().is_empty() {
            return Err(DumpError::Unsupported {
                pid,
                what: format!("process with children ({})", children.trim()),
            });
        }
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

fn manifest(pid: i32, core: &ckpt_image::core::Core) -> Result<Manifest> {
    let uts = nix::sys::utsname::uname().map_err(|e| DumpError::Proc {
        pid,
        path: "uname".into(),
        source: e.into(),
    })?;
    let ppid = procfile::stat_fields(pid)?
        .get(procfile::stat_index(4))
        .copied()
        .unwrap_or(0) as i32;
    Ok(Manifest {
        tool_version: env!("CARGO_PKG_VERSION").into(),
        kernel: format!(
            "{} {}",
            uts.release().to_string_lossy(),
            uts.version().to_string_lossy()
        ),
        arch: std::env::consts::ARCH.into(),
        cpu: Some(features::cpu_info(&core.xstate)),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        root_pid: pid,
        processes: vec![ProcessEntry {
            pid,
            ppid,
            comm: core.comm.clone(),
        }],
        files: Vec::new(),
        hostname: uts.nodename().to_string_lossy().into_owned(),
    })
}
