//! Files on a tmpfs mapped shared (POSIX shm in /dev/shm, multiprocessing
//! semaphores, files in a tmpfs /run or /tmp): they live only in RAM, so
//! after a reboot or on another node they are gone.
//!
//! The process that maps one first, holding its dumped filesystem identity,
//! opens it at its path (`O_NOFOLLOW`). If it is there (same node, the job
//! was killed but the file kept), it must be the same file as any reopened
//! file (type, owner, group, mode; inode on the dumping host); its contents
//! are then set to the image's unless they are already the same (the image
//! is the job's state at the checkpoint; leaving equal contents alone keeps
//! its times for an fd reopening it). If it is gone, it is recreated by the
//! create rules (`fd/create.rs`: only for its own user; the process makes
//! it with `O_EXCL` and mode 0600, the restorer gives it owner, contents
//! and, last, mode).

use std::fs::File;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;

use ckpt_image::ImageDir;
use ckpt_image::mm::FileId;
use ckpt_image::shmem::ShmemObject;
use ckpt_parasite::ParasiteError;
use nix::errno::Errno;

use super::{AtPath, Made, write_data};
use crate::error::{RestoreError, Result};
use crate::fd::create;
use crate::fd::creds::FsIdentity;
use crate::identity::{Contents, Expected, Inode, PERMISSION_BITS};

/// Bytes compared at a time.
const CHUNK: usize = 1 << 20;

/// Builds errors about the file at `path`, restored for process `pid`.
fn file_error(pid: i32, path: &str) -> impl Fn(String) -> RestoreError + '_ {
    move |what| RestoreError::File {
        pid,
        path: path.to_owned(),
        what,
    }
}

/// The restorer's fds of tmpfs file `o`, found or recreated at its path.
pub(super) fn open_or_create(
    images: &ImageDir,
    o: &ShmemObject,
    mut at: AtPath<'_, '_>,
) -> Result<Made> {
    let r = at.r;
    let pid = r.t.pid();
    let err = file_error(pid, &o.name);
    let fs = FsIdentity::of(at.creds)
        .ok_or_else(|| err("no filesystem identity to open it with".into()))?;
    let dumped = at
        .file
        .ok_or_else(|| err("no identity recorded for it".into()))?;
    let rw = fs.while_assumed(r, || find_or_create(images, o, &mut at, &fs, dumped))??;
    let ro = File::open(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&rw)
    ))
    .map_err(|e| err(format!("cannot reopen read-only: {e}")))?;
    Ok(Made { rw, ro })
}

fn find_or_create(
    images: &ImageDir,
    o: &ShmemObject,
    at: &mut AtPath<'_, '_>,
    fs: &FsIdentity,
    dumped: &FileId,
) -> Result<File> {
    let r = at.r;
    let pid = r.t.pid();
    let err = file_error(pid, &o.name);
    let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // Read-write if the user may write it, else read-only: the restorer
    // never writes a file for a user who could not.
    let opened = match r.open(&o.name, libc::O_RDWR | flags, 0) {
        Err(ParasiteError::RemoteOpen {
            errno: Errno::EACCES | Errno::EROFS,
            ..
        }) => r
            .open(&o.name, libc::O_RDONLY | flags, 0)
            .map(|fd| (fd, false)),
        other => other.map(|fd| (fd, true)),
    };
    match opened {
        Ok((fd, writable)) => {
            let proc = format!("/proc/{pid}/fd/{fd}");
            let want = Expected {
                mode: dumped.mode,
                uid: dumped.uid,
                gid: dumped.gid,
                inode: Inode {
                    dev: dumped.dev,
                    ino: dumped.ino,
                },
                contents: Contents::Any,
            };
            let checked = at.checks.verify(Path::new(&proc), &want);
            let here = std::fs::OpenOptions::new()
                .read(true)
                .write(writable)
                .open(&proc);
            r.close(fd)?;
            checked.map_err(|m| {
                err(format!(
                    "the tmpfs file there is not the one mapped: {}",
                    m.0
                ))
            })?;
            let f = here.map_err(|e| err(format!("cannot open it: {e}")))?;
            if !same_contents(images, o, &f)? {
                if !writable {
                    return Err(err(
                        "its contents differ from the checkpoint's and the process may not write it"
                            .into(),
                    ));
                }
                log::info!("pid {pid}: {}: giving it the checkpoint's contents", o.name);
                f.set_len(0)
                    .and_then(|()| f.set_len(o.size))
                    .map_err(|e| err(format!("cannot truncate: {e}")))?;
                write_data(images, o, &f)?;
            }
            Ok(f)
        }
        Err(ParasiteError::RemoteOpen {
            errno: Errno::ENOENT,
            ..
        }) => {
            let own = create::Ownership {
                uid: o.uid,
                gid: o.gid,
                mode: dumped.mode,
            };
            create::check_owner(Some(fs), pid, &o.name, &own)?;
            let created = create::create_exclusive(r, &o.name)?;
            let filled = if created.path == o.name {
                created.open_here(fs.uid()).and_then(|f| {
                    std::os::unix::fs::fchown(&f, Some(o.uid), Some(o.gid))
                        .and_then(|()| f.set_len(o.size))
                        .map_err(|e| err(format!("cannot fill the recreated file: {e}")))?;
                    write_data(images, o, &f)?;
                    f.set_permissions(std::fs::Permissions::from_mode(
                        dumped.mode & PERMISSION_BITS,
                    ))
                    .map_err(|e| err(format!("cannot set its mode: {e}")))?;
                    Ok(f)
                })
            } else {
                Err(err("its name was taken while it was recreated".into()))
            };
            if filled.is_err() {
                let _ = created.discard(r);
            }
            created.close(r)?;
            filled
        }
        Err(e) => Err(err(format!("cannot open it: {e}"))),
    }
}

/// The file already holds exactly the saved contents (size, data runs,
/// zeros elsewhere).
fn same_contents(images: &ImageDir, o: &ShmemObject, f: &File) -> Result<bool> {
    let err = |e: std::io::Error| {
        RestoreError::os(std::process::id() as i32, format!("{}: compare", o.name), e)
    };
    if f.metadata().map_err(err)?.len() != o.size {
        return Ok(false);
    }
    let name = ckpt_image::shmem_data_name(o.id);
    let data_file = images.open_pages(&name)?;
    let data = crate::sys::map_readonly(&data_file).map_err(|e| {
        RestoreError::from(ckpt_image::ImageError::io(
            images.path().join(&name),
            "mmap",
            e,
        ))
    })?;
    let mut buf = vec![0u8; CHUNK];
    let mut off = 0u64;
    let mut at = 0usize;
    let mut runs = o.data.iter().peekable();
    while off < o.size {
        // The next piece: inside a run (saved bytes) or before it (zeros).
        let (len, saved) = match runs.peek() {
            Some(r) if off >= r.offset => {
                let left = r.offset + r.len - off;
                (left.min(CHUNK as u64) as usize, true)
            }
            Some(r) => ((r.offset - off).min(CHUNK as u64) as usize, false),
            None => ((o.size - off).min(CHUNK as u64) as usize, false),
        };
        f.read_exact_at(&mut buf[..len], off).map_err(err)?;
        let same = if saved {
            let s = data.get(at..at + len).is_some_and(|d| d == &buf[..len]);
            at += len;
            s
        } else {
            buf[..len].iter().all(|b| *b == 0)
        };
        if !same {
            return Ok(false);
        }
        off += len as u64;
        if let Some(r) = runs.peek()
            && off >= r.offset + r.len
        {
            runs.next();
        }
    }
    Ok(true)
}
