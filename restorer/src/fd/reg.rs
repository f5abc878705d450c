//! Regular files and directories, reopened by path with their flags and
//! offset, by the process itself with its own filesystem identity, never
//! following a symbolic link in the last component, and checked to be the
//! file it had. An unlinked file is recreated from its ghost image with its
//! holes, owner, mode and times (see `create`), opened, and unlinked again; a removed
//! directory is made again empty, opened and removed again. A file whose
//! name was removed but which has other hard links is opened again by its
//! file handle (see `linked`).

use std::os::unix::io::AsRawFd;

use ckpt_image::fd::File;
use ckpt_image::fd::reg::RegFile;
use ckpt_parasite::ParasiteError;
use ckpt_parasite::remote::Remote;
use nix::errno::Errno;

use super::create::{self, Ownership};
use super::{Context, FileRestorer, reopen_flags, take_from};
use super::{linked, privileged};
use crate::error::{RestoreError, Result};
use crate::identity::{Contents, Expected, Inode};

/// Regular files and directories.
pub struct Reg;

impl FileRestorer for Reg {
    type Image = RegFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &RegFile,
        fd: i32,
    ) -> Result<i32> {
        let got = match &image.ghost {
            None if image.removed => recreate_removed_dir(cx, r, file, image)?,
            None => match &image.handle {
                Some(handle) => linked::reopen(cx, r, file, image, handle, fd)?,
                None => reopen(cx, r, file, image, fd)?,
            },
            Some(ghost) => recreate_ghost(cx, r, file, image, ghost)?,
        };
        // An O_PATH fd has no offset (lseek fails on it), and a removed
        // directory no entries to be at.
        if file.flags as i32 & libc::O_PATH != 0 || image.removed {
            return Ok(got);
        }
        // A file the user allowed to change is picked up at its end, where
        // an append-only log continues; its old offset means nothing now.
        let (pos, whence) = if image.ghost.is_none() && cx.may_change(&image.path) {
            (0, libc::SEEK_END)
        } else {
            (file.pos as u64, libc::SEEK_SET)
        };
        r.call(
            "lseek",
            libc::SYS_lseek,
            [got as u64, pos, whence as u64, 0, 0, 0],
        )?;
        Ok(got)
    }
}

/// Opens the dumped path inside the process and checks it is the same file.
fn reopen(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    file: &File,
    image: &RegFile,
    fd: i32,
) -> Result<i32> {
    let pid = cx.pid();
    let changed = |what: String| RestoreError::fd_changed(pid, fd, &image.path, what);
    // /proc resolved every symbolic link of the dumped path, so a link in
    // the last component now was put there since.
    // An O_PATH fd keeps O_NOFOLLOW in its flags (it says whether a link
    // itself is named), so it is opened with exactly its own; a link put
    // in place of a file since is then told by its inode.
    let o_path = file.flags as i32 & libc::O_PATH != 0;
    let mut flags = if o_path {
        reopen_flags(file) | (file.flags as i32 & libc::O_NOFOLLOW)
    } else {
        reopen_flags(file) | libc::O_NOFOLLOW
    };
    if image.is_dir() {
        flags |= libc::O_DIRECTORY;
    }
    let want = expected(cx, file, image);
    let got = match r.open(&image.path, flags, 0) {
        Ok(got) => got,
        // Opened while the process had more privilege (see `privileged`).
        Err(e) if is_permission_denied(&e) && !o_path => {
            let denied = reopen_failure(e, "", cx.fs_uid());
            return privileged::reopen(cx, r, file, image, &want)
                .map_err(|refused| changed(format!("{denied}; {}", refused.0)));
        }
        Err(e) => return Err(changed(reopen_failure(e, "", cx.fs_uid()))),
    };
    let opened = std::path::PathBuf::from(format!("/proc/{pid}/fd/{got}"));
    if let Err(m) = cx.shared.checks.verify(&opened, &want) {
        let _ = r.close(got);
        return Err(changed(m.0));
    }
    if let Contents::Grown { size } = want.contents {
        note_growth(cx, fd, image, &opened, size);
    }
    Ok(got)
}

/// What the reopened file must be: the recorded inode, owner and mode,
/// and contents as the user allowed them to change.
pub(super) fn expected<'a>(cx: &Context<'_, '_>, file: &File, image: &'a RegFile) -> Expected<'a> {
    let o_path = file.flags as i32 & libc::O_PATH != 0;
    let read_only = file.flags as i32 & libc::O_ACCMODE == libc::O_RDONLY && !o_path;
    let contents = if image.is_dir() || cx.may_change(&image.path) {
        Contents::Any
    } else if read_only {
        Contents::Grown { size: image.size }
    } else {
        Contents::Unmodified {
            size: image.size,
            mtime_ns: image.mtime_ns,
            ctime_ns: Some(image.ctime_ns),
        }
    };
    Expected {
        mode: image.mode,
        uid: image.uid,
        gid: image.gid,
        inode: Inode {
            dev: image.dev,
            ino: image.ino,
        },
        contents,
    }
}

/// Says so when a file the process only reads changed since the dump
/// (appended to, or modified): it reads on from its offset, and what it
/// reads there is not what it would have read at the dump.
fn note_growth(
    cx: &Context<'_, '_>,
    fd: i32,
    image: &RegFile,
    opened: &std::path::Path,
    size: u64,
) {
    use std::os::unix::fs::MetadataExt;
    let Ok(now) = std::fs::metadata(opened) else {
        return;
    };
    let mtime_ns = now.mtime() * 1_000_000_000 + now.mtime_nsec();
    if now.size() != size || mtime_ns != image.mtime_ns {
        (cx.shared.options.notice)(&format!(
            "pid {} fd {fd}: {} changed since the dump (size {size} -> {}), read on from its offset",
            cx.pid(),
            image.path,
            now.size()
        ));
    }
}

/// The process's own open was refused for want of permission.
fn is_permission_denied(e: &ParasiteError) -> bool {
    matches!(
        e,
        ParasiteError::RemoteOpen {
            errno: Errno::EACCES | Errno::EPERM,
            ..
        }
    )
}

/// Says why a reopen of `object` (e.g. "" or " the FIFO", as it reads
/// after "cannot reopen") failed, in terms of what probably happened.
pub(crate) fn reopen_failure(e: ParasiteError, object: &str, fs_uid: Option<u32>) -> String {
    let ParasiteError::RemoteOpen { errno, .. } = &e else {
        return format!("cannot reopen{object}: {e}");
    };
    match *errno {
        Errno::ELOOP => format!("cannot reopen{object}: the path is now a symbolic link"),
        Errno::ENOENT => format!("cannot reopen{object}: gone since the dump"),
        Errno::EACCES | Errno::EPERM => match fs_uid {
            Some(uid) => format!(
                "cannot reopen{object} with the process's own credentials (uid {uid}): permission denied"
            ),
            None => format!("cannot reopen{object}: permission denied"),
        },
        other => format!("cannot reopen{object}: {other}"),
    }
}

/// Recreates an unlinked file from its ghost image with its owner, group
/// and mode, gives the process a description of it with the dumped flags,
/// and unlinks it again.
fn recreate_ghost(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    file: &File,
    image: &RegFile,
    ghost: &str,
) -> Result<i32> {
    let own = ownership(image);
    create::check_owner(cx.fs_identity(), cx.pid(), &image.path, &own)?;
    let data = cx.shared.images.read_raw(ghost)?;
    let created = create::create_exclusive(r, &image.path)?;
    let result = fill_and_open(cx, file, image, &created, &data);
    // Whatever happened, the name goes and the process keeps no stray fd.
    let unlinked = match &result {
        Ok(handover) => created.unlink(r, &handover.here),
        Err(_) => created.discard(r),
    };
    created.close(r)?;
    let handover = result?;
    unlinked?;
    take_from(r, std::process::id() as i32, handover.reopened.as_raw_fd())
}

/// The owner, group and mode a file recreated for `image` ends up with.
fn ownership(image: &RegFile) -> Ownership {
    Ownership {
        uid: image.uid,
        gid: image.gid,
        mode: image.mode,
    }
}

/// Makes a directory removed while open again, empty, with its owner and
/// mode, opens it with the dumped flags and removes it again.
fn recreate_removed_dir(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    file: &File,
    image: &RegFile,
) -> Result<i32> {
    let own = ownership(image);
    create::check_owner(cx.fs_identity(), cx.pid(), &image.path, &own)?;
    create::removed_dir(r, &image.path, &own, reopen_flags(file))
}

/// The restorer's two handles on a recreated ghost: the one it filled, and
/// one with the dumped flags to hand to the process.
struct Handover {
    here: std::fs::File,
    reopened: std::fs::File,
}

fn fill_and_open(
    cx: &Context<'_, '_>,
    file: &File,
    image: &RegFile,
    created: &create::Created,
    data: &[u8],
) -> Result<Handover> {
    let pid = cx.pid();
    let err = |what: String| RestoreError::File {
        pid,
        path: created.path.clone(),
        what,
    };
    let creator = cx
        .fs_uid()
        .unwrap_or_else(|| nix::unistd::geteuid().as_raw());
    let mut here = created.open_here(creator)?;
    let own = ownership(image);
    let contents = if image.ghost_extents_only {
        create::Filling::Sparse {
            size: image.size,
            extents: &image.ghost_extents,
            data,
        }
    } else {
        create::Filling::Whole(data)
    };
    let times = create::Times {
        atime_ns: image.atime_ns,
        mtime_ns: image.mtime_ns,
    };
    create::fill(&mut here, &own, &contents, &times)
        .map_err(|e| err(format!("cannot write the unlinked file's contents: {e}")))?;
    // The dumped access mode may be one the final mode no longer grants
    // (opened, then chmod-ed): the restorer opens it as root and passes
    // the description over, as the process had it.
    let reopened = nix::fcntl::open(
        format!("/proc/self/fd/{}", here.as_raw_fd()).as_str(),
        nix::fcntl::OFlag::from_bits_retain(reopen_flags(file)),
        nix::sys::stat::Mode::empty(),
    )
    .map(std::fs::File::from)
    .map_err(|e| err(format!("cannot reopen the recreated file: {e}")))?;
    Ok(Handover { here, reopened })
}
