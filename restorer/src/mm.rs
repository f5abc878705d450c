//! Rebuilding the address space: clear out what the child inherited from
//! the restorer, move the kernel's vDSO/vvar to where the dumped process had
//! them (or, on another kernel, map the dumped vDSO there as a proxy to this
//! kernel's, which stays elsewhere), recreate every VMA at its address with its protections and flags
//! (the saved pages are copied in by `pages`), and set the kernel's mm
//! fields.

use ckpt_image::PAGE_SIZE;
use ckpt_image::mm::{Mm, VdsoInfo, Vma, VmaKind, vma_flags};
use ckpt_image::task::MmFields;
use std::os::unix::fs::MetadataExt;

use crate::error::{FileUse, RestoreError, Result};
use crate::fd::take_from;
use crate::identity::{Contents, Expected, FileChecks, Inode};
use crate::shmem;
use ckpt_image::ImageDir;
use ckpt_image::task::Creds;
use ckpt_parasite::batch;
use ckpt_parasite::remote::{Remote, SCRATCH_LEN};

/// One line of the child's own `/proc/PID/maps`.
#[derive(Debug, Clone)]
pub struct MapLine {
    /// Start address.
    pub start: u64,
    /// End address.
    pub end: u64,
    /// Executable.
    pub exec: bool,
    /// Path or `[name]`.
    pub path: String,
}

/// Reads `/proc/PID/maps` of the child.
pub fn read_maps(pid: i32) -> Result<Vec<MapLine>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| RestoreError::os(pid, "read /proc/PID/maps", e))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (a, b) = f.next()?.split_once('-')?;
            let perms = f.next()?;
            Some(MapLine {
                start: u64::from_str_radix(a, 16).ok()?,
                end: u64::from_str_radix(b, 16).ok()?,
                exec: perms.as_bytes().get(2) == Some(&b'x'),
                path: f.nth(3).unwrap_or("").to_string(),
            })
        })
        .collect())
}

const LOWEST: u64 = 1 << 32;
const HIGHEST: u64 = 0x7fff_0000_0000;
/// Keep temporary areas away from stack guard gaps and heap growth.
const MARGIN: u64 = 1 << 24;

/// Finds a free, page-aligned range of `len` bytes that overlaps none of
/// `busy`, searching down from the top of the usual mmap area.
pub fn find_gap(busy: &[(u64, u64)], len: u64) -> Option<u64> {
    let mut b: Vec<(u64, u64)> = busy.to_vec();
    b.sort_unstable();
    let mut top = HIGHEST;
    for &(s, e) in b.iter().rev() {
        if s >= top {
            continue;
        }
        if e + MARGIN <= top && top - (e + MARGIN) >= len + MARGIN {
            return Some(top - MARGIN - len);
        }
        top = top.min(s);
        if top < LOWEST {
            return None;
        }
    }
    (top >= LOWEST + len + MARGIN).then(|| top - MARGIN - len)
}

fn special_kind(path: &str) -> Option<VmaKind> {
    match path {
        "[vdso]" => Some(VmaKind::Vdso),
        "[vvar]" => Some(VmaKind::Vvar),
        "[vvar_vclock]" => Some(VmaKind::VvarVclock),
        "[vsyscall]" => Some(VmaKind::Vsyscall),
        _ => None,
    }
}

/// How the process gets its vDSO back.
#[derive(Debug)]
pub enum VdsoPlan {
    /// This kernel's vDSO is the dumped one: it and its vvar are moved to
    /// the dumped addresses.
    Same,
    /// Another kernel's: the dumped code goes back as a proxy to this
    /// kernel's vDSO (these bytes, read from the child), as CRIU does.
    Proxy {
        /// This kernel's `[vdso]`.
        here: Vec<u8>,
    },
}

/// Compares this kernel's vDSO (the child's, inherited from the restorer)
/// with the dumped one.
pub fn vdso_plan(pid: i32, r: &Remote<'_>, child: &[MapLine], want: &VdsoInfo) -> Result<VdsoPlan> {
    let find = |k: VmaKind| child.iter().find(|m| special_kind(&m.path) == Some(k));
    let len = |k| find(k).map_or(0, |m| m.end - m.start);
    let incompatible = |what: String| RestoreError::Host {
        pid,
        what: format!("{what}; restore on a machine running the dumping kernel"),
    };
    let vdso =
        find(VmaKind::Vdso).ok_or_else(|| incompatible("this kernel maps no vDSO".into()))?;
    let mut code = vec![0u8; (vdso.end - vdso.start) as usize];
    r.t.read_mem(vdso.start, &mut code)?;
    let same_code = code.len() as u64 == want.vdso_len && crc32c::crc32c(&code) == want.vdso_crc32c;
    let same_vvar =
        len(VmaKind::Vvar) == want.vvar_len && len(VmaKind::VvarVclock) == want.vvar_vclock_len;
    if same_code && same_vvar {
        return Ok(VdsoPlan::Same);
    }
    if want.vdso_code.is_empty() {
        return Err(incompatible(format!(
            "this kernel's vDSO ({} bytes) differs from the dumped one ({} bytes), \
             and the image (written before the vDSO proxy) does not hold its code",
            code.len(),
            want.vdso_len
        )));
    }
    log::debug!(
        "pid {pid}: this kernel's vDSO ({} bytes) differs from the dumped one ({} bytes): \
         mapping the dumped one as a proxy",
        code.len(),
        want.vdso_len
    );
    Ok(VdsoPlan::Proxy { here: code })
}

/// Checks the vDSO part of an image before any process is created: its
/// length is bounded, and the code, when saved, is the one its length and
/// CRC32C describe and fits the dumped `[vdso]` VMA.
pub fn validate_vdso(mm: &Mm) -> std::result::Result<(), String> {
    let Some(v) = &mm.vdso else {
        return Ok(());
    };
    if v.vdso_len > ckpt_image::mm::MAX_VDSO_LEN {
        return Err(format!(
            "vDSO of {} bytes (at most {})",
            v.vdso_len,
            ckpt_image::mm::MAX_VDSO_LEN
        ));
    }
    if v.vdso_code.is_empty() {
        return Ok(());
    }
    if v.vdso_code.len() as u64 != v.vdso_len || crc32c::crc32c(&v.vdso_code) != v.vdso_crc32c {
        return Err("the saved vDSO code does not match its length and CRC32C".into());
    }
    let vma = mm.vmas.iter().find(|m| m.kind == VmaKind::Vdso as i32);
    if vma.is_none_or(|m| m.len() != v.vdso_len || m.start % ckpt_image::PAGE_SIZE != 0) {
        return Err("the saved vDSO code does not fit the dumped [vdso] mapping".into());
    }
    Ok(())
}

/// Unmaps every mapping the child inherited except the scratch area, the
/// kernel's special mappings and the parent's memory it keeps.
fn clear_inherited(r: &Remote<'_>, child: &[MapLine], mm: &Mm) -> Result<()> {
    let scratch = (r.base, r.base + SCRATCH_LEN);
    let calls: Vec<batch::Call> = child
        .iter()
        .filter(|m| special_kind(&m.path).is_none() && (m.start, m.end) != scratch)
        .flat_map(|m| crate::inherit::unmaps_except_inherited(mm, m.start, m.end))
        .collect();
    r.call_many(&calls)?;
    Ok(())
}

/// Removes every mapping the child inherited except the scratch area and
/// the kernel's special mappings, then moves those to the dumped addresses.
pub fn clear_and_move_specials(r: &Remote<'_>, child: &[MapLine], mm: &Mm) -> Result<()> {
    clear_inherited(r, child, mm)?;
    let scratch = (r.base, r.base + SCRATCH_LEN);
    // Two moves each, through free space, so a destination never lands on
    // a special mapping that has not moved yet.
    let mut specials: Vec<(u64, u64, Option<&Vma>)> = child
        .iter()
        .filter_map(|m| {
            let k = special_kind(&m.path)?;
            (k != VmaKind::Vsyscall).then(|| {
                let dumped = mm.vmas.iter().find(|v| v.kind == k as i32);
                (m.start, m.end, dumped)
            })
        })
        .collect();
    let mut busy: Vec<(u64, u64)> = mm.vmas.iter().map(|v| (v.start, v.end)).collect();
    busy.extend(crate::aio::spans(mm));
    busy.extend(child.iter().map(|m| (m.start, m.end)));
    busy.push(scratch);
    for s in specials.iter_mut() {
        let len = s.1 - s.0;
        let Some(dumped) = s.2 else {
            r.call("munmap (vdso)", libc::SYS_munmap, [s.0, len, 0, 0, 0, 0])?;
            continue;
        };
        if dumped.start == s.0 {
            continue;
        }
        let tmp = find_gap(&busy, len).ok_or_else(|| RestoreError::Host {
            pid: r.t.pid(),
            what: "no free address range to move the vDSO through".into(),
        })?;
        mremap(r, s.0, len, tmp)?;
        busy.push((tmp, tmp + len));
        *s = (tmp, tmp + len, Some(dumped));
    }
    for (start, end, dumped) in specials {
        if let Some(d) = dumped
            && d.start != start
        {
            mremap(r, start, end - start, d.start)?;
        }
    }
    Ok(())
}

/// For the proxy: removes what the child inherited like
/// [`clear_and_move_specials`], but leaves this kernel's `[vvar]`,
/// `[vvar_vclock]` and `[vdso]` together, as the kernel laid them out,
/// where no dumped mapping lies (moving them there if needed). Returns
/// where `[vdso]` is then.
pub fn clear_and_park_specials(r: &Remote<'_>, child: &[MapLine], mm: &Mm) -> Result<u64> {
    let pid = r.t.pid();
    clear_inherited(r, child, mm)?;
    let specials: Vec<&MapLine> = child
        .iter()
        .filter(|m| special_kind(&m.path).is_some_and(|k| k != VmaKind::Vsyscall))
        .collect();
    let vdso = specials
        .iter()
        .find(|m| special_kind(&m.path) == Some(VmaKind::Vdso))
        .ok_or_else(|| RestoreError::Host {
            pid,
            what: "this kernel maps no vDSO".into(),
        })?;
    let lo = specials.iter().map(|m| m.start).min().unwrap_or(vdso.start);
    let hi = specials.iter().map(|m| m.end).max().unwrap_or(vdso.end);
    // Clear of every dumped mapping by a margin, so no dumped stack grows
    // into them and no dumped mapping merges with them.
    let clear = mm
        .vmas
        .iter()
        .map(|v| (v.start, v.end))
        .chain(crate::aio::spans(mm))
        .all(|(start, end)| end.saturating_add(MARGIN) <= lo || hi.saturating_add(MARGIN) <= start);
    if clear {
        return Ok(vdso.start);
    }
    let mut busy: Vec<(u64, u64)> = mm.vmas.iter().map(|v| (v.start, v.end)).collect();
    busy.extend(crate::aio::spans(mm));
    busy.extend(child.iter().map(|m| (m.start, m.end)));
    busy.push((r.base, r.base + SCRATCH_LEN));
    let to = find_gap(&busy, hi - lo).ok_or_else(|| RestoreError::Host {
        pid,
        what: "no free address range for this kernel's vDSO".into(),
    })?;
    // The destination overlaps neither the dumped mappings nor the
    // specials where they are, so the order of the moves does not matter.
    for m in &specials {
        mremap(r, m.start, m.end - m.start, to + (m.start - lo))?;
    }
    log::debug!(
        "pid {pid}: this kernel's vvar and vDSO moved from {lo:#x} to {to:#x}, clear of the dumped mappings"
    );
    Ok(to + (vdso.start - lo))
}

/// Maps the dumped vDSO code at the dumped `[vdso]` address, private and
/// anonymous, with every exported function redirected to its namesake in
/// this kernel's vDSO (`here`, mapped at `here_base`), and makes it r-x.
/// The old `[vvar]` range stays unmapped: no code that reads it runs.
pub fn map_vdso_proxy(
    r: &Remote<'_>,
    mm: &Mm,
    core: &ckpt_image::task::Core,
    here: &[u8],
    here_base: u64,
) -> Result<()> {
    let pid = r.t.pid();
    let want = mm
        .vdso
        .as_ref()
        .expect("a proxy is planned for a dumped vDSO");
    let vma = mm
        .vmas
        .iter()
        .find(|v| v.kind == VmaKind::Vdso as i32)
        .expect("validate_vdso checked the [vdso] mapping");
    let vdso_err = |source| RestoreError::Vdso { pid, source };
    let redirects = crate::vdso::plan(&want.vdso_code, here, here_base).map_err(vdso_err)?;
    crate::vdso::check_threads(core, vma.start, vma.end, &redirects).map_err(vdso_err)?;
    let code = crate::vdso::patched(&want.vdso_code, &redirects);
    let got = r.call(
        "mmap (vDSO proxy)",
        libc::SYS_mmap,
        [
            vma.start,
            vma.len(),
            (libc::PROT_READ | libc::PROT_WRITE) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED) as u64,
            u64::MAX,
            0,
        ],
    )?;
    if got != vma.start {
        return Err(invalid(
            pid,
            vma,
            "vDSO proxy mapped at a different address",
        ));
    }
    r.t.write_mem(vma.start, &code)?;
    r.call(
        "mprotect (vDSO proxy)",
        libc::SYS_mprotect,
        [
            vma.start,
            vma.len(),
            (libc::PROT_READ | libc::PROT_EXEC) as u64,
            0,
            0,
            0,
        ],
    )?;
    log::debug!(
        "pid {pid}: vDSO proxy at {:#x}: {} entry points redirected to this kernel's vDSO at {here_base:#x}",
        vma.start,
        redirects.len()
    );
    Ok(())
}

fn mremap(r: &Remote<'_>, from: u64, len: u64, to: u64) -> Result<()> {
    r.call(
        "mremap (vdso)",
        libc::SYS_mremap,
        [
            from,
            len,
            len,
            (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as u64,
            to,
            0,
        ],
    )?;
    Ok(())
}

/// Creates every non-special VMA. Each mapped file is checked to be the one
/// the process had (`checks`); a shared memory object is mapped from the
/// restorer's one copy of it (`objects`), at the VMA's offset in it.
pub fn map_vmas(
    r: &Remote<'_>,
    mm: &Mm,
    checks: &mut FileChecks,
    images: &ImageDir,
    objects: &mut shmem::Objects,
    creds: Option<&Creds>,
) -> Result<()> {
    let mut files = MappedFiles::default();
    let mapped = map_all(r, mm, checks, images, objects, creds, &mut files);
    // The files' fds go whatever happened: on success before any fd of the
    // process is installed, whose numbers they may hold.
    let closed = files.close_all(r);
    mapped.and(closed)
}

/// [`map_vmas`], with the files it opens kept in `files`.
fn map_all(
    r: &Remote<'_>,
    mm: &Mm,
    checks: &mut FileChecks,
    images: &ImageDir,
    objects: &mut shmem::Objects,
    creds: Option<&Creds>,
    files: &mut MappedFiles,
) -> Result<()> {
    let pid = r.t.pid();
    // Mappings are made in batches, many syscalls per stop, in the image's
    // order; only what needs a result first (opening a file, taking a
    // shared memory object's fd, attaching SysV memory) runs on its own.
    let mut batch = MapBatch::default();
    let apart = Apart::plan(r, mm)?;
    files.open_all(r, mm)?;
    for (i, v) in mm.vmas.iter().enumerate() {
        let kind = VmaKind::try_from(v.kind).map_err(|_| invalid(pid, v, "unknown kind"))?;
        if kind.is_special() || v.inherited {
            continue;
        }
        let mut flags = libc::MAP_FIXED;
        if kind == VmaKind::Anon {
            let flags = map_flags(v, flags | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
            match apart.how(mm, i) {
                Placement::Plain => batch.push(v, flags, None),
                Placement::OwnAnonVma { through } => batch.push_apart(v, flags, through),
            }
            continue;
        }
        match kind {
            VmaKind::Shmem | VmaKind::ShmemPrivate => {
                batch.flush(r)?;
                let shared = kind == VmaKind::Shmem;
                let writable = shared && v.flags & vma_flags::MAYWRITE != 0;
                let at = shmem::AtPath {
                    r,
                    creds,
                    file: v.file.as_ref(),
                    checks: &mut *checks,
                };
                let mine = objects.fd(images, v.shmem_id, writable, Some(at))?;
                flags |= if shared {
                    libc::MAP_SHARED
                } else {
                    libc::MAP_PRIVATE
                };
                let fd = take_from(r, std::process::id() as i32, mine)?;
                batch.push(v, map_flags(v, flags), Some(fd));
                batch.close_after(fd);
            }
            VmaKind::FilePrivate | VmaKind::FileShared => {
                let shared = kind == VmaKind::FileShared;
                let writable = shared && v.flags & vma_flags::MAYWRITE != 0;
                flags |= if shared {
                    libc::MAP_SHARED
                } else {
                    libc::MAP_PRIVATE
                };
                let fd = files.open(r, v, writable)?;
                check_file(pid, v, fd, checks)?;
                batch.push(v, map_flags(v, flags), Some(fd));
            }
            VmaKind::SysvShm => {
                batch.flush(r)?;
                crate::ipc::attach(r, v)?;
            }
            _ => unreachable!("special and anonymous kinds handled above"),
        }
    }
    batch.flush(r)
}

/// The files a process's mappings are made from, each opened once inside
/// it however many of its VMAs map it (a library has four or five), and
/// closed once they are all mapped.
#[derive(Default)]
struct MappedFiles {
    /// Path and whether it was opened for writing: its fd in the process.
    open: std::collections::HashMap<(String, bool), i32>,
}

impl MappedFiles {
    /// Opens every file `mm`'s VMAs map, as many per stop as their paths
    /// fit in an argument slot (a program has a few libraries, an
    /// interpreter dozens). Stops at the first that fails to open, keeping
    /// those before it: [`MappedFiles::open`] then opens it alone and says
    /// why, naming the VMA.
    fn open_all(&mut self, r: &Remote<'_>, mm: &Mm) -> Result<()> {
        let mut wanted: Vec<(String, bool)> = Vec::new();
        for v in &mm.vmas {
            let writable = match VmaKind::try_from(v.kind) {
                Ok(VmaKind::FilePrivate) if !v.inherited => false,
                Ok(VmaKind::FileShared) if !v.inherited => v.flags & vma_flags::MAYWRITE != 0,
                _ => continue,
            };
            let key = (v.path.clone(), writable);
            if !self.open.contains_key(&key) && !wanted.contains(&key) {
                wanted.push(key);
            }
        }
        let mut rest = &wanted[..];
        while !rest.is_empty() {
            // Paths NUL-terminated one after another in slot 0.
            let mut calls = Vec::new();
            let mut at = 0u64;
            for (path, writable) in rest {
                let len = path.len() as u64 + 1;
                if at + len > ckpt_parasite::remote::SLOT_BYTES && !calls.is_empty() {
                    break;
                }
                let mut bytes = path.as_bytes().to_vec();
                bytes.push(0);
                let addr = r.put_at(0, at, &bytes)?;
                at += len;
                calls.push(batch::Call {
                    name: "open (mapped file)",
                    nr: libc::SYS_open,
                    args: [addr, open_flags(*writable) as u64, 0, 0, 0, 0],
                });
            }
            let ran = r.call_until_failure(&calls)?;
            for (key, &fd) in rest.iter().zip(&ran.results) {
                self.open.insert(key.clone(), fd as i32);
            }
            if ran.failed.is_some() {
                return Ok(());
            }
            rest = &rest[calls.len()..];
        }
        Ok(())
    }

    /// The fd of `v`'s file, opened now if no earlier VMA did.
    fn open(&mut self, r: &Remote<'_>, v: &Vma, writable: bool) -> Result<i32> {
        let key = (v.path.clone(), writable);
        if let Some(&fd) = self.open.get(&key) {
            return Ok(fd);
        }
        let fd = r
            .open(&v.path, open_flags(writable), 0)
            .map_err(|e| changed(r.t.pid(), v, format!("cannot reopen: {e}")))?;
        self.open.insert(key, fd);
        Ok(fd)
    }

    /// Closes every fd, in one batch.
    fn close_all(self, r: &Remote<'_>) -> Result<()> {
        let calls: Vec<batch::Call> = self
            .open
            .into_values()
            .map(|fd| batch::Call::close("close", fd))
            .collect();
        r.call_many(&calls)?;
        Ok(())
    }
}

/// How a mapped file is opened: read-only, or for writing when a shared
/// mapping of it may write. /proc resolved the dumped path: a symbolic
/// link at its end was put there since, and is not followed.
fn open_flags(writable: bool) -> i32 {
    let mode = if writable {
        libc::O_RDWR
    } else {
        libc::O_RDONLY
    };
    mode | libc::O_CLOEXEC | libc::O_NOFOLLOW
}

/// `flags` plus what the VMA's own flags ask of `mmap`.
fn map_flags(v: &Vma, flags: i32) -> i32 {
    if v.flags & vma_flags::GROWSDOWN != 0 {
        flags | libc::MAP_GROWSDOWN
    } else {
        flags
    }
}

/// The advice (`madvise`) each advice flag of a VMA stands for.
pub(crate) const ADVICE: [(u32, i32); 5] = [
    (vma_flags::DONTFORK, libc::MADV_DONTFORK),
    (vma_flags::DONTDUMP, libc::MADV_DONTDUMP),
    (vma_flags::WIPEONFORK, libc::MADV_WIPEONFORK),
    (vma_flags::HUGEPAGE, libc::MADV_HUGEPAGE),
    (vma_flags::NOHUGEPAGE, libc::MADV_NOHUGEPAGE),
];

/// The `madvise` calls that give `v` its advice flags and its guard pages
/// back. Guards hold no data and no saved page lies in one (checked by
/// [`validate_guards`]), so they may come before the pages are written.
fn advice(v: &Vma) -> impl Iterator<Item = batch::Call> + '_ {
    let flags = ADVICE
        .into_iter()
        .filter(move |(flag, _)| v.flags & flag != 0)
        .map(move |(_, advice)| batch::Call {
            name: "madvise",
            nr: libc::SYS_madvise,
            args: [v.start, v.len(), advice as u64, 0, 0, 0],
        });
    let guards = v.guards.iter().map(|g| batch::Call {
        name: "madvise(MADV_GUARD_INSTALL)",
        nr: libc::SYS_madvise,
        args: [
            g.addr,
            g.nr_pages * PAGE_SIZE,
            ckpt_image::mm::MADV_GUARD_INSTALL as u64,
            0,
            0,
            0,
        ],
    });
    flags.chain(guards)
}

/// Checks every VMA's guard pages: page aligned, in order, inside a
/// private mapping made by the restore (not inherited over fork), and
/// apart from its saved pages.
pub fn validate_guards(mm: &Mm) -> std::result::Result<(), String> {
    for v in mm.vmas.iter().filter(|v| !v.guards.is_empty()) {
        let at = || format!("mapping {:#x}-{:#x}", v.start, v.end);
        let private = [VmaKind::Anon, VmaKind::FilePrivate, VmaKind::ShmemPrivate]
            .iter()
            .any(|&k| v.kind == k as i32);
        if !private || v.inherited {
            return Err(format!(
                "{}: guard pages in a shared or inherited mapping",
                at()
            ));
        }
        let mut next = v.start;
        for g in &v.guards {
            let end = g
                .nr_pages
                .checked_mul(PAGE_SIZE)
                .and_then(|len| g.addr.checked_add(len));
            let overlaps_saved = |end: u64| {
                v.pages
                    .iter()
                    .any(|p| p.addr < end && g.addr < p.addr.saturating_add(p.len()))
            };
            match end {
                Some(end)
                    if g.nr_pages > 0
                        && g.addr % PAGE_SIZE == 0
                        && g.addr >= next
                        && end <= v.end
                        && !overlaps_saved(end) =>
                {
                    next = end
                }
                _ => {
                    return Err(format!(
                        "{}: guard pages at {:#x} outside it, unordered or over saved pages",
                        at(),
                        g.addr
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Flags of an anonymous VMA that the restore gives it and that decide,
/// with the protection, whether the kernel merges two neighbours.
const MERGE_FLAGS: u32 = vma_flags::GROWSDOWN
    | vma_flags::DONTFORK
    | vma_flags::DONTDUMP
    | vma_flags::WIPEONFORK
    | vma_flags::HUGEPAGE
    | vma_flags::NOHUGEPAGE;

/// Whether `a` and `b` (in this order) would become one VMA if both were
/// simply mapped: adjacent anonymous private memory with the same
/// protection and flags. The dumped process had them apart because each
/// had its own anon_vma (memory written before it was moved next to the
/// other, or inherited from a parent).
fn would_merge(a: &Vma, b: &Vma) -> bool {
    let anon = |v: &Vma| v.kind == VmaKind::Anon as i32;
    anon(a)
        && anon(b)
        && a.end == b.start
        && a.prot == b.prot
        && a.flags & MERGE_FLAGS == b.flags & MERGE_FLAGS
        && a.flags & vma_flags::GROWSDOWN == 0
}

/// How an anonymous VMA is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// Where it belongs, in one `mmap`.
    Plain,
    /// With an anon_vma of its own (its first page written, so the kernel
    /// never merges it with a neighbour it was apart from), made at
    /// `through` and moved into place with `mremap` when a neighbour is
    /// already there (a moved VMA keeps its anon_vma; a new one next to a
    /// neighbour would be merged at once).
    OwnAnonVma { through: Option<u64> },
}

/// Where VMAs that must stay apart from their neighbours are made.
struct Apart {
    /// A free range as large as the largest such VMA, if any needs it.
    window: Option<u64>,
}

impl Apart {
    fn plan(r: &Remote<'_>, mm: &Mm) -> Result<Apart> {
        let needs = (0..mm.vmas.len())
            .filter(|&i| {
                matches!(
                    Apart::placement(mm, i, None),
                    Placement::OwnAnonVma { through: Some(_) }
                )
            })
            .map(|i| mm.vmas[i].len())
            .max();
        let Some(len) = needs else {
            return Ok(Apart { window: None });
        };
        let mut busy: Vec<(u64, u64)> = mm.vmas.iter().map(|v| (v.start, v.end)).collect();
        busy.extend(crate::aio::spans(mm));
        // What the child has now: the scratch area, inherited memory, and
        // this kernel's vDSO where a proxy left it.
        busy.extend(read_maps(r.t.pid())?.iter().map(|m| (m.start, m.end)));
        busy.push((r.base, r.base + SCRATCH_LEN));
        let window = find_gap(&busy, len).ok_or_else(|| RestoreError::Host {
            pid: r.t.pid(),
            what: "no free address range to make adjacent anonymous mappings apart".into(),
        })?;
        Ok(Apart {
            window: Some(window),
        })
    }

    fn how(&self, mm: &Mm, i: usize) -> Placement {
        Apart::placement(mm, i, self.window)
    }

    /// VMA `i` needs an anon_vma of its own when a neighbour would merge
    /// with it; it goes through `window` when that neighbour already exists
    /// as it is mapped (the one before, mapped first in address order, or
    /// an inherited one after).
    fn placement(mm: &Mm, i: usize, window: Option<u64>) -> Placement {
        let v = &mm.vmas[i];
        let prev = i
            .checked_sub(1)
            .map(|j| &mm.vmas[j])
            .filter(|p| would_merge(p, v));
        let next = mm.vmas.get(i + 1).filter(|n| would_merge(v, n));
        if prev.is_none() && next.is_none() {
            return Placement::Plain;
        }
        let neighbour_there = prev.is_some() || next.is_some_and(|n| n.inherited);
        Placement::OwnAnonVma {
            through: neighbour_there.then_some(window.unwrap_or_default()),
        }
    }
}

/// Mappings (and the calls that go with them) waiting to be made in one
/// batch of remote syscalls.
#[derive(Default)]
struct MapBatch<'v> {
    calls: Vec<batch::Call>,
    /// Index in `calls` of each VMA's `mmap`, to check where it landed.
    maps: Vec<(usize, &'v Vma)>,
}

impl<'v> MapBatch<'v> {
    /// Maps `v` in place, from `fd` at its file offset (`None`: anonymous).
    fn push(&mut self, v: &'v Vma, flags: i32, fd: Option<i32>) {
        self.maps.push((self.calls.len(), v));
        self.calls.push(batch::Call {
            name: "mmap",
            nr: libc::SYS_mmap,
            args: [
                v.start,
                v.len(),
                u64::from(v.prot),
                flags as u64,
                fd.map_or(u64::MAX, |fd| fd as u64),
                if fd.is_some() { v.file_offset } else { 0 },
            ],
        });
        self.calls.extend(advice(v));
    }

    /// Closes `fd` right after the mappings pushed so far.
    fn close_after(&mut self, fd: i32) {
        self.calls.push(batch::Call::close("close", fd));
    }

    /// Maps `v` with an anon_vma of its own ([`Placement::OwnAnonVma`]):
    /// read-write at `through` (or in place), its first page written (and
    /// dropped again unless the image has it, so only the anon_vma stays),
    /// moved into place, then given its protection and advice.
    fn push_apart(&mut self, v: &'v Vma, flags: i32, through: Option<u64>) {
        let at = through.unwrap_or(v.start);
        let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let page = ckpt_image::PAGE_SIZE;
        self.maps.push((self.calls.len(), v));
        let mut call = |name, nr, args| self.calls.push(batch::Call { name, nr, args });
        call(
            "mmap",
            libc::SYS_mmap,
            [at, v.len(), rw, flags as u64, u64::MAX, 0],
        );
        call(
            "madvise(MADV_POPULATE_WRITE)",
            libc::SYS_madvise,
            [at, page, libc::MADV_POPULATE_WRITE as u64, 0, 0, 0],
        );
        let saved = v
            .pages
            .iter()
            .any(|p| p.addr <= v.start && v.start < p.addr.saturating_add(p.len()));
        if !saved {
            call(
                "madvise(MADV_DONTNEED)",
                libc::SYS_madvise,
                [at, page, libc::MADV_DONTNEED as u64, 0, 0, 0],
            );
        }
        if at != v.start {
            let moving = (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED) as u64;
            call(
                "mremap",
                libc::SYS_mremap,
                [at, v.len(), v.len(), moving, v.start, 0],
            );
        }
        if u64::from(v.prot) != rw {
            call(
                "mprotect",
                libc::SYS_mprotect,
                [v.start, v.len(), u64::from(v.prot), 0, 0, 0],
            );
        }
        self.calls.extend(advice(v));
    }

    fn flush(&mut self, r: &Remote<'_>) -> Result<()> {
        if self.calls.is_empty() {
            return Ok(());
        }
        let got = r.call_many(&self.calls)?;
        for &(i, v) in &self.maps {
            // Where this VMA's mmap asked for (its place, or the window).
            if got[i] != self.calls[i].args[0] {
                return Err(invalid(r.t.pid(), v, "mapped at a different address"));
            }
        }
        self.calls.clear();
        self.maps.clear();
        Ok(())
    }
}

/// The executable `/proc/PID/exe` is to name, and what it is checked
/// against.
pub struct Exe<'a> {
    /// The dumped path (read from /proc: every link resolved).
    pub path: &'a str,
    /// The process's VMAs: a mapping of the same path recorded the file's
    /// identity and contents.
    pub mm: &'a Mm,
    /// The process's credentials, for a lookup with its own fs ids.
    pub creds: Option<&'a Creds>,
}

/// Sets start_code…env_end, brk, auxv and /proc/PID/exe with one
/// `prctl(PR_SET_MM, PR_SET_MM_MAP)` (no CAP_SYS_RESOURCE needed).
pub fn set_mm_fields(
    r: &Remote<'_>,
    f: &MmFields,
    exe: &Exe<'_>,
    checks: &mut FileChecks,
) -> Result<()> {
    const PR_SET_MM: u64 = 35;
    const PR_SET_MM_MAP: u64 = 14;
    // First: the lookup uses argument slots 0 and 1.
    let exe_fd = open_exe(r, exe, checks)?;
    let auxv = match r.put(1, &f.auxv) {
        Ok(at) => at,
        Err(e) => {
            r.close(exe_fd)?;
            return Err(e.into());
        }
    };
    // A process forked from a restored parent already has this executable
    // (the kernel refuses to replace an exe file that is still mapped, even
    // by itself): then the exe is left as it is.
    let same_exe = {
        let pid = r.t.pid();
        let now = std::fs::metadata(format!("/proc/{pid}/exe"));
        let wanted = std::fs::metadata(format!("/proc/{pid}/fd/{exe_fd}"));
        matches!((now, wanted), (Ok(a), Ok(b)) if (a.dev(), a.ino()) == (b.dev(), b.ino()))
    };
    let exe_arg = if same_exe { u32::MAX } else { exe_fd as u32 };
    // struct prctl_mm_map: 11 addresses, auxv pointer, auxv_size and exe_fd (u32 each).
    let words = [
        f.start_code,
        f.end_code,
        f.start_data,
        f.end_data,
        f.start_brk,
        f.brk,
        f.start_stack,
        f.arg_start,
        f.arg_end,
        f.env_start,
        f.env_end,
        auxv,
        (f.auxv.len() as u64) | (u64::from(exe_arg) << 32),
    ];
    let map = r.put_u64s(2, &words)?;
    // One stop; should the prctl fail, the restore fails and the process
    // dies with the fd.
    r.call_many(&[
        batch::Call {
            name: "prctl(PR_SET_MM_MAP)",
            nr: libc::SYS_prctl,
            args: [
                PR_SET_MM,
                PR_SET_MM_MAP,
                map,
                (words.len() * 8) as u64,
                0,
                0,
            ],
        },
        batch::Call::close("close (executable)", exe_fd),
    ])?;
    Ok(())
}

/// Opens the executable inside the process and checks it, returning the
/// very fd that was checked (a second lookup by path could meet a swapped
/// directory). The process is still root here, so a link followed or an
/// unchecked file would give `/proc/PID/exe`, readable and executable
/// through the link, a file behind another user's 0700 directory. No
/// symbolic link is followed; the file must be the one a mapping of the
/// same path recorded (identity and contents), or, when no mapping names
/// it, reachable by the process's own user (looked up again with its fs
/// ids, `O_PATH`, and the same inode).
fn open_exe(r: &Remote<'_>, exe: &Exe<'_>, checks: &mut FileChecks) -> Result<i32> {
    let pid = r.t.pid();
    let refused = |what: String| RestoreError::File {
        pid,
        path: exe.path.into(),
        what: format!("executable (/proc/{pid}/exe): {what}"),
    };
    let fd = r
        .open_no_symlinks(exe.path, libc::O_RDONLY | libc::O_CLOEXEC)
        .map_err(|e| refused(super::fd::reg::reopen_failure(e, "", None)))?;
    let mapped = exe.mm.vmas.iter().find(|v| {
        v.path == exe.path
            && v.file.is_some()
            && matches!(
                VmaKind::try_from(v.kind),
                Ok(VmaKind::FilePrivate | VmaKind::FileShared)
            )
    });
    let checked = match mapped {
        Some(v) => check_file(pid, v, fd, checks),
        None => reachable_by_user(r, exe, fd).map_err(|e| match e {
            ExeCheck::Failed(e) => e,
            ExeCheck::Refused(what) => refused(what),
        }),
    };
    if let Err(e) = checked {
        r.close(fd)?;
        return Err(e);
    }
    Ok(fd)
}

/// Why an executable no mapping names was not accepted.
enum ExeCheck {
    /// A remote call failed.
    Failed(RestoreError),
    /// The user cannot reach it, or the path now names another file.
    Refused(String),
}

impl From<RestoreError> for ExeCheck {
    fn from(e: RestoreError) -> Self {
        ExeCheck::Failed(e)
    }
}

/// Checks `fd` (the executable, opened as root) is what the process's own
/// user finds at the same path with no link followed.
fn reachable_by_user(r: &Remote<'_>, exe: &Exe<'_>, fd: i32) -> std::result::Result<(), ExeCheck> {
    let pid = r.t.pid();
    let identity = crate::fd::creds::FsIdentity::of(exe.creds);
    let looked_up = crate::fd::creds::as_user(identity.as_ref(), r, || {
        r.open_no_symlinks(exe.path, libc::O_PATH | libc::O_CLOEXEC)
    })?;
    let user_fd = looked_up.map_err(|e| {
        ExeCheck::Refused(crate::fd::reg::reopen_failure(
            e,
            "",
            identity.as_ref().map(|i| i.uid()),
        ))
    })?;
    let inode =
        |n: i32| std::fs::metadata(format!("/proc/{pid}/fd/{n}")).map(|m| (m.dev(), m.ino()));
    let same = matches!((inode(fd), inode(user_fd)), (Ok(a), Ok(b)) if a == b);
    r.close(user_fd).map_err(RestoreError::from)?;
    if same {
        Ok(())
    } else {
        Err(ExeCheck::Refused(
            "changed while it was looked up".to_string(),
        ))
    }
}

/// Checks the file opened (inside the process, as `fd`) for mapping `v` is
/// the one the process had mapped: same contents for a private mapping
/// (hashed at dump time), same file unmodified for a shared one.
fn check_file(pid: i32, v: &Vma, fd: i32, checks: &mut FileChecks) -> Result<()> {
    let Some(id) = &v.file else {
        return Err(invalid(pid, v, "file mapping without file identity"));
    };
    let contents = if id.sha256.is_empty() {
        Contents::Unmodified {
            size: id.size,
            mtime_ns: id.mtime_ns,
            ctime_ns: None,
        }
    } else {
        Contents::Sha256 {
            size: id.size,
            digest: &id.sha256,
        }
    };
    let want = Expected {
        mode: id.mode,
        uid: id.uid,
        gid: id.gid,
        inode: Inode {
            dev: id.dev,
            ino: id.ino,
        },
        contents,
    };
    let opened = std::path::PathBuf::from(format!("/proc/{pid}/fd/{fd}"));
    checks
        .verify(&opened, &want)
        .map_err(|m| changed(pid, v, format!("mapped file {}", m.0)))
}

fn changed(pid: i32, v: &Vma, what: String) -> RestoreError {
    RestoreError::Changed {
        pid,
        at: FileUse::Mapping {
            start: v.start,
            end: v.end,
        },
        path: v.path.clone(),
        what,
    }
}

fn invalid(pid: i32, v: &Vma, what: &str) -> RestoreError {
    RestoreError::vma(pid, v, what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gap_avoids_everything() {
        let busy = [
            (HIGHEST - (1 << 30), HIGHEST),
            (0x5555_0000_0000, 0x5555_0010_0000),
        ];
        let g = find_gap(&busy, 1 << 20).unwrap();
        for (s, e) in busy {
            assert!(g + (1 << 20) <= s || g >= e);
        }
        assert!(g >= LOWEST);
    }

    #[test]
    fn guard_pages_must_lie_inside_their_mapping_apart_from_saved_pages() {
        use ckpt_image::mm::{PageRange, PageSpan};
        let with = |kind: VmaKind, guards: Vec<PageSpan>| Mm {
            vmas: vec![Vma {
                start: 0x10_000,
                end: 0x18_000,
                kind: kind as i32,
                pages: vec![PageRange {
                    addr: 0x10_000,
                    nr_pages: 2,
                    offset: 0,
                }],
                guards,
                ..Default::default()
            }],
            ..Default::default()
        };
        let span = |addr, nr_pages| PageSpan { addr, nr_pages };
        let ok = |mm: Mm| validate_guards(&mm).is_ok();
        assert!(ok(with(
            VmaKind::Anon,
            vec![span(0x12_000, 1), span(0x17_000, 1)]
        )));
        // Over a saved page, past the end, unordered, unaligned, empty.
        assert!(!ok(with(VmaKind::Anon, vec![span(0x11_000, 1)])));
        assert!(!ok(with(VmaKind::Anon, vec![span(0x17_000, 2)])));
        assert!(!ok(with(
            VmaKind::Anon,
            vec![span(0x16_000, 1), span(0x13_000, 1)]
        )));
        assert!(!ok(with(VmaKind::Anon, vec![span(0x12_800, 1)])));
        assert!(!ok(with(VmaKind::Anon, vec![span(0x12_000, 0)])));
        assert!(!ok(with(VmaKind::Anon, vec![span(!0xfff, 2)])));
        // Only in private mappings the restore makes itself.
        assert!(!ok(with(VmaKind::FileShared, vec![span(0x12_000, 1)])));
    }

    #[test]
    fn saved_vdso_code_is_checked_before_use() {
        let code = vec![0xccu8; 8192];
        let vma = Vma {
            start: 0x7fff_0000_0000,
            end: 0x7fff_0000_2000,
            kind: VmaKind::Vdso as i32,
            ..Default::default()
        };
        let info = VdsoInfo {
            vdso_len: 8192,
            vdso_crc32c: crc32c::crc32c(&code),
            vdso_code: code.clone(),
            ..Default::default()
        };
        let mm = |vdso: VdsoInfo, vmas: Vec<Vma>| Mm {
            vmas,
            vdso: Some(vdso),
            ..Default::default()
        };
        assert_eq!(validate_vdso(&mm(info.clone(), vec![vma.clone()])), Ok(()));
        // An image from before the proxy: no code, nothing more to check.
        let old = VdsoInfo {
            vdso_code: Vec::new(),
            ..info.clone()
        };
        assert_eq!(validate_vdso(&mm(old, Vec::new())), Ok(()));
        let huge = VdsoInfo {
            vdso_len: ckpt_image::mm::MAX_VDSO_LEN + 4096,
            ..info.clone()
        };
        assert!(validate_vdso(&mm(huge, vec![vma.clone()])).is_err());
        let mut flipped = info.clone();
        flipped.vdso_code[100] ^= 1;
        assert!(validate_vdso(&mm(flipped, vec![vma.clone()])).is_err());
        let short = VdsoInfo {
            vdso_code: code[..4096].to_vec(),
            ..info.clone()
        };
        assert!(validate_vdso(&mm(short, vec![vma.clone()])).is_err());
        // The code must fit the dumped [vdso] mapping it goes back to.
        assert!(validate_vdso(&mm(info.clone(), Vec::new())).is_err());
        let small = Vma {
            end: vma.start + 4096,
            ..vma
        };
        assert!(validate_vdso(&mm(info, vec![small])).is_err());
    }
}
