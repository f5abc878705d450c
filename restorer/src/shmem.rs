//! Shared memory objects: the restorer creates each object of `shmem.img`
//! once, the first time a VMA or memfd fd needs it (shared anonymous memory
//! with a shared `mmap` of its own, a memfd or a deleted file's bytes with
//! `memfd_create`, a tmpfs file at its path: `tmpfs`), fills in its saved
//! data, and every process maps it
//! from an fd taken from the restorer (`pidfd_getfd`, run inside it), so
//! all mappers share one object again and no memory is duplicated. Seals
//! are added once every process is rebuilt. The restorer's fds close when
//! the restore ends; the mappings keep the objects alive.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, PermissionsExt};

use ckpt_image::mm::{FileId, Vma};
use ckpt_image::shmem::{ShmemKind, ShmemObject, ShmemObjects};
use ckpt_image::task::Creds;
use ckpt_image::{ImageDir, ImageError, ImageKind};
use ckpt_parasite::remote::Remote;

use crate::error::{RestoreError, Result};
use crate::identity::FileChecks;
use crate::sys;

mod tmpfs;

/// The restorer's own fds of one object.
struct Made {
    /// Opened read-write: shared mappings that may be made writable.
    rw: File,
    /// Opened read-only: private and read-only shared mappings (so a
    /// write-sealed memfd can still be sealed and mapped).
    ro: File,
}

/// Every object of the checkpoint and those created so far.
#[derive(Default)]
pub struct Objects {
    list: ShmemObjects,
    made: HashMap<u64, Made>,
}

fn invalid(images: &ImageDir, what: String) -> RestoreError {
    RestoreError::Image(ImageError::Invalid {
        path: images.path().join(ckpt_image::SHMEM_NAME),
        what,
    })
}

/// Reads and checks `shmem.img` (absent when the tree mapped no shared
/// memory object): ids unique and sorted, kinds and names valid, data
/// runs inside each object and filling its data file.
pub fn load(images: &ImageDir) -> Result<Objects> {
    let listed = images
        .manifest()
        .files
        .iter()
        .any(|d| d.name == ckpt_image::SHMEM_NAME);
    if !listed {
        return Ok(Objects::default());
    }
    let list: ShmemObjects = images.read_meta(ckpt_image::SHMEM_NAME, ImageKind::Shmem)?;
    if list.objects.windows(2).any(|w| w[0].id >= w[1].id) {
        return Err(invalid(
            images,
            "object ids are not unique and sorted".into(),
        ));
    }
    for o in &list.objects {
        let kind = ShmemKind::try_from(o.kind)
            .map_err(|_| invalid(images, format!("object {}: unknown kind {}", o.id, o.kind)))?;
        if !o.name_is_valid() {
            return Err(invalid(
                images,
                format!("object {}: bad name for a {kind:?} object", o.id),
            ));
        }
        let data_len = images.digest(&ckpt_image::shmem_data_name(o.id))?.size;
        o.check_runs(data_len)
            .map_err(|e| invalid(images, e.to_string()))?;
    }
    Ok(Objects {
        list,
        made: HashMap::new(),
    })
}

impl Objects {
    /// Checks that a VMA of process `pid` that maps a shared memory object
    /// names one of the checkpoint's, in this format.
    pub fn check_vma(&self, images: &ImageDir, pid: i32, v: &Vma) -> Result<()> {
        let bad = |what: &str| {
            RestoreError::Image(ImageError::Invalid {
                path: images.path().join(ckpt_image::mm_name(pid)),
                what: format!("VMA {:#x}-{:#x}: {what}", v.start, v.end),
            })
        };
        if v.shmem_owner.is_some() {
            return Err(bad(
                "shared memory linked the format 2 way (written by an older ckpt)",
            ));
        }
        if self.list.get(v.shmem_id).is_none() {
            return Err(bad(&format!("no shared memory object {}", v.shmem_id)));
        }
        Ok(())
    }

    /// The checkpoint has object `id`.
    pub fn has(&self, id: u64) -> bool {
        self.list.get(id).is_some()
    }

    /// The restorer's fd of object `id` (read-write or read-only), creating
    /// and filling the object the first time. A tmpfs file is reopened or
    /// recreated at its path by the process of `at` (a mapping of it).
    pub fn fd(
        &mut self,
        images: &ImageDir,
        id: u64,
        writable: bool,
        at: Option<AtPath<'_, '_>>,
    ) -> Result<i32> {
        if !self.made.contains_key(&id) {
            let o = self
                .list
                .get(id)
                .ok_or_else(|| invalid(images, format!("no object {id}")))?;
            let made = if o.kind == ShmemKind::TmpfsFile as i32 {
                let at = at.ok_or_else(|| {
                    invalid(
                        images,
                        format!("object {id}: a tmpfs file held only by an fd"),
                    )
                })?;
                tmpfs::open_or_create(images, o, at)?
            } else {
                create(images, o)?
            };
            self.made.insert(id, made);
        }
        let m = &self.made[&id];
        Ok(if writable {
            m.rw.as_raw_fd()
        } else {
            m.ro.as_raw_fd()
        })
    }

    /// Adds every created memfd's seals, once every process maps what it
    /// mapped (a write seal would forbid the writable mappings of others).
    pub fn seal_all(&self) -> Result<()> {
        for o in self.list.objects.iter().filter(|o| o.seals != 0) {
            if o.kind != ShmemKind::Memfd as i32 {
                continue;
            }
            if let Some(m) = self.made.get(&o.id) {
                sys::add_seals(m.rw.as_raw_fd(), o.seals).map_err(|e| {
                    RestoreError::os(me(), format!("F_ADD_SEALS on memfd {:?}", o.name), e)
                })?;
            }
        }
        Ok(())
    }
}

fn me() -> i32 {
    std::process::id() as i32
}

/// What a tmpfs file object needs to be found or recreated at its path: the
/// process that maps it first (its filesystem identity opens and creates
/// the file), and what the file was.
pub struct AtPath<'r, 'c> {
    /// The process.
    pub r: &'r Remote<'r>,
    /// Its dumped credentials (fsuid, fsgid, groups).
    pub creds: Option<&'c Creds>,
    /// The file as the dump saw it.
    pub file: Option<&'c FileId>,
    /// The identity checks.
    pub checks: &'c mut FileChecks,
}

/// Writes the saved data of `o` into `f` at its offsets.
fn write_data(images: &ImageDir, o: &ShmemObject, f: &File) -> Result<()> {
    let name = ckpt_image::shmem_data_name(o.id);
    let data_file = images.open_pages(&name)?;
    let data = sys::map_readonly(&data_file)
        .map_err(|e| RestoreError::from(ImageError::io(images.path().join(&name), "mmap", e)))?;
    let mut at = 0usize;
    for r in &o.data {
        // In range: `load` checked the runs fill the data file exactly.
        let len = r.len as usize;
        let bytes = data
            .get(at..at + len)
            .ok_or_else(|| invalid(images, format!("object {}: data file too short", o.id)))?;
        f.write_all_at(bytes, r.offset).map_err(|e| {
            RestoreError::os(
                me(),
                format!("shared memory object {}: write data", o.id),
                e,
            )
        })?;
        at += len;
    }
    Ok(())
}

/// Permission bits a memfd gets (never setuid or setgid, which a memfd
/// never needs).
const MEMFD_MODE_BITS: u32 = 0o777;

/// Creates object `o` in the restorer with its size, owner, data and mode
/// (mode last, so it is never open to others on the way).
fn create(images: &ImageDir, o: &ShmemObject) -> Result<Made> {
    let err = |what: &str, e: std::io::Error| {
        RestoreError::os(
            me(),
            format!("shared memory object {} ({:?}): {what}", o.id, o.name),
            e,
        )
    };
    let kind = ShmemKind::try_from(o.kind).unwrap_or(ShmemKind::Anon);
    let rw = match kind {
        ShmemKind::Anon => sys::shared_anon(o.size).map_err(|e| err("shared mmap", e))?,
        ShmemKind::TmpfsFile => {
            return Err(invalid(
                images,
                format!("object {}: a tmpfs file is opened at its path", o.id),
            ));
        }
        ShmemKind::Memfd | ShmemKind::DeletedFile => {
            let f = sys::memfd(o.memfd_name()).map_err(|e| err("memfd_create", e))?;
            f.set_len(o.size).map_err(|e| err("ftruncate", e))?;
            std::os::unix::fs::fchown(&f, Some(o.uid), Some(o.gid))
                .map_err(|e| err("fchown", e))?;
            f
        }
    };
    write_data(images, o, &rw)?;
    if kind != ShmemKind::Anon {
        rw.set_permissions(std::fs::Permissions::from_mode(o.mode & MEMFD_MODE_BITS))
            .map_err(|e| err("fchmod", e))?;
    }
    let ro = File::open(format!("/proc/self/fd/{}", rw.as_raw_fd()))
        .map_err(|e| err("reopen read-only", e))?;
    Ok(Made { rw, ro })
}
