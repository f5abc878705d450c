//! Phase 3, write: what the collect phase gathered goes into a temporary
//! image directory (metadata, shared memory, pages through the chosen
//! [`crate::strategy`]), then the figures, the log and the manifest, and
//! the directory is committed (synced and renamed into place). Of the
//! tree it reads only its pages and, while it is still frozen, whose each
//! process is, its zombies, and whether a process died meanwhile.

use std::time::Instant;

use ckpt_image::manifest::ProcessEntry;
use ckpt_image::mm::{Mm, PageChunk};
use ckpt_image::{Committed, ImageKind, ImageWriter};

use crate::collect::{self, Collected, CollectedTree, Userfaults};
use crate::error::{DumpError, Result};
use crate::ns::TreeNamespaces;
use crate::owner::{Owner, owner};
use crate::stats::{ms, ms_since};
use crate::strategy::{self, PagesJob};
use crate::translate::SavedPids;
use crate::{
    DumpReport, DumpStats, Frozen, LOG_NAME, PhaseTimes, STATS_NAME, WriteOptions, fd, ipc,
    manifest, pidns, procfile, shapes, shmem, tree,
};

/// What a dump's write produced, for [`crate::Written`].
pub(crate) struct Wrote {
    /// What was written.
    pub report: DumpReport,
    /// The committed checkpoint.
    pub committed: Committed,
    /// The SysV IPC objects saved that a kill removes.
    pub ipc: ckpt_image::ipc::Ipc,
}

/// Collect, then write: nothing is written before everything is known to
/// be supported.
pub(crate) fn images(frozen: &mut Frozen, opts: &WriteOptions<'_>) -> Result<Wrote> {
    let root = frozen.root;
    let CollectedTree {
        mut procs,
        threads,
        objects,
        namespaces,
        mut ipc,
        files,
        pids,
        fds,
        collect_ms,
    } = collect::tree(frozen, opts)?;
    let saved_pids = SavedPids(pids.as_ref());
    let saved = |host: i32| saved_pids.pid(host);
    let total: u64 = procs.iter().map(|c| c.pages_bytes).sum();
    let mut stats = DumpStats {
        phases: PhaseTimes {
            freeze_ms: frozen.freeze_ms,
            collect_ms,
            ..PhaseTimes::default()
        },
        processes: frozen.procs.len(),
        threads,
        fds,
        pages_planned_bytes: total,
        pages_untouched_bytes: procs.iter().map(|c| c.untouched_bytes).sum(),
        ..DumpStats::default()
    };
    let write_started = Instant::now();
    let mut w = ImageWriter::create(&opts.dir)?;
    log::info!("write: into {}", w.tmp_dir().display());
    write_shared(&mut w, root, files, objects, &namespaces, &mut ipc)?;
    // Read now, while the tree is frozen.
    let zombies = zombie_entries(frozen, &saved_pids)?;
    let owners = owners(&procs)?;
    let pages_started = Instant::now();
    let blocks = strategy::choose(opts).save(PagesJob {
        tree: frozen,
        w: &mut w,
        procs: &mut procs,
        opts,
        total,
        stats: &mut stats,
        saved: &saved,
    })?;
    let pages_time = pages_started.elapsed();
    let images = ProcessImages {
        compress: opts.compress,
        cores: true,
        saved: &saved_pids,
    };
    let Listed {
        mut entries,
        cores,
        vmas,
    } = images.write(&mut w, procs, blocks, owners)?;
    // Zombies come last: their parents are all listed by then.
    entries.extend(zombies);
    let mut manifest = manifest::build(root, entries, &cores[0])?;
    if pids.is_some() {
        manifest::in_pid_namespace(&mut manifest, root, saved(root));
    }
    manifest.namespaces = namespaces.saved.clone();
    stats.vmas = vmas;
    stats.disk_bytes = w.written_bytes();
    stats.phases.pages_ms = ms(pages_time);
    stats.phases.metadata_ms = ms(write_started.elapsed().saturating_sub(pages_time));
    stats.compression_ratio = (opts.compress && stats.pages_written_bytes > 0).then(|| {
        // Two decimals are all a ratio needs.
        (stats.pages_planned_bytes as f64 / stats.pages_written_bytes as f64 * 100.0).round()
            / 100.0
    });
    stats.frozen_ms = ms(frozen.frozen_for());
    log::info!(
        "metadata: {} bytes of images written ({:.3} ms)",
        stats.disk_bytes,
        stats.phases.metadata_ms
    );
    write_stats_and_log(&mut w, &stats, opts)?;
    ckpt_parasite::fault::inject(ckpt_parasite::fault::FaultPoint::BeforeCommit);
    refuse_killed(frozen)?;
    let commit_started = Instant::now();
    let committed = w.commit(manifest, opts.key)?;
    stats.phases.commit_ms = Some(ms_since(commit_started));
    log::info!(
        "commit: {} ({:.3} ms)",
        committed.path().display(),
        ms_since(commit_started)
    );
    let report = DumpReport {
        pid: root,
        dir: committed.path().into(),
        processes: frozen.procs.len(),
        vmas,
        pages_bytes: total,
        fds,
        frozen_ms: 0,
        stats,
    };
    // Objects of the tree's own IPC namespace go with its last process;
    // their ids name others in ckpt's, which a --kill must not remove.
    if namespaces.own_ipc() {
        ipc = ckpt_image::ipc::Ipc::default();
    }
    Ok(Wrote {
        report,
        committed,
        ipc,
    })
}

/// Writes what the processes share or point at: fd tables and open files
/// with their contents, shared memory objects and SysV IPC objects. Shared
/// memory goes before any private pages: a background dump reads it while
/// the tree is still frozen.
fn write_shared(
    w: &mut ImageWriter,
    root: i32,
    files: fd::TreeFiles,
    objects: shmem::Objects,
    namespaces: &TreeNamespaces,
    sysv: &mut ckpt_image::ipc::Ipc,
) -> Result<()> {
    for (pid, table) in &files.tables {
        w.write_meta(&ckpt_image::fds_name(*pid), ImageKind::FdTable, table)?;
    }
    w.write_meta(ckpt_image::FILES_NAME, ImageKind::Files, &files.files)?;
    let shmem_started = Instant::now();
    let shmem_bytes = objects.data_bytes();
    objects.write(w)?;
    log::info!(
        "write shared memory: {shmem_bytes} bytes ({:.3} ms)",
        ms_since(shmem_started)
    );
    for b in files.blobs.iter() {
        w.write_raw(&b.name, &b.data)?;
    }
    if !sysv.is_empty() {
        let ipc_started = Instant::now();
        let bytes = namespaces.in_ipc(root, || ipc::write(root, w, sysv))?;
        log::info!(
            "write ipc: {} segments ({bytes} bytes), {} semaphore sets, {} message queues ({:.3} ms)",
            sysv.shm.len(),
            sysv.sem.len(),
            sysv.msg.len(),
            ms_since(ipc_started)
        );
    }
    Ok(())
}

/// A process killed while frozen may still have been read in full, but
/// its job is broken: no checkpoint of it becomes the valid one.
fn refuse_killed(frozen: &Frozen) -> Result<()> {
    match frozen
        .procs
        .iter()
        .filter(|p| p.zombie_status.is_none())
        .find(|p| !tree::is_alive(p.pid))
    {
        Some(p) => Err(DumpError::Exited {
            pid: p.pid,
            detail: "killed while frozen, before the checkpoint was committed".into(),
        }),
        None => Ok(()),
    }
}

/// The manifest entries of the tree's zombies.
fn zombie_entries(frozen: &Frozen, saved: &SavedPids<'_>) -> Result<Vec<ProcessEntry>> {
    let mut zombies = Vec::new();
    for z in frozen.procs.iter().filter(|p| p.zombie_status.is_some()) {
        let owner = owner(z.pid)?;
        zombies.push(ProcessEntry {
            pid: saved.pid(z.pid),
            ppid: saved.ppid(z.ppid),
            comm: procfile::read(z.pid, "comm")
                .map(|c| c.trim_end().to_string())
                .unwrap_or_default(),
            zombie_status: z.zombie_status,
            uids: owner.uids,
            gids: owner.gids,
            zombie_ids: Some(shapes::zombie_ids(z.pid, |host| saved.pid(host))?),
        });
    }
    Ok(zombies)
}

/// Whose each process is, read while the tree is frozen.
fn owners(procs: &[Collected]) -> Result<Vec<Owner>> {
    procs.iter().map(|c| owner(c.pid)).collect()
}

/// The live processes whose images are written, for the manifest.
struct Listed {
    /// Their manifest entries, tree order.
    entries: Vec<ProcessEntry>,
    /// Their task state, tree order (the root's first).
    cores: Vec<ckpt_image::task::Core>,
    /// How many VMAs they have in all.
    vmas: usize,
}

/// How the images of each live process are written.
struct ProcessImages<'s, 'm> {
    /// Pages are stored as LZ4 blocks.
    compress: bool,
    /// The core images are written too (not by a pre-dump).
    cores: bool,
    /// The pids the images record.
    saved: &'s SavedPids<'m>,
}

impl ProcessImages<'_, '_> {
    /// Writes the mm (and core) image of every process.
    fn write(
        &self,
        w: &mut ImageWriter,
        procs: Vec<Collected>,
        blocks: Vec<Vec<PageChunk>>,
        owners: Vec<Owner>,
    ) -> Result<Listed> {
        let mut entries = Vec::new();
        let mut cores = Vec::new();
        let mut vmas = 0;
        for ((c, blocks), owner) in procs.into_iter().zip(blocks).zip(owners) {
            vmas += c.vmas.len();
            let pid = self.saved.pid(c.pid);
            let mm = Mm {
                vmas: c.vmas,
                vdso: c.vdso,
                pages_bytes: c.pages_bytes,
                compressed: self.compress,
                chunks: blocks,
                tracking: c.tracking,
                aio_rings: c.aio_rings,
            };
            w.write_meta(&ckpt_image::mm_name(pid), ImageKind::Mm, &mm)?;
            if self.cores {
                w.write_meta(&ckpt_image::core_name(pid), ImageKind::Core, &c.core)?;
            }
            entries.push(ProcessEntry {
                pid,
                ppid: self.saved.ppid(c.ppid),
                comm: c.core.comm.clone(),
                zombie_status: None,
                uids: owner.uids,
                gids: owner.gids,
                zombie_ids: None,
            });
            cores.push(c.core);
        }
        Ok(Listed {
            entries,
            cores,
            vmas,
        })
    }
}

/// The pre-dump: tracking armed and every process's pages planned while
/// frozen, then the pages saved with the tree running.
pub(crate) fn pre_dump(frozen: &mut Frozen, opts: &WriteOptions<'_>) -> Result<DumpReport> {
    if !matches!(frozen.ns, pidns::TreeNs::Ckpt) {
        return Err(DumpError::Unsupported {
            pid: frozen.root,
            what: "a pre-dump of a tree in its own PID namespace".into(),
        });
    }
    let collect_started = Instant::now();
    let mut procs = Vec::new();
    for p in frozen.procs.iter().filter(|p| p.zombie_status.is_none()) {
        // Refused above for a tree in its own PID namespace: pids are the host's.
        let saved = crate::translate::SavedPids(None);
        procs.push(collect::collect_process(
            p,
            Userfaults::Track(opts),
            &saved,
        )?);
    }
    let owners = owners(&procs)?;
    let total: u64 = procs.iter().map(|c| c.pages_bytes).sum();
    let mut stats = DumpStats {
        phases: PhaseTimes {
            freeze_ms: frozen.freeze_ms,
            collect_ms: ms_since(collect_started),
            ..PhaseTimes::default()
        },
        processes: procs.len(),
        pages_planned_bytes: total,
        ..DumpStats::default()
    };
    // Everything the pre-dump needs frozen is done: writes are tracked.
    frozen.thaw_early()?;
    log::info!(
        "pre-dump: tracking armed, tree running again after {:.3} ms frozen",
        ms(frozen.frozen_for())
    );
    let mut w = ImageWriter::create(&opts.dir)?;
    let pages_started = Instant::now();
    let same = |pid: i32| pid;
    let blocks = strategy::read_all(opts).save(PagesJob {
        tree: frozen,
        w: &mut w,
        procs: &mut procs,
        opts,
        total,
        stats: &mut stats,
        saved: &same,
    })?;
    stats.phases.pages_ms = ms_since(pages_started);
    let images = ProcessImages {
        compress: opts.compress,
        cores: false,
        saved: &SavedPids(None),
    };
    let Listed {
        entries,
        cores,
        vmas,
    } = images.write(&mut w, procs, blocks, owners)?;
    let mut manifest = manifest::build(frozen.root, entries, &cores[0])?;
    manifest.pre_dump = true;
    stats.vmas = vmas;
    stats.disk_bytes = w.written_bytes();
    stats.frozen_ms = ms(frozen.frozen_for());
    write_stats_and_log(&mut w, &stats, opts)?;
    let committed = w.commit(manifest, opts.key)?;
    log::info!("pre-dump: committed {}", committed.path().display());
    Ok(DumpReport {
        pid: frozen.root,
        processes: stats.processes,
        dir: committed.path().into(),
        vmas,
        pages_bytes: total,
        fds: 0,
        frozen_ms: 0,
        stats,
    })
}

/// Writes `stats-dump.json` and the log so far, the last files before the
/// manifest.
fn write_stats_and_log(
    w: &mut ImageWriter,
    stats: &DumpStats,
    opts: &WriteOptions<'_>,
) -> Result<()> {
    let json = serde_json::to_vec_pretty(stats).map_err(|e| {
        DumpError::Image(ckpt_image::ImageError::io(
            w.tmp_dir().join(STATS_NAME),
            "encode",
            e.into(),
        ))
    })?;
    w.write_raw(STATS_NAME, &json)?;
    if let Some(log) = opts.log {
        log::info!("commit: writing {LOG_NAME}, the manifest and its seal");
        w.write_raw(LOG_NAME, &log())?;
    }
    Ok(())
}
