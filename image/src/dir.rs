//! Writing a checkpoint directory atomically and reading it back verified.
//!
//! Writing: the parent of `DIR` is opened once, following only symlinks
//! root or ckpt's user owns ([`crate::trusted_path`]), and everything
//! happens relative to that fd: `DIR.tmp.<ckpt-pid>` is created 0700 and opened
//! without following symlinks; every file is created in it through its fd
//! (`O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600 whatever the umask) and fsynced;
//! the manifest (size and BLAKE3 digest of every file) is written last
//! with its seal (`manifest.mac`, see [`crate::seal`]); the directory is
//! fsynced, checked to still be the one created, renamed to `DIR` without
//! replacing anything, checked again under its new name, and the parent is
//! fsynced. A dump that fails or is killed leaves at most the temporary
//! directory (removed on the error path, and by the next dump) and never
//! touches an existing `DIR`; another user who can write the parent can
//! make a dump fail, but not redirect it.
//!
//! Reading: [`ImageDir::open`] checks the manifest's seal, decodes it, and
//! then checks the size and BLAKE3 digest of every file it lists, before
//! the caller touches the system. Files are opened through the directory's
//! fd without following symlinks and without blocking (a FIFO or device is
//! refused, not read), must be regular files of the recorded size, owned by
//! ckpt's user and writable by nobody else, and no read is larger than the
//! manifest (or, for the manifest itself, a fixed limit) allows.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::MANIFEST_NAME;
use crate::digest;
use crate::error::ImageError;
use crate::header::{self, ImageKind};
use crate::manifest::{FileDigest, Manifest};
use crate::pagefile::PagesWriter;
use crate::seal::{ImageKey, SEAL_LEN, SEAL_NAME, SealFailure};
use crate::sys::{self, FileType, Identity, OpenError};
use crate::trusted_path::TrustedParent;

/// Builds a checkpoint directory under a temporary name.
pub struct ImageWriter {
    final_path: PathBuf,
    final_name: OsString,
    parent: OwnedFd,
    tmp_name: OsString,
    tmp_path: PathBuf,
    tmp: OwnedFd,
    tmp_id: Identity,
    digests: Vec<FileDigest>,
    /// Files written whole but not fsynced yet: synced together, in
    /// parallel, at the commit (one fsync each as they are written would
    /// cost a journal commit per file: a tree's hundreds of small images).
    unsynced: Vec<String>,
    committed: bool,
    /// `DIR` existed as an empty directory of ours, to be replaced.
    replace_empty: bool,
}

impl ImageWriter {
    /// Starts a checkpoint that will become `dir`. Fails if `dir` exists.
    pub fn create(dir: &Path) -> Result<Self, ImageError> {
        if dir.file_name().is_none_or(|n| n.is_empty()) {
            return Err(ImageError::Invalid {
                path: dir.into(),
                what: "does not end in a directory name".into(),
            });
        }
        let parent_path = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        // ckpt writes here as root: symlinks above the last component are
        // followed once, here, and only if root or ckpt's user owns them;
        // from now on every name is relative to this fd.
        let (parent, final_name) = TrustedParent::resolve(dir)?.into_parts();
        let parent = sys::reopen_dir(parent.as_fd())
            .map_err(|e| ImageError::io(&parent_path, "open parent directory", e))?;
        check_caller_may_create(&parent, &parent_path)?;
        // CRIU users create the directory first: an empty directory of
        // ckpt's user is taken (replaced at commit); anything else is kept.
        let replace_empty = match sys::stat_at(parent.as_fd(), &final_name) {
            Ok(st)
                if FileType::of(&st) == FileType::Directory
                    && st.st_uid == crate::caller::owner_uid() =>
            {
                let existing = sys::open_dir_at(parent.as_fd(), &final_name)
                    .and_then(|d| sys::list(d.as_fd()))
                    .map_err(|e| ImageError::io(dir, "list", e))?;
                if !existing.is_empty() {
                    return Err(ImageError::Exists { path: dir.into() });
                }
                true
            }
            Ok(_) => return Err(ImageError::Exists { path: dir.into() }),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => false,
            Err(e) => return Err(ImageError::io(dir, "stat", e)),
        };
        remove_stale_tmp_dirs(&parent, &final_name);
        let mut tmp_name = final_name.clone();
        tmp_name.push(format!(".tmp.{}", std::process::id()));
        let tmp_path = parent_path.join(&tmp_name);
        sys::mkdir_at(parent.as_fd(), &tmp_name)
            .map_err(|e| ImageError::io(&tmp_path, "create", e))?;
        let hijacked = |what: String| ImageError::Hijacked {
            path: tmp_path.clone(),
            what,
        };
        let tmp = sys::open_dir_at(parent.as_fd(), &tmp_name)
            .map_err(|e| hijacked(format!("replaced right after it was created ({e})")))?;
        let st = sys::stat_fd(tmp.as_fd()).map_err(|e| ImageError::io(&tmp_path, "stat", e))?;
        let empty = sys::list(tmp.as_fd())
            .map_err(|e| ImageError::io(&tmp_path, "list", e))?
            .is_empty();
        if st.st_uid != sys::euid() || !empty {
            return Err(hijacked(
                "replaced by another directory right after it was created".into(),
            ));
        }
        sys::set_mode(tmp.as_fd(), sys::DIR_MODE)
            .map_err(|e| ImageError::io(&tmp_path, "chmod", e))?;
        Ok(ImageWriter {
            final_path: dir.into(),
            final_name,
            parent,
            tmp_name,
            tmp_path,
            tmp,
            tmp_id: Identity::of(&st),
            digests: Vec::new(),
            unsynced: Vec::new(),
            committed: false,
            replace_empty,
        })
    }

    /// The temporary directory files are written to (for messages: files
    /// are only ever reached through the directory's fd).
    pub fn tmp_dir(&self) -> &Path {
        &self.tmp_path
    }

    /// Writes a metadata image.
    pub fn write_meta<M: prost::Message>(
        &mut self,
        name: &str,
        kind: ImageKind,
        msg: &M,
    ) -> Result<(), ImageError> {
        self.write_raw(name, &header::encode(kind, msg))
    }

    /// Writes a file verbatim (used for ghost-file contents).
    pub fn write_raw(&mut self, name: &str, bytes: &[u8]) -> Result<(), ImageError> {
        self.write_file(name, bytes)?;
        self.digests.push(FileDigest {
            name: name.into(),
            size: bytes.len() as u64,
            blake3: digest::of_bytes(bytes).to_vec(),
            block_blake3: Vec::new(),
        });
        log::debug!("wrote {name}: {} bytes", bytes.len());
        Ok(())
    }

    /// Bytes of every file written so far (the manifest and its seal, which
    /// come last, excluded).
    pub fn written_bytes(&self) -> u64 {
        self.digests.iter().map(|d| d.size).sum()
    }

    /// Creates `name` in the temporary directory with `bytes`; it is
    /// synced at the commit ([`ImageWriter::sync_written`]).
    fn write_file(&mut self, name: &str, bytes: &[u8]) -> Result<(), ImageError> {
        let path = self.tmp_path.join(name);
        check_name(&self.tmp_path, name)?;
        let mut f = sys::create_file_at(self.tmp.as_fd(), OsStr::new(name), false)
            .map_err(|e| ImageError::io(&path, "create", e))?;
        f.write_all(bytes)
            .map_err(|e| ImageError::io(&path, "write", e))?;
        // Only a hint: the disk may start now; the fsync is what counts.
        let _ = sys::start_writeback(f.as_fd(), 0, bytes.len() as u64);
        self.unsynced.push(name.into());
        Ok(())
    }

    /// Fsyncs every file written whole so far, many at once (the file
    /// system then commits its journal for several together).
    fn sync_written(&mut self) -> Result<(), ImageError> {
        use rayon::prelude::*;
        let names = std::mem::take(&mut self.unsynced);
        names.par_iter().try_for_each(|name| {
            let path = self.tmp_path.join(name);
            let f = open_regular(&self.tmp, name, &path)?;
            f.0.sync_all()
                .map_err(|e| ImageError::io(&path, "fsync", e))
        })
    }

    /// Opens a page-data file that may be filled from many threads.
    pub fn pages(&self, name: &str) -> Result<PagesWriter, ImageError> {
        let path = self.tmp_path.join(name);
        check_name(&self.tmp_path, name)?;
        let file = sys::create_file_at(self.tmp.as_fd(), OsStr::new(name), true)
            .map_err(|e| ImageError::io(&path, "create", e))?;
        Ok(PagesWriter::new(name.into(), path, file))
    }

    /// Syncs a page file and records its checksums.
    pub fn finish_pages(&mut self, pages: PagesWriter) -> Result<(), ImageError> {
        self.finish_pages_all(vec![pages])
    }

    /// Syncs several page files at once (a tree's: their fsyncs and
    /// checksum read-backs overlap) and records their checksums.
    pub fn finish_pages_all(&mut self, pages: Vec<PagesWriter>) -> Result<(), ImageError> {
        use rayon::prelude::*;
        let digests = pages
            .into_par_iter()
            .map(PagesWriter::finish)
            .collect::<Result<Vec<_>, _>>()?;
        for digest in digests {
            log::debug!("wrote {}: {} bytes", digest.name, digest.size);
            self.digests.push(digest);
        }
        Ok(())
    }

    /// Writes the manifest and its seal under `key`, syncs, renames the
    /// directory into place and checks that `DIR` is what was written.
    pub fn commit(
        mut self,
        mut manifest: Manifest,
        key: &ImageKey,
    ) -> Result<Committed, ImageError> {
        manifest.files = std::mem::take(&mut self.digests);
        let bytes = header::encode(ImageKind::Manifest, &manifest);
        self.write_file(MANIFEST_NAME, &bytes)?;
        self.write_file(SEAL_NAME, &key.seal(&bytes))?;
        self.sync_written()?;
        self.give_to_caller()?;
        sys::sync(self.tmp.as_fd())
            .map_err(|e| ImageError::io(&self.tmp_path, "fsync directory", e))?;
        // Whoever can write the parent can move our directory away and put
        // something else (a symlink) under its name: rename only our own.
        match sys::stat_at(self.parent.as_fd(), &self.tmp_name) {
            Ok(st) if Identity::of(&st) == self.tmp_id => {}
            Ok(st) => {
                return Err(ImageError::Hijacked {
                    path: self.tmp_path.clone(),
                    what: format!(
                        "was replaced by a {} while the dump wrote it",
                        FileType::of(&st).name()
                    ),
                });
            }
            Err(e) => {
                return Err(ImageError::Hijacked {
                    path: self.tmp_path.clone(),
                    what: format!("disappeared while the dump wrote it ({e})"),
                });
            }
        }
        if self.replace_empty {
            // rmdir removes only an empty directory; if it filled up or was
            // swapped meanwhile, the rename below refuses to replace it.
            let _ = sys::rmdir_at(self.parent.as_fd(), &self.final_name);
        }
        match sys::rename_noreplace_at(self.parent.as_fd(), &self.tmp_name, &self.final_name)
            .map_err(|e| ImageError::io(&self.final_path, "rename into place", e))?
        {
            sys::RenameOutcome::Renamed => {}
            sys::RenameOutcome::Exists => {
                return Err(ImageError::Exists {
                    path: self.final_path.clone(),
                });
            }
        }
        let committed = Committed {
            path: self.final_path.clone(),
            name: self.final_name.clone(),
            parent: self
                .parent
                .try_clone()
                .map_err(|e| ImageError::io(&self.final_path, "dup parent fd", e))?,
            id: self.tmp_id,
            manifest: bytes,
            files: manifest.files,
        };
        sys::sync(self.parent.as_fd())
            .map_err(|e| ImageError::io(&self.final_path, "fsync parent directory", e))?;
        // The name could have been swapped between the check and the
        // rename: never report success for what is not ours.
        committed.verify(key)?;
        self.committed = true;
        Ok(committed)
    }
}

impl ImageWriter {
    /// Acting for a caller, gives the finished checkpoint to them: only now,
    /// once every file is written, digested and sealed, so nothing the
    /// caller does to their files can enter the seal (a change from now on
    /// fails the digests, which the commit and every restore check).
    fn give_to_caller(&self) -> Result<(), ImageError> {
        let Some(caller) = crate::caller::acting_for() else {
            return Ok(());
        };
        let names =
            sys::list(self.tmp.as_fd()).map_err(|e| ImageError::io(&self.tmp_path, "list", e))?;
        for name in names {
            sys::chown_at(self.tmp.as_fd(), &name, caller.uid, caller.gid)
                .map_err(|e| ImageError::io(self.tmp_path.join(&name), "chown", e))?;
        }
        sys::chown_fd(self.tmp.as_fd(), caller.uid, caller.gid)
            .map_err(|e| ImageError::io(&self.tmp_path, "chown", e))
    }
}

/// Acting for a caller, ckpt (root) writes only into a directory where the
/// caller could create a name by its permission bits: a user asking the
/// service for a dump into `/etc/x` would otherwise have root create it.
fn check_caller_may_create(parent: &OwnedFd, path: &Path) -> Result<(), ImageError> {
    let Some(caller) = crate::caller::acting_for() else {
        return Ok(());
    };
    let st = sys::stat_fd(parent.as_fd()).map_err(|e| ImageError::io(path, "stat", e))?;
    if caller.may_create_in(st.st_uid, st.st_gid, st.st_mode & 0o7777) {
        return Ok(());
    }
    let why = format!(
        "{caller} may not create files here (owner uid {}, group {}, mode {:o}): \
         images are written only where their user could write",
        st.st_uid,
        st.st_gid,
        st.st_mode & 0o7777
    );
    Err(ImageError::io(
        path,
        "create a checkpoint",
        std::io::Error::new(std::io::ErrorKind::PermissionDenied, why),
    ))
}

impl Drop for ImageWriter {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        // Through our own fd: if the directory was moved, its files still go.
        clear_dir(&self.tmp);
        for name in [&self.tmp_name, &self.final_name] {
            if sys::stat_at(self.parent.as_fd(), name)
                .is_ok_and(|st| Identity::of(&st) == self.tmp_id)
            {
                let _ = sys::rmdir_at(self.parent.as_fd(), name);
            }
        }
    }
}

/// A checkpoint renamed into place by [`ImageWriter::commit`].
pub struct Committed {
    path: PathBuf,
    name: OsString,
    parent: OwnedFd,
    id: Identity,
    manifest: Vec<u8>,
    files: Vec<FileDigest>,
}

impl Committed {
    /// The checkpoint directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks that `DIR` is still the directory this dump wrote (not a
    /// symlink, not another directory), holding the sealed manifest as
    /// written and every file it lists at its recorded size. Run before
    /// anything depends on the checkpoint, e.g. before killing its tree.
    pub fn verify(&self, key: &ImageKey) -> Result<(), ImageError> {
        let gone = |what: String| ImageError::Hijacked {
            path: self.path.clone(),
            what,
        };
        let dir = sys::open_dir_at(self.parent.as_fd(), &self.name)
            .map_err(|e| gone(format!("cannot be opened as the committed directory ({e})")))?;
        let st = sys::stat_fd(dir.as_fd()).map_err(|e| ImageError::io(&self.path, "stat", e))?;
        if Identity::of(&st) != self.id {
            return Err(gone("is no longer the directory this dump wrote".into()));
        }
        let mpath = self.path.join(MANIFEST_NAME);
        let bytes = read_whole(&dir, MANIFEST_NAME, &mpath, self.manifest.len() as u64)?;
        if bytes != self.manifest {
            return Err(gone("holds another manifest than the one written".into()));
        }
        let sealed = read_whole(&dir, SEAL_NAME, &self.path.join(SEAL_NAME), SEAL_LEN as u64)?;
        key.verify(&bytes, &sealed)
            .map_err(|why| ImageError::NotSealed {
                path: mpath,
                key_file: key.path().into(),
                why,
            })?;
        for d in &self.files {
            let path = self.path.join(&d.name);
            let st = sys::stat_at(dir.as_fd(), OsStr::new(&d.name))
                .map_err(|e| ImageError::io(&path, "stat", e))?;
            let kind = FileType::of(&st);
            if kind != FileType::Regular {
                return Err(ImageError::NotRegular {
                    path,
                    found: kind.name(),
                });
            }
            if st.st_size as u64 != d.size {
                return Err(ImageError::Size {
                    path,
                    found: st.st_size as u64,
                    expected: d.size,
                });
            }
        }
        Ok(())
    }
}

/// A dumper's temporary directory (`NAME.tmp.<pid>`) found by a sweep,
/// and what became of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleTmp {
    /// Its name in the swept directory.
    pub name: OsString,
    /// The pid of the dumper that made it.
    pub pid: u32,
    /// Removed, or why not.
    pub outcome: SweepOutcome,
}

/// What a sweep did with one dumper's temporary directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SweepOutcome {
    /// Its dumper is gone: removed.
    Removed,
    /// Its dumper still runs (or cannot be seen): left to it.
    DumperAlive,
    /// A symlink or anything but a directory: never followed, left.
    NotADirectory,
    /// Another user's directory: left to them.
    OtherOwner {
        /// Its owner.
        uid: u32,
    },
    /// It changed under the sweep, or could not be emptied: left.
    Failed {
        /// What went wrong.
        what: String,
    },
}

/// Removes the temporary directories (`NAME.tmp.<pid>`) that killed
/// dumpers left in directory `dir`, the parent of their checkpoints, and
/// says what it did with each. Only real directories (never a symlink)
/// owned by ckpt's user whose dumper no longer runs are removed, and only
/// the non-directory entries in them, never anything they point at.
/// `dir` itself is reached following only symlinks root or ckpt's user
/// owns.
pub fn sweep_stale_tmp_dirs(dir: &Path) -> Result<Vec<StaleTmp>, ImageError> {
    let fd = crate::trusted_path::open_dir(dir)?;
    Ok(sweep(&fd, None))
}

/// The sweep of [`sweep_stale_tmp_dirs`] over the open directory `parent`,
/// limited to the temporary directories of checkpoint `only` if given.
fn sweep(parent: &OwnedFd, only: Option<&OsStr>) -> Vec<StaleTmp> {
    let Ok(mut names) = sys::list(parent.as_fd()) else {
        return Vec::new();
    };
    names.sort();
    let mut found = Vec::new();
    for name in names {
        let Some((checkpoint, pid)) = dumper_tmp_name(&name) else {
            continue;
        };
        if only.is_some_and(|o| o != checkpoint) {
            continue;
        }
        // Our own pid: a dump of ours that failed earlier in this process.
        let outcome = if pid != std::process::id() && sys::pid_alive(pid) {
            SweepOutcome::DumperAlive
        } else {
            remove_dead_tmp_dir(parent, &name)
        };
        found.push(StaleTmp { name, pid, outcome });
    }
    found
}

/// `NAME.tmp.<pid>` split into the checkpoint's name and the dumper's pid.
fn dumper_tmp_name(name: &OsStr) -> Option<(&OsStr, u32)> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = name.as_bytes();
    const INFIX: &[u8] = b".tmp.";
    let at = bytes.windows(INFIX.len()).rposition(|w| w == INFIX)?;
    let pid = std::str::from_utf8(&bytes[at + INFIX.len()..])
        .ok()
        .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))?
        .parse::<u32>()
        .ok()?;
    if at == 0 {
        return None;
    }
    Some((OsStr::from_bytes(&bytes[..at]), pid))
}

/// Removes `DIR.tmp.<pid>` directories left by dumpers that were killed
/// (see [`sweep_stale_tmp_dirs`]). Best effort: a failure only leaves
/// litter.
fn remove_stale_tmp_dirs(parent: &OwnedFd, final_name: &OsStr) {
    sweep(parent, Some(final_name));
}

fn remove_dead_tmp_dir(parent: &OwnedFd, name: &OsStr) -> SweepOutcome {
    let st = match sys::stat_at(parent.as_fd(), name) {
        Ok(st) => st,
        Err(e) => {
            return SweepOutcome::Failed {
                what: format!("stat: {e}"),
            };
        }
    };
    if FileType::of(&st) != FileType::Directory {
        return SweepOutcome::NotADirectory;
    }
    // Acting for a caller, their finished images are theirs but a dead
    // dumper's half-written ones are still root's (see `give_to_caller`).
    if st.st_uid != sys::euid() && st.st_uid != crate::caller::owner_uid() {
        return SweepOutcome::OtherOwner { uid: st.st_uid };
    }
    let dir = match sys::open_dir_at(parent.as_fd(), name) {
        Ok(d) => d,
        Err(e) => {
            return SweepOutcome::Failed {
                what: format!("open: {e}"),
            };
        }
    };
    if !sys::stat_fd(dir.as_fd()).is_ok_and(|s| Identity::of(&s) == Identity::of(&st)) {
        return SweepOutcome::Failed {
            what: "replaced while it was looked at".into(),
        };
    }
    clear_dir(&dir);
    match sys::rmdir_at(parent.as_fd(), name) {
        Ok(()) => SweepOutcome::Removed,
        Err(e) => SweepOutcome::Failed {
            what: format!("rmdir: {e}"),
        },
    }
}

/// Unlinks every non-directory entry of `dir` (image directories are flat).
fn clear_dir(dir: &OwnedFd) {
    for name in sys::list(dir.as_fd()).unwrap_or_default() {
        if sys::stat_at(dir.as_fd(), &name).is_ok_and(|st| FileType::of(&st) != FileType::Directory)
        {
            let _ = sys::unlink_at(dir.as_fd(), &name);
        }
    }
}

/// A file name inside an image directory: one plain component.
fn check_name(dir: &Path, name: &str) -> Result<(), ImageError> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
        return Err(ImageError::Invalid {
            path: dir.into(),
            what: format!("file name {name:?} escapes the checkpoint directory"),
        });
    }
    Ok(())
}

/// Opens `name` in `dir` as a regular file (see [`sys::open_regular_at`]).
fn open_regular(
    dir: &OwnedFd,
    name: &str,
    path: &Path,
) -> Result<(File, nix::sys::stat::FileStat), ImageError> {
    sys::open_regular_at(dir.as_fd(), OsStr::new(name)).map_err(|e| match e {
        OpenError::NotRegular(t) => ImageError::NotRegular {
            path: path.into(),
            found: t.name(),
        },
        OpenError::Io(e) => ImageError::io(path, "open", e),
    })
}

/// Reads all of regular file `name` in `dir`, which may not exceed `limit`.
fn read_whole(dir: &OwnedFd, name: &str, path: &Path, limit: u64) -> Result<Vec<u8>, ImageError> {
    let (f, st) = open_regular(dir, name, path)?;
    let len = st.st_size as u64;
    if len > limit {
        return Err(ImageError::TooLarge {
            path: path.into(),
            len,
            limit,
        });
    }
    read_exact_len(f, path, len)
}

/// Reads exactly `len` bytes (the size the file had when opened; a file
/// that grows or shrinks meanwhile is an error, not a longer read).
fn read_exact_len(f: File, path: &Path, len: u64) -> Result<Vec<u8>, ImageError> {
    let mut bytes = Vec::with_capacity(len as usize);
    f.take(len.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| ImageError::io(path, "read", e))?;
    if bytes.len() as u64 != len {
        return Err(ImageError::Size {
            path: path.into(),
            found: bytes.len() as u64,
            expected: len,
        });
    }
    Ok(bytes)
}

/// The sealed BLAKE3 digests of a page data file's blocks: each block is checked
/// as it is first used ([`ImageDir::block_checks`]).
#[derive(Debug, Clone)]
pub struct BlockChecks {
    path: PathBuf,
    size: u64,
    /// One BLAKE3 digest per [`digest::BLOCK`] bytes.
    hashes: Vec<u8>,
}

impl BlockChecks {
    /// The file (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many blocks the file has.
    pub fn count(&self) -> usize {
        self.hashes.len() / digest::DIGEST_LEN
    }

    /// The blocks `[offset, offset+len)` of the file lies in.
    pub fn blocks_of(&self, offset: u64, len: u64) -> std::ops::Range<usize> {
        let first = (offset / digest::BLOCK) as usize;
        let end = offset.saturating_add(len).div_ceil(digest::BLOCK) as usize;
        first..end.min(self.count()).max(first)
    }

    /// Checks `data`, read from the file as block `i` (all of it: the last
    /// block may be shorter than [`digest::BLOCK`]), against its sealed
    /// BLAKE3 digest.
    pub fn check_data(&self, i: usize, data: &[u8]) -> Result<(), ImageError> {
        let start = (i as u64).saturating_mul(digest::BLOCK);
        let len = digest::BLOCK.min(self.size.saturating_sub(start));
        let want = self
            .hashes
            .get(i * digest::DIGEST_LEN..(i + 1) * digest::DIGEST_LEN);
        match want {
            Some(want)
                if data.len() as u64 == len && digest::block_digest(data)[..] == want[..] =>
            {
                Ok(())
            }
            _ => Err(ImageError::Checksum {
                path: self.path.clone(),
            }),
        }
    }

    /// Checks block `i` of `file` (the whole file's bytes, of the recorded
    /// size) against its sealed BLAKE3 digest.
    pub fn check(&self, file: &[u8], i: usize) -> Result<(), ImageError> {
        let start = (i as u64).saturating_mul(digest::BLOCK);
        let end = start.saturating_add(digest::BLOCK).min(self.size);
        let want = self
            .hashes
            .get(i * digest::DIGEST_LEN..(i + 1) * digest::DIGEST_LEN);
        let got = usize::try_from(start)
            .ok()
            .zip(usize::try_from(end).ok())
            .filter(|_| file.len() as u64 == self.size)
            .and_then(|(s, e)| file.get(s..e));
        match (want, got) {
            (Some(want), Some(data)) if digest::block_digest(data)[..] == want[..] => Ok(()),
            _ => Err(ImageError::Checksum {
                path: self.path.clone(),
            }),
        }
    }
}

/// A checkpoint directory opened for reading, sealed by this site's key,
/// with every file verified.
pub struct ImageDir {
    path: PathBuf,
    dir: OwnedFd,
    manifest: Manifest,
    /// Page data files whose checksums are still to be verified, as their
    /// bytes are used ([`ImageDir::open_deferring_pages`]).
    unverified: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// The manifest's digest of a file against that of its bytes.
fn check_digest(d: &FileDigest, found: digest::Digest, path: PathBuf) -> Result<(), ImageError> {
    if found[..] != d.blake3[..] {
        return Err(ImageError::Checksum { path });
    }
    Ok(())
}

/// Whether `name` is a process's page data (`pages-PID.img`).
fn is_pages_name(name: &str) -> bool {
    name.strip_prefix("pages-")
        .and_then(|rest| rest.strip_suffix(".img"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

impl ImageDir {
    /// Opens `dir`, checks the manifest's seal under `key`, decodes the
    /// manifest and verifies the size and BLAKE3 digest of every file it
    /// lists.
    pub fn open(dir: &Path, key: &ImageKey) -> Result<Self, ImageError> {
        Self::open_verifying(dir, key, false)
    }

    /// Like [`ImageDir::open`], but the page data files are verified later,
    /// as their bytes are used ([`ImageDir::verify_bytes`]), so a restore
    /// reads them once instead of twice and hashes them while it copies.
    /// Everything else is verified now. The caller must verify every one
    /// before anything restored runs: [`ImageDir::verify_remaining`] does
    /// the rest.
    pub fn open_deferring_pages(dir: &Path, key: &ImageKey) -> Result<Self, ImageError> {
        Self::open_verifying(dir, key, true)
    }

    fn open_verifying(dir: &Path, key: &ImageKey, defer_pages: bool) -> Result<Self, ImageError> {
        let fd = sys::open_dir_path(dir).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTDIR) => ImageError::Invalid {
                path: dir.into(),
                what: "not a directory".into(),
            },
            _ => ImageError::io(dir, "open checkpoint", e),
        })?;
        let mpath = dir.join(MANIFEST_NAME);
        let bytes = read_whole(
            &fd,
            MANIFEST_NAME,
            &mpath,
            header::MAX_PAYLOAD + header::HEADER_LEN as u64,
        )?;
        let not_sealed = |why| ImageError::NotSealed {
            path: mpath.clone(),
            key_file: key.path().into(),
            why,
        };
        // Nothing of the manifest is parsed before it is known to be ours.
        let sealed = match read_whole(&fd, SEAL_NAME, &dir.join(SEAL_NAME), SEAL_LEN as u64) {
            Ok(s) => s,
            Err(ImageError::Io { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => {
                return Err(not_sealed(SealFailure::Missing));
            }
            Err(ImageError::TooLarge { .. } | ImageError::NotRegular { .. }) => {
                return Err(not_sealed(SealFailure::Malformed));
            }
            Err(e) => return Err(e),
        };
        key.verify(&bytes, &sealed).map_err(not_sealed)?;
        let st = sys::stat_fd(fd.as_fd()).map_err(|e| ImageError::io(dir, "stat", e))?;
        check_private(dir, &st)?;
        let manifest: Manifest = header::decode(ImageKind::Manifest, &mpath, &bytes)?;
        let this = ImageDir {
            path: dir.into(),
            dir: fd,
            manifest,
            unverified: Default::default(),
        };
        this.check_listing()?;
        let mut deferred = std::collections::BTreeSet::new();
        let mut now = Vec::new();
        for d in &this.manifest.files {
            if defer_pages && is_pages_name(&d.name) {
                deferred.insert(d.name.clone());
                continue;
            }
            // All opened and their reads started before the first is
            // hashed: from a cold cache, a dozen small files cost one
            // wait for the disk instead of a dozen.
            let path = this.path.join(&d.name);
            let (f, _) = this.open_listed(d, &path)?;
            sys::read_ahead(f.as_fd(), 0, d.size);
            now.push((d, f, path));
        }
        for (d, f, path) in now {
            check_digest(d, digest::of_file(&f, d.size, &path)?, path)?;
            log::debug!("verified {}: {} bytes", d.name, d.size);
        }
        *this.unverified.lock().unwrap_or_else(|p| p.into_inner()) = deferred;
        Ok(this)
    }

    /// Verifies `bytes` as the contents of listed file `name` (size,
    /// BLAKE3 digest, blocks hashed in parallel): the bytes a restore
    /// is using, so what was checked is what is used.
    pub fn verify_bytes(&self, name: &str, bytes: &[u8]) -> Result<(), ImageError> {
        let d = self.digest(name)?;
        let path = self.path.join(name);
        if bytes.len() as u64 != d.size {
            return Err(ImageError::Size {
                path,
                found: bytes.len() as u64,
                expected: d.size,
            });
        }
        check_digest(d, digest::of_bytes(bytes), path)?;
        self.unverified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        log::debug!("verified {name} as used: {} bytes", d.size);
        Ok(())
    }

    /// The sealed per-block BLAKE3 digests of deferred page data file `name`,
    /// when the manifest has them: their list is checked against the
    /// file's BLAKE3 digest here, and the caller takes over checking each block
    /// before it uses it ([`BlockChecks::check`]); the file is no longer
    /// verified whole. `None` for images without the list.
    pub fn block_checks(&self, name: &str) -> Result<Option<BlockChecks>, ImageError> {
        let d = self.digest(name)?;
        if d.block_blake3.is_empty() {
            return Ok(None);
        }
        let path = self.path.join(name);
        let blocks = d.size.div_ceil(digest::BLOCK);
        if d.block_blake3.len() as u64 != blocks.saturating_mul(digest::DIGEST_LEN as u64)
            || digest::digest_of_block_list(&d.block_blake3)[..] != d.blake3[..]
        {
            return Err(ImageError::Invalid {
                path: self.path.join(MANIFEST_NAME),
                what: format!("the block checksums of {name} do not add up to its BLAKE3 digest"),
            });
        }
        self.unverified
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(name);
        Ok(Some(BlockChecks {
            path,
            size: d.size,
            hashes: d.block_blake3.clone(),
        }))
    }

    /// Verifies, from their files, the deferred files no one verified as
    /// used ([`ImageDir::open_deferring_pages`]).
    pub fn verify_remaining(&self) -> Result<(), ImageError> {
        let left: Vec<String> =
            std::mem::take(&mut *self.unverified.lock().unwrap_or_else(|p| p.into_inner()))
                .into_iter()
                .collect();
        for name in left {
            let d = self.digest(&name)?;
            self.verify(d)?;
        }
        Ok(())
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The decoded manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The manifest's record of `name`.
    pub fn digest(&self, name: &str) -> Result<&FileDigest, ImageError> {
        check_name(&self.path, name)?;
        self.manifest
            .files
            .iter()
            .find(|d| d.name == name)
            .ok_or_else(|| ImageError::NotListed {
                dir: self.path.clone(),
                name: name.into(),
            })
    }

    /// Reads and decodes a metadata image listed in the manifest.
    pub fn read_meta<M: prost::Message + Default>(
        &self,
        name: &str,
        kind: ImageKind,
    ) -> Result<M, ImageError> {
        let bytes = self.read_raw(name)?;
        header::decode(kind, &self.path.join(name), &bytes)
    }

    /// Reads a file listed in the manifest, checking size and checksums
    /// again (it could have changed since [`ImageDir::open`]).
    pub fn read_raw(&self, name: &str) -> Result<Vec<u8>, ImageError> {
        let d = self.digest(name)?;
        let path = self.path.join(name);
        let (f, st) = self.open_listed(d, &path)?;
        let bytes = read_exact_len(f, &path, st.st_size as u64)?;
        check_digest(d, digest::of_bytes(&bytes), path)?;
        Ok(bytes)
    }

    /// Opens a page file for reading; its size was checked against the manifest.
    pub fn open_pages(&self, name: &str) -> Result<File, ImageError> {
        let d = self.digest(name)?;
        let path = self.path.join(name);
        Ok(self.open_listed(d, &path)?.0)
    }

    /// Listed page data file `name` opened again for direct reads
    /// (`O_DIRECT`, past the page cache, page-aligned reads), or `None`
    /// where that does not pay or cannot be had: a file in memory (tmpfs,
    /// ramfs), a filesystem without direct I/O or with blocks larger than
    /// a page.
    pub fn open_pages_direct(&self, name: &str) -> Result<Option<File>, ImageError> {
        let f = self.open_pages(name)?;
        if sys::in_memory(f.as_fd())
            || sys::set_direct(f.as_fd(), true).is_err()
            || !sys::direct_read_works(&f)
        {
            return Ok(None);
        }
        Ok(Some(f))
    }

    /// The manifest's processes form a tree a restore can build: the root
    /// listed first and not a zombie, every pid once, each after its
    /// parent, which is not a zombie. Whatever goes through the processes
    /// one by one (a restore, `ckpt show`) checks this first: otherwise a
    /// sealed list of one process repeated 100,000 times costs 100,000
    /// reads of its images. Linear in the number of processes.
    pub fn check_tree(&self) -> Result<(), ImageError> {
        let m = &self.manifest;
        let bad = |what: String| ImageError::Invalid {
            path: self.path.join(MANIFEST_NAME),
            what,
        };
        if m.processes.first().map(|p| (p.pid, p.zombie_status)) != Some((m.root_pid, None)) {
            return Err(bad(
                "the root process is not listed first, or is a zombie".into()
            ));
        }
        let mut listed = std::collections::HashSet::with_capacity(m.processes.len());
        let mut parents = std::collections::HashSet::new();
        for (i, p) in m.processes.iter().enumerate() {
            if !listed.insert(p.pid) {
                return Err(bad(format!("lists pid {} twice", p.pid)));
            }
            if i > 0 && !parents.contains(&p.ppid) {
                return Err(bad(format!(
                    "pid {} is listed before its parent {}",
                    p.pid, p.ppid
                )));
            }
            if p.zombie_status.is_none() {
                parents.insert(p.pid);
            }
        }
        Ok(())
    }

    /// Every listed name is a plain, unique file name with a BLAKE3 digest, and
    /// not the manifest or its seal.
    fn check_listing(&self) -> Result<(), ImageError> {
        let mpath = self.path.join(MANIFEST_NAME);
        let mut names: Vec<&str> = Vec::with_capacity(self.manifest.files.len());
        for d in &self.manifest.files {
            check_name(&self.path, &d.name)?;
            if d.blake3.len() != digest::DIGEST_LEN {
                return Err(ImageError::Invalid {
                    path: mpath,
                    what: format!("no BLAKE3 digest recorded for {}", d.name),
                });
            }
            if d.name == MANIFEST_NAME || d.name == SEAL_NAME {
                return Err(ImageError::Invalid {
                    path: mpath,
                    what: format!("lists {} as one of its files", d.name),
                });
            }
            names.push(&d.name);
        }
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(ImageError::Invalid {
                path: mpath,
                what: format!("lists {} twice", w[0]),
            });
        }
        Ok(())
    }

    /// Opens a listed file: regular, private, of the recorded size.
    fn open_listed(
        &self,
        d: &FileDigest,
        path: &Path,
    ) -> Result<(File, nix::sys::stat::FileStat), ImageError> {
        let (f, st) = open_regular(&self.dir, &d.name, path)?;
        check_private(path, &st)?;
        if st.st_size as u64 != d.size {
            return Err(ImageError::Size {
                path: path.into(),
                found: st.st_size as u64,
                expected: d.size,
            });
        }
        Ok((f, st))
    }

    fn verify(&self, d: &FileDigest) -> Result<(), ImageError> {
        let path = self.path.join(&d.name);
        let (f, _) = self.open_listed(d, &path)?;
        check_digest(d, digest::of_file(&f, d.size, &path)?, path)
    }
}

/// An image file or directory only ckpt's user can change: otherwise it
/// could be swapped after it was verified. Acting for a caller, that user
/// is the caller, whose own images these are: what they could still change
/// after the checks is read once and verified on the bytes used (metadata),
/// or is their own processes' memory (page data).
fn check_private(path: &Path, st: &nix::sys::stat::FileStat) -> Result<(), ImageError> {
    let me = crate::caller::owner_uid();
    if st.st_uid != me {
        return Err(ImageError::Unsafe {
            path: path.into(),
            what: format!("owned by uid {}, not by ckpt's user {me}", st.st_uid),
        });
    }
    if st.st_mode & 0o022 != 0 {
        return Err(ImageError::Unsafe {
            path: path.into(),
            what: format!(
                "writable by group or others (mode {:o})",
                st.st_mode & 0o7777
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::Core;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn key() -> ImageKey {
        ImageKey::from_secret(Path::new("test.key"), [3; crate::seal::KEY_LEN])
    }

    #[test]
    fn write_commit_read_back() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("ck");
        let mut w = ImageWriter::create(&dir).unwrap();
        let core = Core {
            pid: 42,
            comm: "x".into(),
            ..Default::default()
        };
        w.write_meta("core-42.img", ImageKind::Core, &core).unwrap();
        let p = w.pages("pages-42.img").unwrap();
        // Out of order, as parallel writers would.
        p.write_at(4096, &[2u8; 4096]).unwrap();
        p.write_at(0, &[1u8; 4096]).unwrap();
        w.finish_pages(p).unwrap();
        w.commit(Manifest::default(), &key()).unwrap();

        let d = ImageDir::open(&dir, &key()).unwrap();
        let back: Core = d.read_meta("core-42.img", ImageKind::Core).unwrap();
        assert_eq!(back, core);
        let mut all = vec![1u8; 4096];
        all.extend_from_slice(&[2u8; 4096]);
        assert_eq!(
            d.digest("pages-42.img").unwrap().blake3,
            digest::of_bytes(&all).to_vec()
        );
        assert!(
            !t.path()
                .join(format!("ck.tmp.{}", std::process::id()))
                .exists()
        );
    }

    /// A pages file of two blocks and a bit: each block checks against the
    /// sealed list on its own, a changed byte fails only its block, and a
    /// list that does not add up to the file's BLAKE3 digest is refused.
    #[test]
    fn page_data_blocks_check_one_by_one() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("ck");
        let mut w = ImageWriter::create(&dir).unwrap();
        let p = w.pages("pages-7.img").unwrap();
        let block = digest::BLOCK as usize;
        let mut data: Vec<u8> = (0..2 * block + 4096).map(|i| (i % 251) as u8).collect();
        p.write_at(0, &data).unwrap();
        w.finish_pages(p).unwrap();
        w.commit(Manifest::default(), &key()).unwrap();

        let d = ImageDir::open_deferring_pages(&dir, &key()).unwrap();
        let checks = d.block_checks("pages-7.img").unwrap().expect("listed");
        assert_eq!(checks.count(), 3);
        assert_eq!(checks.blocks_of(block as u64 - 1, 2), 0..2);
        for i in 0..3 {
            checks.check(&data, i).unwrap();
        }
        data[block + 5] ^= 1;
        assert!(checks.check(&data, 0).is_ok());
        assert!(matches!(
            checks.check(&data, 1),
            Err(ImageError::Checksum { .. })
        ));
        assert!(checks.check(&data[..block], 0).is_err(), "wrong size");
        // Nothing is left to verify whole: the blocks are the caller's.
        d.verify_remaining().unwrap();

        let mut d = d;
        let listed = d
            .manifest
            .files
            .iter_mut()
            .find(|f| f.name == "pages-7.img")
            .unwrap();
        listed.block_blake3[0] ^= 1;
        assert!(matches!(
            d.block_checks("pages-7.img"),
            Err(ImageError::Invalid { .. })
        ));
    }

    #[test]
    fn dropped_writer_leaves_nothing_and_non_empty_dir_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("ck");
        {
            let mut w = ImageWriter::create(&dir).unwrap();
            w.write_raw("ghost-0.img", b"abc").unwrap();
        }
        assert_eq!(fs::read_dir(t.path()).unwrap().count(), 0);
        // An empty directory is taken; one with anything in it is refused.
        fs::create_dir(&dir).unwrap();
        drop(ImageWriter::create(&dir).unwrap());
        fs::write(dir.join("keep"), b"x").unwrap();
        assert!(matches!(
            ImageWriter::create(&dir),
            Err(ImageError::Exists { .. })
        ));
        assert_eq!(fs::read(dir.join("keep")).unwrap(), b"x");
    }

    #[test]
    fn stale_tmp_dirs_of_dead_dumpers_are_removed() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("ck");
        // pid_max is at most 4194304, so this pid cannot exist.
        let stale = t.path().join("ck.tmp.4194305");
        fs::create_dir(&stale).unwrap();
        let live = t.path().join("ck.tmp.1");
        fs::create_dir(&live).unwrap();
        let w = ImageWriter::create(&dir).unwrap();
        assert!(!stale.exists(), "stale temporary dir kept");
        assert!(live.exists(), "temporary dir of a live pid removed");
        drop(w);
    }

    #[test]
    fn truncated_or_tampered_file_is_named() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("ck");
        let mut w = ImageWriter::create(&dir).unwrap();
        w.write_raw("ghost-0.img", &[7u8; 10000]).unwrap();
        w.commit(Manifest::default(), &key()).unwrap();
        let g = dir.join("ghost-0.img");
        let mut bytes = fs::read(&g).unwrap();
        bytes[5000] ^= 1;
        fs::write(&g, &bytes).unwrap();
        let e = ImageDir::open(&dir, &key()).err().unwrap();
        assert!(e.to_string().contains("ghost-0.img"), "{e}");
        assert!(matches!(e, ImageError::Checksum { .. }));
        fs::write(&g, &bytes[..100]).unwrap();
        let e = ImageDir::open(&dir, &key()).err().unwrap();
        assert!(matches!(e, ImageError::Size { .. }), "{e}");
    }

    /// A committed checkpoint with one ghost file, under `t`.
    fn committed(t: &Path) -> PathBuf {
        let dir = t.join("ck");
        let mut w = ImageWriter::create(&dir).unwrap();
        w.write_raw("ghost-0.img", b"ghost").unwrap();
        w.commit(Manifest::default(), &key()).unwrap();
        dir
    }

    #[test]
    fn modes_are_private_whatever_the_umask() {
        let t = tempfile::tempdir().unwrap();
        // umask is per process; this test only needs it while it writes.
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        let dir = committed(t.path());
        nix::sys::stat::umask(old);
        assert_eq!(
            fs::metadata(&dir).unwrap().permissions().mode() & 0o7777,
            0o700
        );
        for e in fs::read_dir(&dir).unwrap() {
            let m = e.unwrap().metadata().unwrap();
            assert_eq!(m.permissions().mode() & 0o7777, 0o600);
            assert_eq!(m.uid(), sys::euid());
        }
    }

    #[test]
    fn unsealed_or_foreign_manifests_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let dir = committed(t.path());
        let other = ImageKey::from_secret(Path::new("other.key"), [4; crate::seal::KEY_LEN]);
        let e = ImageDir::open(&dir, &other).err().unwrap();
        assert!(
            matches!(
                e,
                ImageError::NotSealed {
                    why: SealFailure::OtherKey,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("manifest.img: not sealed by this site's key (other.key)"),
            "{e}"
        );
        let m = dir.join(MANIFEST_NAME);
        let mut bytes = fs::read(&m).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        fs::write(&m, &bytes).unwrap();
        let e = ImageDir::open(&dir, &key()).err().unwrap();
        assert!(
            matches!(
                e,
                ImageError::NotSealed {
                    why: SealFailure::Mismatch,
                    ..
                }
            ),
            "{e}"
        );
        fs::remove_file(dir.join(SEAL_NAME)).unwrap();
        let e = ImageDir::open(&dir, &key()).err().unwrap();
        assert!(
            matches!(
                e,
                ImageError::NotSealed {
                    why: SealFailure::Missing,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn a_file_changed_in_place_fails_the_digest() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("ck");
        let original = [0x5au8; 64];
        let mut w = ImageWriter::create(&dir).unwrap();
        w.write_raw("ghost-0.img", &original).unwrap();
        w.commit(Manifest::default(), &key()).unwrap();
        // Same length, same owner and mode, other content: what the seal
        // must catch.
        let mut forged = original;
        forged[40] ^= 1;
        fs::write(dir.join("ghost-0.img"), forged).unwrap();
        let e = ImageDir::open(&dir, &key()).err().unwrap();
        assert!(matches!(e, ImageError::Checksum { .. }), "{e}");
    }

    #[test]
    fn links_fifos_and_devices_are_refused_without_blocking() {
        let t = tempfile::tempdir().unwrap();
        let dir = committed(t.path());
        let g = dir.join("ghost-0.img");
        fs::remove_file(&g).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &g).unwrap();
        let e = ImageDir::open(&dir, &key()).err().unwrap();
        assert!(matches!(e, ImageError::NotRegular { .. }), "{e}");
        assert!(e.to_string().contains("ghost-0.img"), "{e}");
        fs::remove_file(&g).unwrap();
        nix::unistd::mkfifo(&g, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let e = ImageDir::open(&dir, &key()).err().unwrap();
        assert!(matches!(e, ImageError::NotRegular { .. }), "{e}");
        fs::remove_file(&g).unwrap();
        fs::remove_file(dir.join(MANIFEST_NAME)).unwrap();
        nix::unistd::mkfifo(
            &dir.join(MANIFEST_NAME),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        let e = ImageDir::open(&dir, &key()).err().unwrap();
        assert!(matches!(e, ImageError::NotRegular { .. }), "{e}");
    }

    #[test]
    fn files_others_can_write_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let dir = committed(t.path());
        let g = dir.join("ghost-0.img");
        fs::set_permissions(&g, fs::Permissions::from_mode(0o666)).unwrap();
        let e = ImageDir::open(&dir, &key()).err().unwrap();
        assert!(matches!(e, ImageError::Unsafe { .. }), "{e}");
    }

    #[test]
    fn a_swapped_tmp_dir_is_not_committed_nor_written_through() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("ck");
        let elsewhere = t.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        let mut w = ImageWriter::create(&dir).unwrap();
        w.write_raw("ghost-0.img", b"ghost").unwrap();
        let moved = t.path().join("moved");
        fs::rename(w.tmp_dir(), &moved).unwrap();
        std::os::unix::fs::symlink(&elsewhere, w.tmp_dir()).unwrap();
        let tmp = w.tmp_dir().to_path_buf();
        let e = w.commit(Manifest::default(), &key()).err().unwrap();
        assert!(matches!(e, ImageError::Hijacked { .. }), "{e}");
        assert_eq!(
            fs::read_dir(&elsewhere).unwrap().count(),
            0,
            "written through the symlink"
        );
        assert!(dir.symlink_metadata().is_err(), "something was committed");
        assert!(
            tmp.symlink_metadata().unwrap().file_type().is_symlink(),
            "the other user's link was touched"
        );
        assert_eq!(
            fs::read_dir(&moved).unwrap().count(),
            0,
            "our files were left behind"
        );
    }

    #[test]
    fn committed_checkpoint_is_verified_by_identity() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("ck");
        let mut w = ImageWriter::create(&dir).unwrap();
        w.write_raw("ghost-0.img", b"ghost").unwrap();
        let c = w.commit(Manifest::default(), &key()).unwrap();
        c.verify(&key()).unwrap();
        fs::rename(&dir, t.path().join("away")).unwrap();
        std::os::unix::fs::symlink(t.path().join("away"), &dir).unwrap();
        let e = c.verify(&key()).err().unwrap();
        assert!(matches!(e, ImageError::Hijacked { .. }), "{e}");
        fs::remove_file(&dir).unwrap();
        fs::rename(t.path().join("away"), &dir).unwrap();
        c.verify(&key()).unwrap();
        fs::remove_file(dir.join("ghost-0.img")).unwrap();
        assert!(c.verify(&key()).is_err());
    }

    #[test]
    fn process_lists_that_are_no_tree_are_refused() {
        use crate::manifest::ProcessEntry;
        let t = tempfile::tempdir().unwrap();
        let dir = committed(t.path());
        let mut d = ImageDir::open(&dir, &key()).unwrap();
        let entry = |pid, ppid| ProcessEntry {
            pid,
            ppid,
            ..Default::default()
        };
        d.manifest.root_pid = 10;
        d.manifest.processes = vec![entry(10, 1), entry(11, 10), entry(12, 11)];
        d.check_tree().unwrap();
        for (processes, says) in [
            (vec![entry(10, 1), entry(10, 1)], "lists pid 10 twice"),
            (
                vec![entry(10, 1), entry(11, 10), entry(11, 10)],
                "lists pid 11 twice",
            ),
            (
                vec![entry(10, 1), entry(12, 11), entry(11, 10)],
                "before its parent 11",
            ),
            (
                vec![entry(11, 10), entry(10, 1)],
                "root process is not listed first",
            ),
            (vec![], "root process is not listed first"),
        ] {
            d.manifest.processes = processes;
            let e = d.check_tree().unwrap_err();
            assert!(e.to_string().contains(says), "{e}");
        }
        // 100,000 copies of the root: refused at the second.
        d.manifest.processes = vec![entry(10, 1); 100_000];
        assert!(d.check_tree().is_err());
    }

    #[test]
    fn stale_cleanup_follows_no_links_and_spares_other_owners() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("target");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("precious"), b"x").unwrap();
        std::os::unix::fs::symlink(&target, t.path().join("ck.tmp.4194305")).unwrap();
        let foreign = t.path().join("ck.tmp.4194306");
        fs::create_dir(&foreign).unwrap();
        fs::write(foreign.join("theirs"), b"x").unwrap();
        let foreign_owner = if sys::euid() == 0 {
            std::os::unix::fs::chown(&foreign, Some(65534), None).unwrap();
            true
        } else {
            false
        };
        let w = ImageWriter::create(&t.path().join("ck")).unwrap();
        drop(w);
        assert!(target.join("precious").exists(), "followed a symlink");
        if foreign_owner {
            assert!(
                foreign.join("theirs").exists(),
                "removed another user's files"
            );
        }
    }

    #[test]
    fn sweep_removes_dead_dumpers_dirs_and_says_why_it_keeps_others() {
        let t = tempfile::tempdir().unwrap();
        let target = t.path().join("target");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("precious"), b"x").unwrap();
        // pid_max is at most 4194304: these dumpers cannot run.
        let dead = t.path().join("a.tmp.4194305");
        fs::create_dir(&dead).unwrap();
        fs::write(dead.join("pages-1.img"), b"x").unwrap();
        std::os::unix::fs::symlink(&target, t.path().join("b.tmp.4194306")).unwrap();
        fs::create_dir(t.path().join("c.tmp.1")).unwrap();
        fs::create_dir(t.path().join("d.tmp.x")).unwrap();
        let foreign = t.path().join("e.tmp.4194307");
        fs::create_dir(&foreign).unwrap();
        let foreign_owner = sys::euid() == 0;
        if foreign_owner {
            std::os::unix::fs::chown(&foreign, Some(65534), None).unwrap();
        }
        let found = sweep_stale_tmp_dirs(t.path()).unwrap();
        let outcome = |n: &str| {
            found
                .iter()
                .find(|f| f.name == n)
                .map(|f| f.outcome.clone())
        };
        assert_eq!(outcome("a.tmp.4194305"), Some(SweepOutcome::Removed));
        assert!(!dead.exists());
        assert_eq!(outcome("b.tmp.4194306"), Some(SweepOutcome::NotADirectory));
        assert!(target.join("precious").exists(), "followed a symlink");
        assert_eq!(outcome("c.tmp.1"), Some(SweepOutcome::DumperAlive));
        assert_eq!(outcome("d.tmp.x"), None);
        if foreign_owner {
            assert_eq!(
                outcome("e.tmp.4194307"),
                Some(SweepOutcome::OtherOwner { uid: 65534 })
            );
            assert!(foreign.exists());
        }
        assert_eq!(
            dumper_tmp_name(OsStr::new("ck.tmp.5.tmp.77")),
            Some((OsStr::new("ck.tmp.5"), 77))
        );
        assert_eq!(dumper_tmp_name(OsStr::new(".tmp.77")), None);
    }
}
