//! The address space: VMAs from `/proc/PID/smaps`, which pages must be
//! saved from `/proc/PID/pagemap`, and the mm fields from `/proc/PID/stat`.

use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};

use ckpt_image::PAGE_SIZE;
use ckpt_image::mm::{FileId, PageRange, PageSpan, VdsoInfo, Vma, VmaKind, prot, vma_flags};
use ckpt_image::task::MmFields;
use ckpt_parasite::Tracee;

use crate::error::{DumpError, Result};
use crate::procfile::{self, stat_index};
use crate::sys::{self, page_is};

/// pagemap: page present in RAM.
const PM_PRESENT: u64 = 1 << 63;
/// pagemap: page swapped out.
const PM_SWAPPED: u64 = 1 << 62;
/// pagemap: page is a file page or shared anonymous (not a private anon page).
const PM_FILE: u64 = 1 << 61;
/// pagemap: page is a guard page (`MADV_GUARD_INSTALL`).
const PM_GUARD: u64 = 1 << 58;

/// How `/proc/PID/maps` names a memfd's mapping (`/memfd:NAME (deleted)`).
pub const MEMFD_PREFIX: &str = "/memfd:";
/// How it marks a mapping of a file unlinked since.
pub const DELETED_SUFFIX: &str = " (deleted)";
/// The ring of an aio context (io_setup(2)), which only the kernel creates.
pub const AIO_RING: &str = "/[aio] (deleted)";

/// Mappings that are not VMAs of the image: rings of aio contexts
/// (`aio.rs` saves them) and verbs device pages (`ib.rs`).
fn kept_apart(path: &str) -> bool {
    path == AIO_RING || crate::ib::is_device_mapping(path)
}

/// Where the aio rings of `pid` are, from `/proc/PID/maps`.
pub fn aio_ring_spans(pid: i32) -> Result<Vec<crate::aio::RingSpan>> {
    let text = procfile::read(pid, "maps")?;
    Ok(parse_smaps(pid, &text)?
        .into_iter()
        .filter(|e| e.path == AIO_RING)
        .map(|e| crate::aio::RingSpan {
            start: e.start,
            end: e.end,
        })
        .collect())
}

/// One line of smaps with the details the dumper needs.
#[derive(Debug, Clone)]
struct SmapsEntry {
    start: u64,
    end: u64,
    perms: [u8; 4],
    offset: u64,
    inode: u64,
    path: String,
    vm_flags: Vec<String>,
}

fn parse_smaps(pid: i32, text: &str) -> Result<Vec<SmapsEntry>> {
    let bad = |what: String| DumpError::Parse {
        pid,
        path: "smaps".into(),
        what,
    };
    let mut out: Vec<SmapsEntry> = Vec::new();
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-')
            && let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
        {
            // "start-end perms offset dev inode     path": the path is
            // everything after the fifth field, spaces included.
            let mut rest = line;
            let mut fields = Vec::with_capacity(5);
            for _ in 0..5 {
                rest = rest.trim_start();
                let end_of = rest.find(' ').unwrap_or(rest.len());
                fields.push(&rest[..end_of]);
                rest = &rest[end_of..];
            }
            let perms: [u8; 4] = fields[1]
                .as_bytes()
                .try_into()
                .map_err(|_| bad(format!("bad perms in {line:?}")))?;
            out.push(SmapsEntry {
                start,
                end,
                perms,
                offset: u64::from_str_radix(fields[2], 16)
                    .map_err(|_| bad(format!("bad offset in {line:?}")))?,
                inode: fields[4]
                    .parse()
                    .map_err(|_| bad(format!("bad inode in {line:?}")))?,
                path: rest.trim_start().to_string(),
                vm_flags: Vec::new(),
            });
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            let cur = out
                .last_mut()
                .ok_or_else(|| bad("VmFlags before any mapping".into()))?;
            cur.vm_flags = flags.split_whitespace().map(String::from).collect();
        }
    }
    Ok(out)
}

/// Reads the VMAs of a frozen process and classifies them. `skip` is an
/// address range to leave out (none once the parasite is cured).
pub fn collect_vmas(pid: i32) -> Result<Vec<Vma>> {
    let text = procfile::read(pid, "smaps")?;
    let entries = parse_smaps(pid, &text)?;
    entries
        .iter()
        .filter(|e| !kept_apart(&e.path))
        .map(|e| {
            let mut v = classify(pid, e)?;
            apply_vm_flags(pid, &mut v, &e.vm_flags)?;
            Ok(v)
        })
        .collect()
}

/// The VMAs of a frozen process from `/proc/PID/maps`, classified but
/// without what only smaps' `VmFlags` tell (see [`read_vm_flags`] and
/// [`apply_all_vm_flags`]). smaps walks every page table entry to count
/// memory the dump has no use for (tens of milliseconds for 4 GiB); maps
/// does not, so the pages can be planned while smaps is read on another
/// core.
pub fn collect_vmas_unflagged(pid: i32) -> Result<Vec<Vma>> {
    let text = procfile::read(pid, "maps")?;
    let entries = parse_smaps(pid, &text)?;
    entries
        .iter()
        .filter(|e| !kept_apart(&e.path))
        .map(|e| classify(pid, e))
        .collect()
}

/// One mapping's `VmFlags` from smaps.
pub struct VmFlagsOf {
    start: u64,
    end: u64,
    flags: Vec<String>,
}

/// Every mapping's `VmFlags`, from smaps.
pub fn read_vm_flags(pid: i32) -> Result<Vec<VmFlagsOf>> {
    let text = procfile::read(pid, "smaps")?;
    Ok(parse_smaps(pid, &text)?
        .into_iter()
        .filter(|e| !kept_apart(&e.path))
        .map(|e| VmFlagsOf {
            start: e.start,
            end: e.end,
            flags: e.vm_flags,
        })
        .collect())
}

/// Completes VMAs from [`collect_vmas_unflagged`] with `flags`, which
/// must name the same mappings: the tree is frozen, so they can differ
/// only if something outside it shares the address space.
pub fn apply_all_vm_flags(pid: i32, vmas: &mut [Vma], flags: &[VmFlagsOf]) -> Result<()> {
    if vmas.len() != flags.len() {
        return Err(DumpError::Unsupported {
            pid,
            what: format!(
                "memory map changed while frozen ({} mappings, then {}): is the address \
                 space shared with a process outside the tree?",
                vmas.len(),
                flags.len()
            ),
        });
    }
    for (v, f) in vmas.iter_mut().zip(flags) {
        if (v.start, v.end) != (f.start, f.end) {
            return Err(DumpError::Unsupported {
                pid,
                what: format!(
                    "memory map changed while frozen (mapping {:#x}-{:#x}, then {:#x}-{:#x})",
                    v.start, v.end, f.start, f.end
                ),
            });
        }
        apply_vm_flags(pid, v, &f.flags)?;
    }
    Ok(())
}

/// What a mapping's `VmFlags` add to its classification: flags restore
/// needs, and kinds refused only because of them (huge pages, device
/// memory).
fn apply_vm_flags(pid: i32, v: &mut Vma, vm_flags: &[String]) -> Result<()> {
    let has = |f: &str| vm_flags.iter().any(|x| x == f);
    let unsupported = |what: String| DumpError::Unsupported {
        pid,
        what: format!("mapping {:#x}-{:#x} ({what})", v.start, v.end),
    };
    let kind = VmaKind::try_from(v.kind).unwrap_or(VmaKind::Anon);
    if has("ht") {
        match kind {
            VmaKind::SysvShm => {
                return Err(unsupported("SysV shared memory with huge pages".into()));
            }
            VmaKind::Shmem | VmaKind::ShmemPrivate if !v.path.is_empty() => {
                return Err(unsupported(format!("hugetlb memory {}", v.path)));
            }
            _ => {}
        }
    }
    if !kind.is_special() && (has("io") || has("pf")) {
        return Err(unsupported(format!("device memory {}", v.path)));
    }
    if has("gd") {
        v.flags |= vma_flags::GROWSDOWN;
    }
    if has("dc") {
        v.flags |= vma_flags::DONTFORK;
    }
    if has("dd") {
        v.flags |= vma_flags::DONTDUMP;
    }
    if has("wf") {
        v.flags |= vma_flags::WIPEONFORK;
    }
    if has("hg") {
        v.flags |= vma_flags::HUGEPAGE;
    }
    if has("nh") {
        v.flags |= vma_flags::NOHUGEPAGE;
    }
    if has("mw") && matches!(kind, VmaKind::FileShared | VmaKind::Shmem) {
        v.flags |= vma_flags::MAYWRITE;
    }
    Ok(())
}

/// Classifies a mapping from its line alone; [`apply_vm_flags`] adds what
/// its `VmFlags` tell.
fn classify(pid: i32, e: &SmapsEntry) -> Result<Vma> {
    let mut p = 0;
    if e.perms[0] == b'r' {
        p |= prot::READ;
    }
    if e.perms[1] == b'w' {
        p |= prot::WRITE;
    }
    if e.perms[2] == b'x' {
        p |= prot::EXEC;
    }
    let shared = e.perms[3] == b's';
    let unsupported = |what: String| DumpError::Unsupported {
        pid,
        what: format!("mapping {:#x}-{:#x} ({what})", e.start, e.end),
    };
    let mut vma = Vma {
        start: e.start,
        end: e.end,
        prot: p,
        flags: 0,
        kind: VmaKind::Anon as i32,
        file_offset: 0,
        path: String::new(),
        file: None,
        pages: Vec::new(),
        shmem_id: 0,
        shmem_owner: None,
        sysv_shmid: 0,
        inherited: false,
        dropped: Vec::new(),
        guards: Vec::new(),
    };
    let kind = match e.path.as_str() {
        "[vdso]" => VmaKind::Vdso,
        "[vvar]" => VmaKind::Vvar,
        "[vvar_vclock]" => VmaKind::VvarVclock,
        "[vsyscall]" => VmaKind::Vsyscall,
        "[heap]" => {
            vma.flags |= vma_flags::HEAP;
            VmaKind::Anon
        }
        "[stack]" => {
            vma.flags |= vma_flags::STACK;
            VmaKind::Anon
        }
        "" => {
            if shared {
                return Err(unsupported(
                    "shared anonymous memory without a backing".into(),
                ));
            }
            VmaKind::Anon
        }
        "/dev/zero (deleted)" if shared => {
            vma.file_offset = e.offset;
            VmaKind::Shmem
        }
        // A private mapping of /dev/zero is anonymous memory the kernel
        // names after the device (reading the device to hash it would
        // never end); it comes back as plain anonymous memory.
        "/dev/zero" if !shared => VmaKind::Anon,
        path if path.starts_with("[anon:") => VmaKind::Anon,
        path if path.starts_with("/SYSV") => {
            // The inode of a SysV segment's file is its shmid.
            vma.sysv_shmid = e.inode as i32;
            vma.file_offset = e.offset;
            VmaKind::SysvShm
        }
        // Saved apart (`aio.rs`): never a VMA of the image.
        AIO_RING => return Err(unsupported("aio ring taken for memory".into())),
        path if path.starts_with(MEMFD_PREFIX) || path.ends_with(DELETED_SUFFIX) => {
            // The object (its id and data) is collected by `shmem`.
            vma.path = path.to_string();
            vma.file_offset = e.offset;
            if shared {
                VmaKind::Shmem
            } else {
                VmaKind::ShmemPrivate
            }
        }
        path if path.starts_with('[') => {
            return Err(unsupported(format!("special mapping {path}")));
        }
        path => {
            vma.path = path.to_string();
            vma.file_offset = e.offset;
            vma.file = Some(file_id(pid, e, !shared)?);
            if shared && on_tmpfs(pid, e)? {
                // It lives only in RAM: saved once as a shared memory
                // object (`shmem`), recreated if gone at restore.
                VmaKind::Shmem
            } else if shared {
                VmaKind::FileShared
            } else {
                VmaKind::FilePrivate
            }
        }
    };
    vma.kind = kind as i32;
    Ok(vma)
}

/// Identity of a mapped file, taken through `/proc/PID/map_files` (the
/// inode actually mapped) and checked against the path (the inode restore
/// will open). A private mapping's file (code, libraries) is hashed too, so
/// restore can tell a patched binary from an untouched one whatever its
/// mtime says.
fn file_id(pid: i32, e: &SmapsEntry, private: bool) -> Result<FileId> {
    let link = procfile::path(pid, &format!("map_files/{:x}-{:x}", e.start, e.end));
    let mapped = std::fs::metadata(&link).map_err(|s| procfile::proc_err(pid, link.clone(), s))?;
    let named = std::fs::metadata(seen_path(pid, &e.path)?).map_err(|source| DumpError::Proc {
        pid,
        path: e.path.clone().into(),
        source,
    })?;
    if (mapped.dev(), mapped.ino()) != (named.dev(), named.ino()) || mapped.ino() != e.inode {
        return Err(DumpError::Unsupported {
            pid,
            what: format!(
                "mapping {:#x}-{:#x}: {} was replaced after it was mapped",
                e.start, e.end, e.path
            ),
        });
    }
    let sha256 = if private {
        CONTENT_HASHES.get_or_hash(&mapped, || {
            File::open(&link)
                .and_then(FileId::content_sha256)
                .map_err(|source| DumpError::Proc {
                    pid,
                    path: link.clone(),
                    source,
                })
        })?
    } else {
        Vec::new()
    };
    Ok(FileId {
        size: mapped.size(),
        mtime_ns: mapped.mtime() * NANOS_PER_SEC + mapped.mtime_nsec(),
        mode: mapped.mode(),
        dev: mapped.dev(),
        ino: mapped.ino(),
        uid: mapped.uid(),
        gid: mapped.gid(),
        sha256,
    })
}

/// Where ckpt finds `path` of a mapping of `pid`, as the restored process
/// will open it. The kernel shows it from ckpt's root where ckpt can reach
/// the file (a process chrooted in ckpt's mount namespace included), and
/// from its namespace's root where it cannot: then through the process's
/// root, in its mount namespace.
fn seen_path(pid: i32, path: &str) -> Result<std::path::PathBuf> {
    let ns = |path: std::path::PathBuf| {
        std::fs::metadata(&path)
            .map(|m| m.ino())
            .map_err(|s| procfile::proc_err(pid, path, s))
    };
    if ns(procfile::path(pid, "ns/mnt"))? == ns("/proc/thread-self/ns/mnt".into())? {
        Ok(path.into())
    } else {
        Ok(procfile::path(pid, "root").join(path.trim_start_matches('/')))
    }
}

const NANOS_PER_SEC: i64 = 1_000_000_000;

/// statfs(2) `f_type` of tmpfs.
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// The file mapped by `e` lives on a tmpfs (only in RAM).
fn on_tmpfs(pid: i32, e: &SmapsEntry) -> Result<bool> {
    let link = procfile::path(pid, &format!("map_files/{:x}-{:x}", e.start, e.end));
    let fs =
        nix::sys::statfs::statfs(&link).map_err(|s| procfile::proc_err(pid, link, s.into()))?;
    Ok(fs.filesystem_type().0 as i64 == TMPFS_MAGIC)
}

/// What makes a cached content hash still valid: the same inode, unchanged
/// since (a write moves ctime, which no one but root can set back).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct HashKey {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

/// Content hashes of mapped files already computed, so a library mapped
/// several times and by every process of a tree (libc) is read once.
struct HashCache(std::sync::Mutex<Option<std::collections::HashMap<HashKey, Vec<u8>>>>);

static CONTENT_HASHES: HashCache = HashCache(std::sync::Mutex::new(None));

impl HashCache {
    fn get_or_hash(
        &self,
        m: &std::fs::Metadata,
        hash: impl FnOnce() -> Result<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        let key = HashKey {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() * NANOS_PER_SEC + m.mtime_nsec(),
            ctime_ns: m.ctime() * NANOS_PER_SEC + m.ctime_nsec(),
        };
        let cached = |g: &Option<std::collections::HashMap<HashKey, Vec<u8>>>| {
            g.as_ref().and_then(|c| c.get(&key).cloned())
        };
        if let Some(h) = cached(&self.0.lock().unwrap_or_else(|e| e.into_inner())) {
            return Ok(h);
        }
        let h = hash()?;
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(Default::default)
            .insert(key, h.clone());
        Ok(h)
    }
}

/// Whether a page with PAGEMAP_SCAN categories `cats` must be saved.
fn keep(kind: VmaKind, cats: u64) -> bool {
    use page_is::*;
    // A guard page has nothing to read (the kernel shows it as swapped).
    if cats & GUARD != 0 {
        return false;
    }
    match kind {
        // A page that is only the shared zero page reads back as zeros
        // without being saved.
        VmaKind::Anon => cats & (PRESENT | SWAPPED) != 0 && cats & PFNZERO == 0,
        // Only pages the process wrote (private anonymous copies); clean
        // pages come back from the file or object.
        VmaKind::FilePrivate | VmaKind::ShmemPrivate => {
            cats & SWAPPED != 0 || (cats & PRESENT != 0 && cats & FILE == 0)
        }
        _ => false,
    }
}

/// Runs of pages to save in `vma`, as (address, pages), from PAGEMAP_SCAN:
/// the kernel reports runs, so huge sparse reservations cost nothing.
/// A large VMA is scanned in pieces of this size on every core: the kernel
/// walks each page table entry, which dominates a big process's freeze.
const SCAN_PIECE: u64 = 256 << 20;

fn scan_runs(pagemap: &File, vma: &Vma, kind: VmaKind) -> std::io::Result<Runs> {
    use page_is::*;
    use rayon::prelude::*;
    let pieces: Vec<(u64, u64)> = (0..(vma.end - vma.start).div_ceil(SCAN_PIECE))
        .map(|k| {
            let start = vma.start + k * SCAN_PIECE;
            (start, vma.end.min(start + SCAN_PIECE))
        })
        .collect();
    // Asking whether a page is a file's makes the kernel look at every
    // page's struct page (a cache miss each); anonymous memory has none.
    let report = match kind {
        VmaKind::Anon => PRESENT | SWAPPED | PFNZERO | GUARD,
        _ => PRESENT | SWAPPED | FILE | PFNZERO | GUARD,
    };
    let scan = |&(start, end): &(u64, u64)| {
        let mut regions = Vec::new();
        sys::pagemap_scan(pagemap, start, end, PRESENT | SWAPPED, report, &mut regions)
            .map(|()| regions)
    };
    // Small VMAs (most of them) in place: handing one scan to the pool
    // costs more than the scan.
    let scanned = if pieces.len() == 1 {
        vec![scan(&pieces[0])?]
    } else {
        pieces
            .par_iter()
            .map(scan)
            .collect::<std::io::Result<Vec<_>>>()?
    };
    let mut runs = Runs::default();
    for r in scanned.iter().flatten() {
        runs.add(kind, r.categories, r.start, (r.end - r.start) / PAGE_SIZE);
    }
    Ok(runs)
}

/// The pages of a VMA to save and its guard pages, each as runs of
/// (address, pages) in address order.
#[derive(Debug, Default, PartialEq, Eq)]
struct Runs {
    saved: Vec<(u64, u64)>,
    guards: Vec<(u64, u64)>,
}

impl Runs {
    /// Files `pages` pages at `addr` of categories `cats`.
    fn add(&mut self, kind: VmaKind, cats: u64, addr: u64, pages: u64) {
        if cats & page_is::GUARD != 0 {
            push_run(&mut self.guards, addr, pages);
        } else if keep(kind, cats) {
            push_run(&mut self.saved, addr, pages);
        }
    }
}

/// The same from `/proc/PID/pagemap` entries, read in bounded chunks (for
/// kernels without PAGEMAP_SCAN).
fn read_runs(pid: i32, pagemap: &File, vma: &Vma, kind: VmaKind) -> Result<Runs> {
    const CHUNK_PAGES: u64 = 32 * 1024;
    let mut runs = Runs::default();
    let mut buf = vec![0u8; (CHUNK_PAGES * 8) as usize];
    let mut addr = vma.start;
    while addr < vma.end {
        let n = CHUNK_PAGES.min((vma.end - addr) / PAGE_SIZE);
        let b = &mut buf[..(n * 8) as usize];
        pagemap
            .read_exact_at(b, addr / PAGE_SIZE * 8)
            .map_err(|s| procfile::proc_err(pid, procfile::path(pid, "pagemap"), s))?;
        for (i, entry) in b.chunks_exact(8).enumerate() {
            let e = u64::from_le_bytes(entry.try_into().expect("8 bytes"));
            let mut cats = 0;
            if e & PM_PRESENT != 0 {
                cats |= page_is::PRESENT;
            }
            if e & PM_SWAPPED != 0 {
                cats |= page_is::SWAPPED;
            }
            if e & PM_FILE != 0 {
                cats |= page_is::FILE;
            }
            if e & PM_GUARD != 0 {
                cats |= page_is::GUARD;
            }
            runs.add(kind, cats, addr + i as u64 * PAGE_SIZE, 1);
        }
        addr += n * PAGE_SIZE;
    }
    Ok(runs)
}

fn push_run(runs: &mut Vec<(u64, u64)>, addr: u64, pages: u64) {
    match runs.last_mut() {
        Some((a, n)) if *a + *n * PAGE_SIZE == addr => *n += pages,
        _ => runs.push((addr, pages)),
    }
}

/// Decides which pages of each VMA must be saved and lays them out in the
/// pages file (offsets assigned in address order). Returns the total size.
pub fn plan_pages(pid: i32, vmas: &mut [Vma]) -> Result<u64> {
    let p = procfile::path(pid, "pagemap");
    let pagemap = File::open(&p).map_err(|s| procfile::proc_err(pid, p.clone(), s))?;
    let mut use_scan = true;
    let mut offset = 0u64;
    for vma in vmas.iter_mut() {
        let kind = VmaKind::try_from(vma.kind).unwrap_or(VmaKind::Anon);
        // A shared object's data is saved once, with the object (`shmem`).
        if !matches!(
            kind,
            VmaKind::Anon | VmaKind::FilePrivate | VmaKind::ShmemPrivate
        ) {
            continue;
        }
        let runs = if use_scan {
            match scan_runs(&pagemap, vma, kind) {
                Ok(runs) => runs,
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTTY | libc::EINVAL)) => {
                    use_scan = false;
                    read_runs(pid, &pagemap, vma, kind)?
                }
                Err(e) => return Err(procfile::proc_err(pid, p.clone(), e)),
            }
        } else {
            read_runs(pid, &pagemap, vma, kind)?
        };
        for (addr, nr_pages) in runs.saved {
            vma.pages.push(PageRange {
                addr,
                nr_pages,
                offset,
            });
            offset += nr_pages * PAGE_SIZE;
        }
        vma.guards = runs
            .guards
            .into_iter()
            .map(|(addr, nr_pages)| PageSpan { addr, nr_pages })
            .collect();
    }
    Ok(offset)
}

/// Lays the saved page ranges out again, back to back, after some were
/// dropped (private pages still shared with a parent since fork, saved
/// with the parent). Returns the new total.
pub fn reassign_offsets(vmas: &mut [Vma]) -> u64 {
    let mut offset = 0;
    for r in vmas.iter_mut().flat_map(|v| v.pages.iter_mut()) {
        r.offset = offset;
        offset += r.len();
    }
    offset
}

/// Identity and code of the process's vDSO, read from its memory: a
/// restore on another kernel maps the code as a proxy to that kernel's
/// vDSO (as CRIU does).
pub fn vdso_info(t: &Tracee, vmas: &[Vma]) -> Result<Option<VdsoInfo>> {
    let find = |k: VmaKind| vmas.iter().find(|v| v.kind == k as i32);
    let Some(vdso) = find(VmaKind::Vdso) else {
        return Ok(None);
    };
    if vdso.len() > ckpt_image::mm::MAX_VDSO_LEN {
        return Err(DumpError::Unsupported {
            pid: t.pid(),
            what: format!(
                "a [vdso] of {} bytes (at most {} are saved)",
                vdso.len(),
                ckpt_image::mm::MAX_VDSO_LEN
            ),
        });
    }
    let mut code = vec![0u8; vdso.len() as usize];
    t.read_mem(vdso.start, &mut code)?;
    Ok(Some(VdsoInfo {
        vdso_len: vdso.len(),
        vdso_crc32c: crc32c::crc32c(&code),
        vvar_len: find(VmaKind::Vvar).map_or(0, Vma::len),
        vvar_vclock_len: find(VmaKind::VvarVclock).map_or(0, Vma::len),
        vdso_code: code,
    }))
}

/// The mm fields of `struct prctl_mm_map` from `/proc/PID/stat` (already
/// read, as [`procfile::stat_fields`]) and `/proc/PID/auxv`; `brk` comes
/// from the parasite (stat lacks it).
pub fn mm_fields(pid: i32, f: &[u64], brk: u64) -> Result<MmFields> {
    let at = |n: usize| f.get(stat_index(n)).copied().unwrap_or(0);
    Ok(MmFields {
        start_code: at(26),
        end_code: at(27),
        start_stack: at(28),
        start_data: at(45),
        end_data: at(46),
        start_brk: at(47),
        brk,
        arg_start: at(48),
        arg_end: at(49),
        env_start: at(50),
        env_end: at(51),
        auxv: procfile::read_bytes(pid, "auxv")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_paths_keep_spaces() {
        let t = "7f00-7f01 r--p 00001000 08:01 1234    /tmp/a b (x)\nRss: 4 kB\nVmFlags: rd mr mw me\n\
                 7f01-7f02 rw-s 00000000 00:01 99     /dev/zero (deleted)\nVmFlags: rd wr sh mr mw me ms\n\
                 7ffd-7ffe rw-p 00000000 00:00 0                          [stack]\nVmFlags: rd wr mr mw me gd ac\n";
        let e = parse_smaps(1, t).unwrap();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].path, "/tmp/a b (x)");
        assert_eq!(e[0].offset, 0x1000);
        assert_eq!(e[0].inode, 1234);
        assert_eq!(e[1].perms, *b"rw-s");
        assert!(e[2].vm_flags.contains(&"gd".to_string()));
        let mut v = classify(1, &e[2]).unwrap();
        assert_eq!(
            v.flags & vma_flags::GROWSDOWN,
            0,
            "maps lines carry no VmFlags"
        );
        apply_vm_flags(1, &mut v, &e[2].vm_flags).unwrap();
        assert_eq!(v.flags & vma_flags::GROWSDOWN, vma_flags::GROWSDOWN);
        assert_eq!(classify(1, &e[1]).unwrap().kind, VmaKind::Shmem as i32);
    }

    #[test]
    fn vm_flags_must_name_the_same_mappings() {
        let maps = "7ffd-7ffe rw-p 00000000 00:00 0  [stack]\n";
        let mut vmas: Vec<Vma> = parse_smaps(1, maps)
            .unwrap()
            .iter()
            .map(|e| classify(1, e).unwrap())
            .collect();
        let flags = |start, end| VmFlagsOf {
            start,
            end,
            flags: vec!["gd".to_string()],
        };
        let err = apply_all_vm_flags(1, &mut vmas, &[flags(0x7ffd, 0x7fff)]).unwrap_err();
        assert!(err.to_string().contains("changed while frozen"), "{err}");
        let err = apply_all_vm_flags(1, &mut vmas, &[]).unwrap_err();
        assert!(err.to_string().contains("changed while frozen"), "{err}");
        apply_all_vm_flags(1, &mut vmas, &[flags(0x7ffd, 0x7ffe)]).unwrap();
        assert_eq!(vmas[0].flags & vma_flags::GROWSDOWN, vma_flags::GROWSDOWN);
    }

    #[test]
    fn huge_pages_are_refused_by_their_flag() {
        let t = "7f00-7f20 rw-s 00000000 00:01 7  /SYSV00000000 (deleted)\nVmFlags: rd wr sh mr mw me ms ht\n\
                 7f20-7f40 rw-s 00000000 00:01 8  /anon_hugepage (deleted)\nVmFlags: rd wr sh mr mw me ms ht\n";
        for e in parse_smaps(1, t).unwrap() {
            let mut v = classify(1, &e).unwrap();
            let err = apply_vm_flags(1, &mut v, &e.vm_flags).unwrap_err();
            assert!(err.to_string().contains("huge"), "{err}");
        }
    }

    #[test]
    fn scan_and_pagemap_agree() {
        // 64 pages: every third written, every fifth only read (zero page).
        let len = 64 * 4096;
        // SAFETY: a fresh private anonymous mapping owned by this test.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        } as *mut u8;
        assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
        for i in 0..64 {
            // SAFETY: i * 4096 is inside the mapping made above.
            unsafe {
                if i % 3 == 0 {
                    p.add(i * 4096).write_volatile(1);
                } else if i % 5 == 0 {
                    p.add(i * 4096).read_volatile();
                }
            }
        }
        // The last page, written, becomes a guard page: not saved, listed.
        let guard = p as u64 + 63 * 4096;
        // SAFETY: madvise on a page of the mapping made above.
        let guarded = unsafe {
            libc::madvise(
                guard as *mut libc::c_void,
                4096,
                ckpt_image::mm::MADV_GUARD_INSTALL,
            )
        };
        assert_eq!(guarded, 0, "{}", std::io::Error::last_os_error());
        let vma = Vma {
            start: p as u64,
            end: p as u64 + len as u64,
            ..Default::default()
        };
        let me = std::process::id() as i32;
        let f = File::open("/proc/self/pagemap").unwrap();
        let scanned = scan_runs(&f, &vma, VmaKind::Anon).unwrap();
        let read = read_runs(me, &f, &vma, VmaKind::Anon).unwrap();
        let pages = |runs: &[(u64, u64)]| runs.iter().map(|r| r.1).sum::<u64>();
        // Written pages are saved either way; the scan also skips zero pages.
        assert_eq!(pages(&scanned.saved), 21, "{scanned:?}");
        assert!(pages(&read.saved) >= 21);
        assert_eq!(scanned.guards, [(guard, 1)]);
        assert_eq!(read.guards, [(guard, 1)]);
        for (a, n) in &scanned.saved {
            for k in 0..*n {
                assert_eq!((a + k * 4096 - p as u64) / 4096 % 3, 0);
            }
        }
        // SAFETY: unmapping the mapping made above.
        unsafe { libc::munmap(p.cast(), len) };
    }

    #[test]
    fn own_address_space_parses() {
        let vmas = collect_vmas(std::process::id() as i32).unwrap();
        assert!(vmas.iter().any(|v| v.kind == VmaKind::Vdso as i32));
        assert!(vmas.windows(2).all(|w| w[0].end <= w[1].start));
    }
}
