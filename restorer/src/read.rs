//! Read, the first phase of a restore: the manifest's seal is checked with the
//! site's key and the whole image against the manifest's checksums, every
//! process's credentials against the owner the manifest recorded, and
//! every image against the others (fds against files, mappings against
//! shared memory and SysV objects, inherited pages against the parent),
//! before anything is created. Page data is verified as it is copied into
//! place (`pages`), or beside the rebuild for lazily served pages.

use std::sync::Arc;
use std::time::Instant;

use ckpt_image::fd::{FdTable, Files};
use ckpt_image::ipc::Ipc;
use ckpt_image::manifest::ProcessEntry;
use ckpt_image::mm::{Mm, VmaKind};
use ckpt_image::task::Core;
use ckpt_image::{ImageDir, ImageError, ImageKind};

use crate::error::{RestoreError, Result};
use crate::options::RestoreOptions;
use crate::outcome::{RestoreStats, ms_since};
use crate::{caller, creds, fd, inherit, ipc, lazy, mm, pages, shmem, sys};

/// Everything read and checked from the checkpoint, as the rebuild uses it.
pub(crate) struct Checkpoint {
    /// The checkpoint's images.
    pub images: ImageDir,
    /// Every open file of the tree.
    pub files: Files,
    /// The live processes, tree order (parents first).
    pub procs: Vec<ProcessImages>,
    /// The zombies of the tree.
    pub zombies: Vec<Zombie>,
    /// The SysV IPC objects.
    pub sysv: Ipc,
    /// Per process: its pages file, mapped.
    pub pages: Vec<Arc<memmap2::Mmap>>,
    /// Per process: its private anonymous memory is served on demand.
    pub lazy: Vec<bool>,
}

/// What the read phase hands to the rebuild.
pub(crate) struct Read {
    /// The checkpoint, read and checked.
    pub checkpoint: Checkpoint,
    /// The shared memory objects (none created yet).
    pub shmem: shmem::Objects,
    /// The figures so far (the read phase's time, the tree's size).
    pub stats: RestoreStats,
    /// When the restore began.
    pub started: Instant,
}

/// A zombie of the tree: only its manifest entry exists.
pub(crate) struct Zombie {
    pub pid: i32,
    pub ppid: i32,
    /// Its wait status.
    pub status: i32,
    pub comm: String,
    /// Its session and group, when recorded.
    pub ids: Option<ckpt_image::manifest::ZombieIds>,
}

/// Everything read from the images for one process.
pub(crate) struct ProcessImages {
    pub pid: i32,
    pub ppid: i32,
    pub core: Core,
    pub mm: Mm,
    pub fds: FdTable,
}

/// Reads and verifies the whole checkpoint at `opts.dir`: nothing is
/// created before every check passed.
pub(crate) fn read(opts: &RestoreOptions<'_>) -> Result<Read> {
    let started = Instant::now();
    log::info!("read: {}", opts.dir.display());
    // Page data is verified as it is copied into place (`pages`), before
    // anything runs; everything else now.
    let images = ImageDir::open_deferring_pages(&opts.dir, opts.key)?;
    check_compatible(&images)?;
    images.check_tree()?;
    caller::check_manifest(&images)?;
    let files: Files = images.read_meta(ckpt_image::FILES_NAME, ImageKind::Files)?;
    check_files(&images, &files)?;
    let procs = images
        .manifest()
        .processes
        .iter()
        .filter(|e| e.zombie_status.is_none())
        .map(|e| load(&images, &files, e))
        .collect::<Result<Vec<_>>>()?;
    let shmem = shmem::load(&images)?;
    check_shmem_users(&images, &files, &procs, &shmem)?;
    for p in &procs {
        let parent = procs.iter().find(|q| q.pid == p.ppid).map(|q| &q.mm);
        inherit::check(p.pid, &p.mm, parent)?;
    }
    let zombies = zombies(&images);
    let sysv = load_sysv(&images, &procs)?;
    let pages = map_pages(&images, &procs)?;
    let lazy = plan_lazy(&images, &procs, &pages, opts);
    let checkpoint = Checkpoint {
        images,
        files,
        procs,
        zombies,
        sysv,
        pages,
        lazy,
    };
    let stats = count(&checkpoint, started);
    Ok(Read {
        checkpoint,
        shmem,
        stats,
        started,
    })
}

/// Every VMA mapping a shared memory object and every memfd names one of
/// the checkpoint's.
fn check_shmem_users(
    images: &ImageDir,
    files: &Files,
    procs: &[ProcessImages],
    objects: &shmem::Objects,
) -> Result<()> {
    for p in procs {
        for v in
            p.mm.vmas
                .iter()
                .filter(|v| VmaKind::try_from(v.kind).is_ok_and(VmaKind::maps_shmem))
        {
            objects.check_vma(images, p.pid, v)?;
        }
    }
    for f in &files.files {
        if let Some(ckpt_image::fd::file::Kind::Memfd(m)) = &f.kind
            && !objects.has(m.shmem_id)
        {
            return Err(RestoreError::Image(ImageError::Invalid {
                path: images.path().join(ckpt_image::FILES_NAME),
                what: format!(
                    "memfd file {}: no shared memory object {}",
                    f.id, m.shmem_id
                ),
            }));
        }
    }
    Ok(())
}

/// The zombies of the manifest.
fn zombies(images: &ImageDir) -> Vec<Zombie> {
    images
        .manifest()
        .processes
        .iter()
        .filter_map(|e| {
            Some(Zombie {
                pid: e.pid,
                ppid: e.ppid,
                status: e.zombie_status?,
                comm: e.comm.clone(),
                ids: e.zombie_ids,
            })
        })
        .collect()
}

/// Reads and checks the SysV IPC objects: owned by the dumped processes'
/// ids, attached whole.
fn load_sysv(images: &ImageDir, procs: &[ProcessImages]) -> Result<Ipc> {
    let m = images.manifest();
    let owners = ipc::Owners {
        uids: m
            .processes
            .iter()
            .flat_map(|e| e.uids.iter().copied())
            .collect(),
        gids: m
            .processes
            .iter()
            .flat_map(|e| e.gids.iter().copied())
            .chain(
                procs
                    .iter()
                    .flat_map(|p| p.core.creds.iter().flat_map(|c| c.groups.iter().copied())),
            )
            .collect(),
    };
    ipc::load(
        images,
        &owners,
        &procs
            .iter()
            .map(|p| (p.pid, &p.mm.vmas[..]))
            .collect::<Vec<_>>(),
    )
}

/// Maps every process's pages file.
fn map_pages(images: &ImageDir, procs: &[ProcessImages]) -> Result<Vec<Arc<memmap2::Mmap>>> {
    procs
        .iter()
        .map(|p| {
            let name = ckpt_image::pages_name(p.pid);
            let f = images.open_pages(&name)?;
            sys::map_readonly(&f).map(Arc::new).map_err(|e| {
                RestoreError::from(ImageError::io(images.path().join(&name), "mmap", e))
            })
        })
        .collect()
}

/// Which processes are served lazily, and the page cache warmed for what
/// of theirs is copied now.
fn plan_lazy(
    images: &ImageDir,
    procs: &[ProcessImages],
    pages: &[Arc<memmap2::Mmap>],
    opts: &RestoreOptions<'_>,
) -> Vec<bool> {
    let m = images.manifest();
    // A process whose memory its children inherit at fork must be whole
    // before they are forked: only the others are served lazily.
    let lazy: Vec<bool> = procs
        .iter()
        .map(|p| opts.lazy && !m.processes.iter().any(|e| e.ppid == p.pid))
        .collect();
    for ((p, map), _) in procs.iter().zip(pages).zip(&lazy).filter(|(_, l)| **l) {
        lazy::read_ahead_eager(p.pid, &p.mm, map);
    }
    lazy
}

/// The figures of the tree read, and the read phase's time.
fn count(ck: &Checkpoint, started: Instant) -> RestoreStats {
    let procs = &ck.procs;
    let m = ck.images.manifest();
    let mut stats = RestoreStats {
        processes: m.processes.len(),
        threads: procs.iter().map(|p| 1 + p.core.threads.len()).sum(),
        vmas: procs.iter().map(|p| p.mm.vmas.len()).sum(),
        fds: procs.iter().map(|p| p.fds.fds.len()).sum(),
        pages_bytes: procs.iter().map(|p| p.mm.pages_bytes).sum(),
        ..RestoreStats::default()
    };
    stats.phases.read_ms = ms_since(started);
    log::info!(
        "read: {} files verified, {} processes ({:.3} ms)",
        m.files.len(),
        stats.processes,
        stats.phases.read_ms
    );
    stats
}

/// Reads and checks the images of the live process `entry`.
fn load(images: &ImageDir, files: &Files, entry: &ProcessEntry) -> Result<ProcessImages> {
    let pid = entry.pid;
    let p = ProcessImages {
        pid,
        ppid: entry.ppid,
        core: images.read_meta(&ckpt_image::core_name(pid), ImageKind::Core)?,
        mm: images.read_meta(&ckpt_image::mm_name(pid), ImageKind::Mm)?,
        fds: images.read_meta(&ckpt_image::fds_name(pid), ImageKind::FdTable)?,
    };
    validate(images, pid, &p)?;
    check_owner(images, entry, &p.core)?;
    creds::check_threads(&p.core)?;
    caller::check_core(&p.core)?;
    fd::validate(images, pid, &p.fds, files)?;
    Ok(p)
}

/// File ids must be unique and sorted (lookups are binary searches).
fn check_files(images: &ImageDir, files: &Files) -> Result<()> {
    if files.files.windows(2).any(|w| w[0].id >= w[1].id) {
        return Err(RestoreError::Image(ImageError::Invalid {
            path: images.path().join(ckpt_image::FILES_NAME),
            what: "file ids are not unique and sorted".into(),
        }));
    }
    Ok(())
}

fn check_compatible(images: &ImageDir) -> Result<()> {
    let m = images.manifest();
    let incompatible = |what: String| RestoreError::Incompatible {
        dir: images.path().into(),
        what,
    };
    if m.pre_dump {
        return Err(incompatible(
            "a pre-dump (memory only, taken while the tree ran): restore the dump made with --prev after it".into(),
        ));
    }
    if m.arch != std::env::consts::ARCH {
        return Err(incompatible(format!(
            "dumped on {}, this is {}",
            m.arch,
            std::env::consts::ARCH
        )));
    }
    if let Some(cpu) = &m.cpu {
        let here = ckpt_parasite::xcr0();
        if cpu.xcr0 & !here != 0 {
            return Err(incompatible(format!(
                "the dumping CPU had register state this CPU lacks (XCR0 {:#x}, here {:#x})",
                cpu.xcr0, here
            )));
        }
        if cpu.xsave_size as usize != ckpt_parasite::xsave_size() {
            return Err(incompatible(format!(
                "XSAVE area is {} bytes here, {} in the image",
                ckpt_parasite::xsave_size(),
                cpu.xsave_size
            )));
        }
    }
    Ok(())
}

fn validate(images: &ImageDir, pid: i32, p: &ProcessImages) -> Result<()> {
    let invalid = |name: String, what: &str| {
        RestoreError::Image(ImageError::Invalid {
            path: images.path().join(name),
            what: what.into(),
        })
    };
    let core_name = ckpt_image::core_name(pid);
    if p.core.pid != pid {
        return Err(invalid(core_name, "pid does not match the manifest"));
    }
    if p.core.regs.is_none() || p.core.mm.is_none() {
        return Err(invalid(core_name, "registers or mm fields missing"));
    }
    if p.core.xstate.len() < 576 {
        return Err(invalid(core_name, "XSAVE area too short"));
    }
    ckpt_image::seccomp::validate(&p.core)?;
    mm::validate_vdso(&p.mm).map_err(|what| invalid(ckpt_image::mm_name(pid), what.as_str()))?;
    mm::validate_guards(&p.mm).map_err(|what| invalid(ckpt_image::mm_name(pid), what.as_str()))?;
    crate::aio::validate(&p.mm).map_err(|what| invalid(ckpt_image::mm_name(pid), what.as_str()))?;
    let pages_len = images.digest(&ckpt_image::pages_name(pid))?.size;
    pages::plan(pid, &p.mm, pages_len)?;
    Ok(())
}

/// The core image may only ask for the ids the process had: its uids and
/// gids must be the ones the dumper read from /proc/PID/status into the
/// sealed manifest. (The core is sealed too, through its SHA-256 in the
/// manifest; this keeps a process's owner out of any single image's hands.)
fn check_owner(images: &ImageDir, entry: &ProcessEntry, core: &Core) -> Result<()> {
    let pid = entry.pid;
    let invalid = |path: std::path::PathBuf, what: String| {
        RestoreError::Image(ImageError::Invalid { path, what })
    };
    if entry.uids.len() != 4 || entry.gids.len() != 4 {
        return Err(invalid(
            images.path().join(ckpt_image::MANIFEST_NAME),
            format!("pid {pid} has no recorded owner (real, effective, saved and fs ids)"),
        ));
    }
    let core_path = images.path().join(ckpt_image::core_name(pid));
    let Some(creds) = &core.creds else {
        return Err(invalid(core_path, "no credentials".into()));
    };
    if creds.uids != entry.uids || creds.gids != entry.gids {
        return Err(invalid(
            core_path,
            format!(
                "credentials (uids {:?}, gids {:?}) are not those pid {pid} had when dumped (uids {:?}, gids {:?})",
                creds.uids, creds.gids, entry.uids, entry.gids
            ),
        ));
    }
    Ok(())
}
