//! Rebuilding the address space: clear out what the child inherited from
//! the restorer, move the kernel's vDSO/vvar to where the dumped process had
//! them, recreate every VMA at its address with its protections and flags
//! (the saved pages are copied in by `pages`), and set the kernel's mm
//! fields.

use ckpt_image::mm::{Mm, VdsoInfo, Vma, VmaKind, vma_flags};
use ckpt_image::task::MmFields;
use std::os::unix::fs::MetadataExt;

use crate::error::{FileUse, RestoreError, Result};
use crate::fd::identity::{Contents, Expected, FileChecks, Inode};
use crate::fd::take_from;
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

/// Checks the kernel here provides the vDSO the process was using.
pub fn check_vdso(pid: i32, r: &Remote<'_>, child: &[MapLine], want: &VdsoInfo) -> Result<()> {
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
    if code.len() as u64 != want.vdso_len || crc32c::crc32c(&code) != want.vdso_crc32c {
        return Err(incompatible(format!(
            "this kernel's vDSO ({} bytes) differs from the dumped one ({} bytes)",
            code.len(),
            want.vdso_len
        )));
    }
    if len(VmaKind::Vvar) != want.vvar_len || len(VmaKind::VvarVclock) != want.vvar_vclock_len {
        return Err(incompatible("the vvar layout differs".into()));
    }
    Ok(())
}

/// Removes every mapping the child inherited except the scratch area and
/// the kernel's special mappings, then moves those to the dumped addresses.
pub fn clear_and_move_specials(r: &Remote<'_>, child: &[MapLine], mm: &Mm) -> Result<()> {
    let scratch = (r.base, r.base + SCRATCH_LEN);
    for m in child {
        if special_kind(&m.path).is_some() || (m.start, m.end) == scratch {
            continue;
        }
        crate::inherit::unmap_except_inherited(r, mm, m.start, m.end)?;
    }
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
    let pid = r.t.pid();
    // Anonymous VMAs (most of a large map) are mapped in batches, many
    // syscalls per stop; a VMA with a file flushes the batch first, so
    // every mapping is still made in the image's order.
    let mut batch = AnonBatch::default();
    let apart = Apart::plan(r, mm)?;
    for (i, v) in mm.vmas.iter().enumerate() {
        let kind = VmaKind::try_from(v.kind).map_err(|_| invalid(pid, v, "unknown kind"))?;
        if kind.is_special() || v.inherited {
            continue;
        }
        let mut flags = libc::MAP_FIXED;
        let p = v.prot as i32;
        if kind == VmaKind::Anon {
            let flags = map_flags(v, flags | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
            match apart.how(mm, i) {
                Placement::Plain => batch.push(v, flags),
                Placement::OwnAnonVma { through } => batch.push_apart(v, flags, through),
            }
            continue;
        }
        batch.flush(r)?;
        let fd: i64 = match kind {
            VmaKind::Shmem | VmaKind::ShmemPrivate => {
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
                i64::from(take_from(r, std::process::id() as i32, mine)?)
            }
            VmaKind::FilePrivate | VmaKind::FileShared => {
                let shared = kind == VmaKind::FileShared;
                let writable = shared && v.flags & vma_flags::MAYWRITE != 0;
                flags |= if shared {
                    libc::MAP_SHARED
                } else {
                    libc::MAP_PRIVATE
                };
                let mode = if writable {
                    libc::O_RDWR
                } else {
                    libc::O_RDONLY
                };
                // /proc resolved the dumped path: a symbolic link at its
                // end was put there since.
                let opened = r
                    .open(&v.path, mode | libc::O_CLOEXEC | libc::O_NOFOLLOW, 0)
                    .map_err(|e| changed(pid, v, format!("cannot reopen: {e}")))?;
                if let Err(e) = check_file(pid, v, opened, checks) {
                    r.close(opened)?;
                    return Err(e);
                }
                i64::from(opened)
            }
            VmaKind::SysvShm => {
                crate::ipc::attach(r, v)?;
                continue;
            }
            _ => unreachable!("special kinds skipped and anonymous ones batched above"),
        };
        let flags = map_flags(v, flags);
        let got = r.call(
            "mmap",
            libc::SYS_mmap,
            [
                v.start,
                v.len(),
                p as u64,
                flags as u64,
                fd as u64,
                v.file_offset,
            ],
        );
        if fd >= 0 {
            r.close(fd as i32)?;
        }
        if got? != v.start {
            return Err(invalid(pid, v, "mapped at a different address"));
        }
        for call in advice(v) {
            r.call(call.name, call.nr, call.args)?;
        }
    }
    batch.flush(r)
}

/// `flags` plus what the VMA's own flags ask of `mmap`.
fn map_flags(v: &Vma, flags: i32) -> i32 {
    if v.flags & vma_flags::GROWSDOWN != 0 {
        flags | libc::MAP_GROWSDOWN
    } else {
        flags
    }
}

/// The `madvise` calls that give `v` its advice flags back.
fn advice(v: &Vma) -> impl Iterator<Item = batch::Call> + '_ {
    [
        (vma_flags::DONTFORK, libc::MADV_DONTFORK),
        (vma_flags::DONTDUMP, libc::MADV_DONTDUMP),
    ]
    .into_iter()
    .filter(move |(flag, _)| v.flags & flag != 0)
    .map(move |(_, advice)| batch::Call {
        name: "madvise",
        nr: libc::SYS_madvise,
        args: [v.start, v.len(), advice as u64, 0, 0, 0],
    })
}

/// Flags of an anonymous VMA that the restore gives it and that decide,
/// with the protection, whether the kernel merges two neighbours.
const MERGE_FLAGS: u32 = vma_flags::GROWSDOWN | vma_flags::DONTFORK | vma_flags::DONTDUMP;

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

/// Anonymous mappings waiting to be made in one batch of remote syscalls.
#[derive(Default)]
struct AnonBatch<'v> {
    calls: Vec<batch::Call>,
    /// Index in `calls` of each VMA's `mmap`, to check where it landed.
    maps: Vec<(usize, &'v Vma)>,
}

impl<'v> AnonBatch<'v> {
    fn push(&mut self, v: &'v Vma, flags: i32) {
        self.maps.push((self.calls.len(), v));
        self.calls.push(batch::Call {
            name: "mmap",
            nr: libc::SYS_mmap,
            args: [
                v.start,
                v.len(),
                u64::from(v.prot),
                flags as u64,
                u64::MAX,
                0,
            ],
        });
        self.calls.extend(advice(v));
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

/// Sets start_code…env_end, brk, auxv and /proc/PID/exe with one
/// `prctl(PR_SET_MM, PR_SET_MM_MAP)` (no CAP_SYS_RESOURCE needed).
pub fn set_mm_fields(r: &Remote<'_>, f: &MmFields, exe: &str) -> Result<()> {
    const PR_SET_MM: u64 = 35;
    const PR_SET_MM_MAP: u64 = 14;
    let auxv = r.put(1, &f.auxv)?;
    let exe_fd = r.open(exe, libc::O_RDONLY | libc::O_CLOEXEC, 0)?;
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
    let res = r.call(
        "prctl(PR_SET_MM_MAP)",
        libc::SYS_prctl,
        [
            PR_SET_MM,
            PR_SET_MM_MAP,
            map,
            (words.len() * 8) as u64,
            0,
            0,
        ],
    );
    r.close(exe_fd)?;
    res?;
    Ok(())
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

pub fn invalid(pid: i32, v: &Vma, what: &str) -> RestoreError {
    RestoreError::Image(ckpt_image::ImageError::Invalid {
        path: ckpt_image::mm_name(pid).into(),
        what: format!("VMA {:#x}-{:#x}: {what}", v.start, v.end),
    })
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
}
