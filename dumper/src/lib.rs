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

pub mod error;
pub mod fault;
pub mod fd;
pub mod features;
pub mod mm;
pub mod pages;
mod procfile;
mod sys;
pub mod task;
mod thread;
mod tree;

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
    /// The dumped (root) pid.
    pub pid: i32,
    /// Number of processes in the tree.
    pub processes: usize,
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

/// Everything collected about one frozen process, ready to be written.
struct Collected {
    pid: i32,
    ppid: i32,
    core: ckpt_image::task::Core,
    vmas: Vec<ckpt_image::mm::Vma>,
    vdso: Option<ckpt_image::mm::VdsoInfo>,
    pages_bytes: u64,
    files: ckpt_image::files::Files,
    ghosts: Vec<fd::Ghost>,
}

fn collect_process(p: &tree::FrozenProcess) -> Result<Collected> {
    let pid = p.pid;
    let leader = &p.tasks[0];
    let misc = task::run_parasite(leader)?;
    let mut core = task::collect(leader, &misc)?;
    for t in &p.tasks[1..] {
        let tm = task::run_parasite(t)?;
        core.threads.push(task::collect_thread(t, pid, &tm)?);
    }
    let mut vmas = mm::collect_vmas(pid)?;
    let vdso = mm::vdso_info(leader, &vmas)?;
    let pages_bytes = mm::plan_pages(pid, &mut vmas)?;
    let mut ghosts = Vec::new();
    let files = fd::collect(pid, &mut ghosts)?;
    Ok(Collected {
        pid,
        ppid: p.ppid,
        core,
        vmas,
        vdso,
        pages_bytes,
        files,
        ghosts,
    })
}

/// Dumps a process and all its descendants (with all their threads) into
/// `opts.dir`.
pub fn dump(opts: &DumpOptions<'_>) -> Result<DumpReport> {
    let root = opts.pid;
    if root <= 0 {
        return Err(DumpError::NoProcess { pid: root });
    }
    let frozen_at = Instant::now();
    let tree = tree::freeze(root, precheck, seize_error)?;
    fault::inject(fault::FaultPoint::AfterSeize);

    let mut procs = tree
        .iter()
        .filter(|p| p.zombie_status.is_none())
        .map(collect_process)
        .collect::<Result<Vec<Collected>>>()?;
    let relaid = mm::link_shared_memory(
        &mut procs
            .iter_mut()
            .map(|c| (c.pid, &mut c.vmas))
            .collect::<Vec<_>>(),
    )?;
    for c in procs.iter_mut().filter(|c| relaid.contains(&c.pid)) {
        c.pages_bytes = mm::reassign_offsets(&mut c.vmas);
    }
    fd::share_across(
        &mut procs
            .iter_mut()
            .map(|c| (c.pid, &mut c.files))
            .collect::<Vec<_>>(),
    )?;
    let pipes = fd::pipe::collect(&procs.iter().map(|c| (c.pid, &c.files)).collect::<Vec<_>>())?;
    // Ghosts of fds now taken from another process are not needed.
    for c in procs.iter_mut() {
        let wanted: Vec<String> = c.files.fds.iter().map(|e| e.ghost.clone()).collect();
        c.ghosts.retain(|g| wanted.contains(&g.name));
    }

    // Everything is known to be supported: now write.
    let total: u64 = procs.iter().map(|c| c.pages_bytes).sum();
    let mut w = ImageWriter::create(&opts.dir)?;
    let mut written = 0u64;
    let mut report = DumpReport {
        pid: root,
        dir: opts.dir.clone(),
        processes: tree.len(),
        vmas: 0,
        pages_bytes: total,
        fds: 0,
        frozen_ms: 0,
    };
    let mut entries = Vec::new();
    let mut cores = Vec::new();
    let live = tree.iter().filter(|p| p.zombie_status.is_none());
    for (c, frozen) in procs.into_iter().zip(live) {
        let pw = w.pages(&ckpt_image::pages_name(c.pid))?;
        let base = written;
        let progress = |done: u64| {
            fault::inject(fault::FaultPoint::DuringPages);
            if let Some(p) = opts.progress {
                p(base + done, total)
            }
        };
        let chunks = if opts.compress {
            pages::copy_pages_compressed(&frozen.tasks[0], &c.vmas, &pw, &progress)?
        } else {
            pages::copy_pages(&frozen.tasks[0], &c.vmas, &pw, &progress)?;
            Vec::new()
        };
        w.finish_pages(pw)?;
        written += c.pages_bytes;
        for g in &c.ghosts {
            w.write_raw(&g.name, &g.data)?;
        }
        report.vmas += c.vmas.len();
        report.fds += c.files.fds.len();
        w.write_meta(&ckpt_image::files_name(c.pid), ImageKind::Files, &c.files)?;
        let mm = Mm {
            vmas: c.vmas,
            vdso: c.vdso,
            pages_bytes: c.pages_bytes,
            compressed: opts.compress,
            chunks,
        };
        w.write_meta(&ckpt_image::mm_name(c.pid), ImageKind::Mm, &mm)?;
        w.write_meta(&ckpt_image::core_name(c.pid), ImageKind::Core, &c.core)?;
        entries.push(ProcessEntry {
            pid: c.pid,
            ppid: c.ppid,
            comm: c.core.comm.clone(),
            zombie_status: None,
        });
        cores.push(c.core);
    }
    // Zombies come last: their parents are all listed by then.
    for z in tree.iter().filter(|p| p.zombie_status.is_some()) {
        entries.push(ProcessEntry {
            pid: z.pid,
            ppid: z.ppid,
            comm: procfile::read(z.pid, "comm")
                .map(|c| c.trim_end().to_string())
                .unwrap_or_default(),
            zombie_status: z.zombie_status,
        });
    }
    if !pipes.pipes.is_empty() {
        w.write_meta(ckpt_image::PIPES_NAME, ImageKind::Pipes, &pipes)?;
    }
    let manifest = manifest(root, entries, &cores[0])?;
    report.dir = w.commit(manifest)?;

    if opts.final_state == FinalState::Kill {
        // The images are durable; only now may the tree go.
        for p in &tree {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        drop(tree);
    } else {
        // Children first, so no parent runs while a child is still stopped.
        for p in tree.into_iter().rev() {
            for t in p.tasks {
                t.detach()?;
            }
        }
    }
    report.frozen_ms = frozen_at.elapsed().as_millis() as u64;
    Ok(report)
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
        return Err(DumpError::Unsupported {
            pid,
            what: "zombie process (its parent has not reaped it)".into(),
        });
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

fn manifest(
    root: i32,
    processes: Vec<ProcessEntry>,
    root_core: &ckpt_image::task::Core,
) -> Result<Manifest> {
    let pid = root;
    let uts = nix::sys::utsname::uname().map_err(|e| DumpError::Proc {
        pid,
        path: "uname".into(),
        source: e.into(),
    })?;
    Ok(Manifest {
        tool_version: env!("CARGO_PKG_VERSION").into(),
        kernel: format!(
            "{} {}",
            uts.release().to_string_lossy(),
            uts.version().to_string_lossy()
        ),
        arch: std::env::consts::ARCH.into(),
        cpu: Some(features::cpu_info(&root_core.xstate)),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        root_pid: root,
        processes,
        files: Vec::new(),
        hostname: uts.nodename().to_string_lossy().into_owned(),
    })
}
