//! Rebuilding one process, in two parts: its address space before it
//! forks its children (so the private pages they still shared at the dump
//! are shared again), everything else once the whole tree exists.

use std::sync::Arc;

use ckpt_parasite::remote::Remote;

use crate::context::RestoreContext;
use crate::error::Result;
use crate::options::RestoreOptions;
use crate::read::ProcessImages;
use crate::{
    aio, creds, fd, held, inherit, lazy, loginuid, membarrier, mm, pages, prctl, sched, seccomp,
    stopped, task, thread, timer,
};

/// A lazily served process's share of the page server: the server, and
/// the block checksums its pages are checked with as they are served.
pub(super) struct Served<'s> {
    /// The page server of the tree.
    pub server: &'s mut lazy::PageServer,
    /// The pages file's block checksums (`None`: older images, the file
    /// is verified whole beside the rebuild).
    pub checks: Option<ckpt_image::BlockChecks>,
}

/// The address space of one process: everything before it forks its
/// children. The copy of its pages (read through `buffers` where read
/// directly) is returned to be run, unless they are served lazily (copied
/// or handed to the server here).
pub(super) fn rebuild_memory<'f, 'a: 'f>(
    r: &Remote<'_>,
    p: &ProcessImages,
    pages: &'f Arc<memmap2::Mmap>,
    buffers: &'f pages::ReadBuffers,
    served: Option<Served<'_>>,
    cx: &mut RestoreContext<'a>,
) -> Result<Option<pages::PageFill<'f>>> {
    let pid = r.t.pid();
    let core = &p.core;
    let child_maps = mm::read_maps(pid)?;
    unregister_rseq(r)?;
    place_specials(r, p, &child_maps)?;
    for v in &p.mm.vmas {
        log::debug!(
            "pid {pid}: VMA {:#x}-{:#x} prot {:#x} {}{}",
            v.start,
            v.end,
            v.prot,
            if v.path.is_empty() { "-" } else { &v.path },
            if v.inherited { " (inherited)" } else { "" }
        );
    }
    mm::map_vmas(
        r,
        &p.mm,
        &mut cx.checks,
        cx.images,
        &mut cx.shmem,
        core.creds.as_ref(),
    )?;
    ckpt_parasite::fault::inject(ckpt_parasite::fault::FaultPoint::MidRebuild);
    inherit::drop_pages(r, &p.mm)?;
    let fill = match served {
        None => {
            let name = ckpt_image::pages_name(p.pid);
            let images = cx.images;
            Some(pages::prepare_fill(
                r,
                &p.mm,
                images,
                name,
                pages,
                buffers,
                cx.options.progress,
            )?)
        }
        Some(served) => {
            fill_some_pages(r, p, pages, served, cx)?;
            None
        }
    };
    // Nothing below reads or writes the pages still to be copied.
    let mm_fields = core.mm.as_ref().expect("validated");
    let exe = mm::Exe {
        path: &core.exe,
        mm: &p.mm,
        creds: core.creds.as_ref(),
    };
    mm::set_mm_fields(r, mm_fields, &exe, &mut cx.checks)?;
    Ok(fill)
}

/// The child inherited the restorer's rseq registration, which points
/// into memory about to be replaced: unregistered.
fn unregister_rseq(r: &Remote<'_>) -> Result<()> {
    let rs = r.t.rseq()?;
    if rs.rseq_abi_pointer != 0 {
        r.call(
            "rseq (unregister)",
            libc::SYS_rseq,
            [
                rs.rseq_abi_pointer,
                rs.rseq_abi_size as u64,
                1,
                rs.signature as u64,
                0,
                0,
            ],
        )?;
    }
    Ok(())
}

/// Clears the inherited mappings and puts the vDSO and vvar where the
/// process had them (or a proxy of the dumped vDSO there: `vdso.rs`).
fn place_specials(r: &Remote<'_>, p: &ProcessImages, child_maps: &[mm::MapLine]) -> Result<()> {
    let vdso = match &p.mm.vdso {
        Some(v) => mm::vdso_plan(r.t.pid(), r, child_maps, v)?,
        None => mm::VdsoPlan::Same,
    };
    match vdso {
        mm::VdsoPlan::Same => mm::clear_and_move_specials(r, child_maps, &p.mm)?,
        mm::VdsoPlan::Proxy { here } => {
            let here_base = mm::clear_and_park_specials(r, child_maps, &p.mm)?;
            mm::map_vdso_proxy(r, &p.mm, &p.core, &here, here_base)?;
        }
    }
    Ok(())
}

/// A lazily served process's pages: what must be there before it runs
/// is copied now, the rest is left to the page server.
fn fill_some_pages(
    r: &Remote<'_>,
    p: &ProcessImages,
    pages: &Arc<memmap2::Mmap>,
    served: Served<'_>,
    cx: &RestoreContext<'_>,
) -> Result<()> {
    let pid = p.pid;
    let mut split = pages::layout::split(&p.mm, pages::plan(pid, &p.mm, pages.len() as u64)?);
    log::debug!(
        "pid {pid}: {} pieces copied now, {} served on demand in {} VMAs",
        split.eager.len(),
        split.lazy.len(),
        split.ranges.len()
    );
    let eager = std::mem::take(&mut split.eager);
    // What is copied now is checked now, block by block.
    let blocks = served.checks.map(lazy::Blocks::new);
    if let Some(b) = &blocks {
        for c in &eager {
            b.check(pages, c.file_offset, c.file_len)?;
        }
    }
    pages::copy_listed(r, eager, pages, p.mm.pages_bytes, cx.options.progress)?;
    // Nothing to serve: no userfaultfd either.
    if !split.lazy.is_empty() {
        let name = ckpt_image::pages_name(pid);
        let path = cx.images.path().join(&name).display().to_string();
        served
            .server
            .add(lazy::prepare(r, path, Arc::clone(pages), split, blocks)?);
    }
    Ok(())
}

/// Everything after the address space: files, signals, threads,
/// credentials, and the registers last. Returns the other threads, stopped
/// like the leader until the tree resumes.
pub(super) fn rebuild_process(
    r: &Remote<'_>,
    p: &ProcessImages,
    cx: &mut RestoreContext<'_>,
    fds: &mut fd::Tables,
    opts: &RestoreOptions<'_>,
) -> Result<held::NewThreads> {
    let pid = r.t.pid();
    let core = &p.core;
    // After the children are forked: a limit the parent had (RLIMIT_AS,
    // RLIMIT_NPROC) must not stop them from being rebuilt.
    task::restore_rlimits(pid, core, opts.notice)?;
    for f in &p.fds.fds {
        let kind = cx.files.get(f.file_id).map_or("missing", |x| x.kind_name());
        log::debug!("pid {pid}: fd {}: {kind} (open file {})", f.fd, f.file_id);
    }
    // Before the files: the /dev/null it opens for a while takes no fd
    // number a file needs.
    aio::restore(r, &p.mm)?;
    // A table shared with the parent was restored with the parent's
    // (created sharing it, rebuilt before): installing its copy again
    // would only redo it.
    if core.shared_with_parent.is_some_and(|s| s.files) {
        log::debug!("pid {pid}: fds are its parent's table, restored with it");
    } else {
        fd::restore(cx, fds, r, &p.fds, core.creds.as_ref(), core.ctty.as_ref())?;
    }
    task::restore_misc(r, core)?;
    task::restore_sigactions(r, core)?;
    task::queue_pending(r, pid, &core.pending)?;
    let threads = restore_threads_and_creds(r, p, opts)?;
    seal_registers(r, p)?;
    Ok(threads)
}

/// Threads, timers, scheduling, seccomp and credentials, each where the
/// others need it.
fn restore_threads_and_creds(
    r: &Remote<'_>,
    p: &ProcessImages,
    opts: &RestoreOptions<'_>,
) -> Result<held::NewThreads> {
    let pid = r.t.pid();
    let core = &p.core;
    // Before the threads, which inherit it, and any seccomp filter.
    loginuid::restore(r, core, opts.notice)?;
    membarrier::restore(r, core)?;
    // Threads are created while the leader still has the privileges clone3
    // with set_tid needs; credentials are per thread in the kernel.
    let shared_filters = seccomp::install_shared(r, core)?;
    let threads = thread::spawn(r, core, opts.notice)?;
    for th in threads.iter() {
        log::debug!("pid {pid}: thread {}", th.pid());
    }
    if !threads.is_empty() {
        ckpt_parasite::fault::inject(ckpt_parasite::fault::FaultPoint::RestoreThreadsCreated);
    }
    // After the threads: a timer may signal one of them.
    timer::create(r, &core.posix_timers)?;
    sched::restore(r, core, opts.notice)?;
    prctl::restore_before_creds(r, core)?;
    seccomp::install_own(r, &threads, core, shared_filters)?;
    creds::restore(r, pid, core.creds.as_ref())?;
    for (th, tc) in threads.iter().zip(&core.threads) {
        let own = tc.creds.as_ref().or(core.creds.as_ref());
        creds::restore(
            &Remote {
                t: th,
                base: r.base,
            },
            pid,
            own,
        )?;
    }
    timer::arm(r, &core.posix_timers)?;
    prctl::restore_after_creds(r, &threads, core)?;
    thread::finish(r, &threads, core)?;
    Ok(threads)
}

/// The very end of a process's rebuild: the scratch area goes, then the
/// process's own registers, signal mask and job-control stop.
fn seal_registers(r: &Remote<'_>, p: &ProcessImages) -> Result<()> {
    let t = r.t;
    let pid = t.pid();
    let core = &p.core;
    // Last syscall: unmap the scratch area, stopping at its exit because
    // the instruction after it is gone; then the process's own registers.
    let regs = ckpt_parasite::restart_regs(
        &task::regs_from_image(core.regs.as_ref().expect("validated")),
        false,
    );
    // Its pending SIGTRAPs go in only now, with no breakpoint left to run.
    task::queue_traps(r, pid, &core.pending)?;
    let ret = t.syscall_stop_at_exit(
        r.base,
        libc::SYS_munmap,
        [r.base, ckpt_parasite::remote::SCRATCH_LEN, 0, 0, 0, 0],
    )?;
    ckpt_parasite::check_ret(pid, "munmap (scratch)", ret)?;
    // Only now: a signal that became pending meanwhile (a timer firing)
    // must not stop the munmap; it is delivered once the process runs.
    t.set_sigmask(core.sigmask)?;
    t.set_regs(&regs)?;
    t.set_xstate(&core.xstate)?;
    stopped::stop(pid, core.pid, core.job_stop.as_ref())?;
    Ok(())
}
