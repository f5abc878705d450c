//! Shared memory objects: every object the tree maps shared or that is
//! gone from the filesystem (shared anonymous memory, memfds, deleted
//! files, files on a tmpfs mapped shared) is found through
//! `/proc/PID/map_files` (or `/proc/PID/fd` for a memfd), told apart by
//! device and inode, and saved once (`shmem.img`, data in `shmem-ID.img`) whatever
//! processes and VMAs map it and at whatever offsets; each VMA records the
//! object's id and its offset in it.
//!
//! Only the parts holding data are saved, found with SEEK_DATA/SEEK_HOLE
//! on the object itself: pages another process touched are not in this
//! process's page tables, but they are in the object.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::PathBuf;

use ckpt_image::fd::file::Kind;
use ckpt_image::mm::{Vma, VmaKind};
use ckpt_image::shmem::{ShmemKind, ShmemObject, ShmemObjects, ShmemRun};
use ckpt_image::{ImageKind, ImageWriter, PAGE_SIZE};

use crate::error::{Blocker, DumpError, Result};
use crate::fd::TreeFiles;
use crate::mm::{DELETED_SUFFIX, MEMFD_PREFIX};
use crate::procfile;
use crate::sys;

/// How `/proc/PID/maps` names shared anonymous memory.
const SHARED_ANON_PATH: &str = "/dev/zero (deleted)";
/// Bytes read from an object at a time while writing its data.
const COPY_CHUNK: usize = 1 << 20;

/// One object, with the file it is read through at write time.
struct Entry {
    dev: u64,
    ino: u64,
    object: ShmemObject,
    file: File,
    link: PathBuf,
    pid: i32,
}

/// Every shared memory object of the tree, in the order first seen (tree
/// order, then address order); ids are 1, 2, …
#[derive(Default)]
pub struct Objects(Vec<Entry>);

impl Objects {
    /// Gives every VMA of `vmas` (of process `pid`) that maps a shared
    /// memory object the id of that object, collecting the object the first
    /// time it is seen.
    pub fn link_vmas(&mut self, pid: i32, vmas: &mut [Vma]) -> Result<()> {
        for v in vmas.iter_mut() {
            let kind = VmaKind::try_from(v.kind).unwrap_or(VmaKind::Anon);
            if !kind.maps_shmem() {
                continue;
            }
            let link = procfile::path(pid, &format!("map_files/{:x}-{:x}", v.start, v.end));
            let path = if v.path.is_empty() {
                SHARED_ANON_PATH
            } else {
                &v.path
            };
            v.shmem_id = self.object(pid, link, path)?;
        }
        Ok(())
    }

    /// Gives every memfd open file of the tree the id of its object (the
    /// one its mappings have, if any), through the first fd holding it.
    /// An unlinked file held by an fd (saved as a ghost) that is also
    /// mapped, shared or privately, is saved as the object its mappings
    /// have instead, and
    /// restored as the memfd that object becomes (a deleted file can be
    /// opened by no one else, so only its name in `/proc/PID/fd` changes),
    /// so that writes through one show in the other, as before: UCX's
    /// shared-memory transport, under MPICH or Open MPI, keeps such files.
    /// Any other shared object behind a ghost is refused: restore would
    /// make the ghost and the mapping two files.
    pub fn link_files(&mut self, tree: &mut TreeFiles) -> Result<()> {
        let holders: Vec<_> = tree.holders().collect();
        let mut blocked = Vec::new();
        let mut as_memfd: Vec<(u64, u64, String)> = Vec::new();
        for f in &tree.files.files {
            let Some(Kind::Reg(reg)) = &f.kind else {
                continue;
            };
            let Some(ghost) = &reg.ghost else {
                continue;
            };
            let Some(h) = holders.iter().find(|h| h.file_id == f.id) else {
                continue;
            };
            let link = procfile::path(h.pid, &format!("fd/{}", h.fd));
            let st = std::fs::metadata(&link).map_err(|e| procfile::proc_err(h.pid, link, e))?;
            // Mapped privately only, it is one file all the same: pages the
            // mapping never wrote show what is written through the fd.
            let Some(e) = self
                .0
                .iter()
                .find(|e| (e.dev, e.ino) == (st.dev(), st.ino()))
            else {
                continue;
            };
            if e.object.kind == ShmemKind::DeletedFile as i32 {
                as_memfd.push((f.id, e.object.id, ghost.clone()));
            } else {
                blocked.push(Blocker {
                    pid: h.pid,
                    what: format!(
                        "fd {}: deleted file {} also mapped (the fd and the mapping would come back as two files)",
                        h.fd, reg.path
                    ),
                });
            }
        }
        if !blocked.is_empty() {
            return Err(DumpError::Blocked { blockers: blocked });
        }
        for (file_id, shmem_id, ghost) in as_memfd {
            // The object's data is saved once, with the object.
            tree.blobs.remove(&ghost);
            if let Some(f) = tree.files.files.iter_mut().find(|f| f.id == file_id) {
                f.kind = Some(Kind::Memfd(ckpt_image::fd::memfd::MemfdFile { shmem_id }));
            }
        }
        for f in tree.files.files.iter_mut() {
            let Some(Kind::Memfd(m)) = &mut f.kind else {
                continue;
            };
            let Some(h) = holders.iter().find(|h| h.file_id == f.id) else {
                continue;
            };
            let name = format!("fd/{}", h.fd);
            let link = procfile::readlink(h.pid, &name)?;
            m.shmem_id = self.object(h.pid, procfile::path(h.pid, &name), &link)?;
        }
        Ok(())
    }

    /// The id of the object open as `link` (a `/proc` link to it), named
    /// `path` by `/proc/PID/maps`; collected if new.
    pub fn object(&mut self, pid: i32, link: PathBuf, path: &str) -> Result<u64> {
        let err = |link: &PathBuf, e| procfile::proc_err(pid, link.clone(), e);
        let st = std::fs::metadata(&link).map_err(|e| err(&link, e))?;
        if let Some(e) = self
            .0
            .iter()
            .find(|e| (e.dev, e.ino) == (st.dev(), st.ino()))
        {
            return Ok(e.object.id);
        }
        let (kind, name) = if path == SHARED_ANON_PATH {
            (ShmemKind::Anon, String::new())
        } else if !path.ends_with(DELETED_SUFFIX) {
            (ShmemKind::TmpfsFile, path.to_string())
        } else {
            let bare = path.strip_suffix(DELETED_SUFFIX).unwrap_or(path);
            match bare.strip_prefix(MEMFD_PREFIX) {
                Some(name) => (ShmemKind::Memfd, name.to_string()),
                None => (ShmemKind::DeletedFile, bare.to_string()),
            }
        };
        let file = File::open(&link).map_err(|e| err(&link, e))?;
        let seals = if kind == ShmemKind::Memfd {
            sys::memfd_seals(file.as_raw_fd()).map_err(|e| err(&link, e))?
        } else {
            0
        };
        let size = st.size();
        let data = data_runs(&file, size).map_err(|e| err(&link, e))?;
        let id = self.0.len() as u64 + 1;
        log::debug!(
            "pid {pid}: shared memory object {id} ({kind:?} {name:?}): {size} bytes, {} bytes of data",
            data.iter().map(|r| r.len).sum::<u64>()
        );
        self.0.push(Entry {
            dev: st.dev(),
            ino: st.ino(),
            object: ShmemObject {
                id,
                kind: kind as i32,
                size,
                name,
                seals,
                uid: st.uid(),
                gid: st.gid(),
                mode: st.mode() & MODE_BITS,
                data,
            },
            file,
            link,
            pid,
        });
        Ok(id)
    }

    /// Bytes of data all objects hold.
    pub fn data_bytes(&self) -> u64 {
        self.0
            .iter()
            .flat_map(|e| &e.object.data)
            .map(|r| r.len)
            .sum()
    }

    /// Writes `shmem-ID.img` for every object and `shmem.img` listing them
    /// (nothing when the tree maps no shared memory object).
    pub fn write(self, w: &mut ImageWriter) -> Result<()> {
        if self.0.is_empty() {
            return Ok(());
        }
        let mut buf = vec![0u8; COPY_CHUNK];
        let mut list = ShmemObjects::default();
        for e in self.0 {
            let pw = w.pages(&ckpt_image::shmem_data_name(e.object.id))?;
            let mut at = 0u64;
            for r in &e.object.data {
                let mut off = r.offset;
                while off < r.offset + r.len {
                    let n = (COPY_CHUNK as u64).min(r.offset + r.len - off) as usize;
                    e.file
                        .read_exact_at(&mut buf[..n], off)
                        .map_err(|s| procfile::proc_err(e.pid, e.link.clone(), s))?;
                    pw.write_at(at, &buf[..n])?;
                    at += n as u64;
                    off += n as u64;
                }
            }
            w.finish_pages(pw)?;
            list.objects.push(e.object);
        }
        w.write_meta(ckpt_image::SHMEM_NAME, ImageKind::Shmem, &list)?;
        Ok(())
    }
}

/// Permission bits of st_mode kept for an object (never setuid/setgid).
const MODE_BITS: u32 = 0o777;

/// The parts of an object of `size` bytes holding data, page aligned
/// (clipped to the size), from SEEK_DATA/SEEK_HOLE.
fn data_runs(f: &File, size: u64) -> std::io::Result<Vec<ShmemRun>> {
    let mut runs: Vec<ShmemRun> = Vec::new();
    let mut off = 0;
    while off < size {
        let Some(data) = sys::seek(f.as_raw_fd(), off, libc::SEEK_DATA)? else {
            break;
        };
        if data >= size {
            break;
        }
        let hole = sys::seek(f.as_raw_fd(), data, libc::SEEK_HOLE)?
            .unwrap_or(size)
            .min(size);
        let start = data & !(PAGE_SIZE - 1);
        let end = hole.next_multiple_of(PAGE_SIZE).min(size);
        match runs.last_mut() {
            Some(r) if r.offset + r.len >= start => r.len = end - r.offset,
            _ => runs.push(ShmemRun {
                offset: start,
                len: end - start,
            }),
        }
        off = end;
    }
    Ok(runs)
}
