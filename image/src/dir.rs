//! Writing a checkpoint directory atomically and reading it back verified.
//!
//! Writing: every file goes into `DIR.tmp.<ckpt-pid>` and is fsynced; the
//! manifest (with a checksum of every file) is written last, then the
//! directory is fsynced and renamed to `DIR`, and the parent is fsynced. A
//! dump that fails or is killed leaves at most the temporary directory
//! (removed on the error path, and by the next dump) and never touches an
//! existing `DIR`.
//!
//! Reading: [`ImageDir::open`] decodes the manifest and then checks the size
//! and CRC32C of every file it lists, before the caller touches the system.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::MANIFEST_NAME;
use crate::error::ImageError;
use crate::header::{self, ImageKind};
use crate::manifest::{FileDigest, Manifest};

/// Builds a checkpoint directory under a temporary name.
pub struct ImageWriter {
    final_dir: PathBuf,
    tmp_dir: PathBuf,
    digests: Vec<FileDigest>,
    committed: bool,
}

impl ImageWriter {
    /// Starts a checkpoint that will become `dir`. Fails if `dir` exists.
    pub fn create(dir: &Path) -> Result<Self, ImageError> {
        if dir.symlink_metadata().is_ok() {
            return Err(ImageError::Exists { path: dir.into() });
        }
        let mut tmp = dir.as_os_str().to_owned();
        tmp.push(format!(".tmp.{}", std::process::id()));
        let tmp_dir = PathBuf::from(tmp);
        remove_stale_tmp_dirs(dir);
        // A leftover from an earlier dumper that died with our pid is ours to discard.
        if tmp_dir.exists() {
            fs::remove_dir_all(&tmp_dir)
                .map_err(|e| ImageError::io(&tmp_dir, "remove stale temporary dir", e))?;
        }
        fs::create_dir_all(&tmp_dir).map_err(|e| ImageError::io(&tmp_dir, "create", e))?;
        Ok(ImageWriter {
            final_dir: dir.into(),
            tmp_dir,
            digests: Vec::new(),
            committed: false,
        })
    }

    /// The temporary directory files are written to.
    pub fn tmp_dir(&self) -> &Path {
        &self.tmp_dir
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
        let path = self.tmp_dir.join(name);
        let mut f = create_file(&path)?;
        f.write_all(bytes)
            .map_err(|e| ImageError::io(&path, "write", e))?;
        f.sync_all()
            .map_err(|e| ImageError::io(&path, "fsync", e))?;
        self.digests.push(FileDigest {
            name: name.into(),
            size: bytes.len() as u64,
            crc32c: crc32c::crc32c(bytes),
        });
        Ok(())
    }

    /// Opens a page-data file that may be filled from many threads.
    pub fn pages(&self, name: &str) -> Result<PagesWriter, ImageError> {
        let path = self.tmp_dir.join(name);
        let file = create_file(&path)?;
        Ok(PagesWriter {
            name: name.into(),
            path,
            file,
            chunks: Mutex::new(Vec::new()),
        })
    }

    /// Syncs a page file and records its checksum.
    pub fn finish_pages(&mut self, pages: PagesWriter) -> Result<(), ImageError> {
        let digest = pages.finish()?;
        self.digests.push(digest);
        Ok(())
    }

    /// Writes the manifest, syncs and renames the directory into place.
    pub fn commit(mut self, mut manifest: Manifest) -> Result<PathBuf, ImageError> {
        manifest.files = std::mem::take(&mut self.digests);
        let bytes = header::encode(ImageKind::Manifest, &manifest);
        let path = self.tmp_dir.join(MANIFEST_NAME);
        let mut f = create_file(&path)?;
        f.write_all(&bytes)
            .map_err(|e| ImageError::io(&path, "write", e))?;
        f.sync_all()
            .map_err(|e| ImageError::io(&path, "fsync", e))?;
        sync_dir(&self.tmp_dir)?;
        fs::rename(&self.tmp_dir, &self.final_dir).map_err(|e| match e.raw_os_error() {
            Some(libc::EEXIST) | Some(libc::ENOTEMPTY) => ImageError::Exists {
                path: self.final_dir.clone(),
            },
            _ => ImageError::io(&self.final_dir, "rename into place", e),
        })?;
        self.committed = true;
        let parent = match self.final_dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        sync_dir(&parent)?;
        Ok(self.final_dir.clone())
    }
}

impl Drop for ImageWriter {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.tmp_dir);
        }
    }
}

/// Removes `DIR.tmp.<pid>` directories left by dumpers that were killed
/// (their pid no longer exists). Best effort: a failure only leaves litter.
fn remove_stale_tmp_dirs(dir: &Path) {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return;
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let prefix = format!("{}.tmp.", name.to_string_lossy());
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let file_name = e.file_name();
        let Some(pid) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

fn create_file(path: &Path) -> Result<File, ImageError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| ImageError::io(path, "create", e))
}

fn sync_dir(path: &Path) -> Result<(), ImageError> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(|e| ImageError::io(path, "fsync directory", e))
}

/// A page-data file written at explicit offsets, possibly from many
/// threads; the checksum is combined from per-chunk CRCs so the data is
/// never read back.
pub struct PagesWriter {
    name: String,
    path: PathBuf,
    file: File,
    chunks: Mutex<Vec<ChunkCrc>>,
}

#[derive(Clone, Copy)]
struct ChunkCrc {
    offset: u64,
    len: u64,
    crc: u32,
}

impl PagesWriter {
    /// Path of the file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `data` at `offset`. Chunks must not overlap and must end up
    /// covering the file from 0 without holes.
    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), ImageError> {
        self.file
            .write_all_at(data, offset)
            .map_err(|e| ImageError::io(&self.path, "write", e))?;
        let crc = crc32c::crc32c(data);
        self.chunks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(ChunkCrc {
                offset,
                len: data.len() as u64,
                crc,
            });
        Ok(())
    }

    fn finish(self) -> Result<FileDigest, ImageError> {
        self.file
            .sync_all()
            .map_err(|e| ImageError::io(&self.path, "fsync", e))?;
        let mut chunks = self.chunks.into_inner().unwrap_or_else(|p| p.into_inner());
        chunks.sort_by_key(|c| c.offset);
        let mut crc = 0u32;
        let mut size = 0u64;
        for c in &chunks {
            if c.offset != size {
                return Err(ImageError::Invalid {
                    path: self.path.clone(),
                    what: format!("page data has a hole or overlap at offset {}", size),
                });
            }
            crc = if size == 0 {
                c.crc
            } else {
                crc32c::crc32c_combine(crc, c.crc, c.len as usize)
            };
            size += c.len;
        }
        Ok(FileDigest {
            name: self.name,
            size,
            crc32c: crc,
        })
    }
}

/// A checkpoint directory opened for reading, with every file verified.
pub struct ImageDir {
    path: PathBuf,
    manifest: Manifest,
}

impl ImageDir {
    /// Opens `dir`, decodes its manifest and verifies the size and checksum
    /// of every file the manifest lists.
    pub fn open(dir: &Path) -> Result<Self, ImageError> {
        let meta = fs::metadata(dir).map_err(|e| ImageError::io(dir, "open checkpoint", e))?;
        if !meta.is_dir() {
            return Err(ImageError::Invalid {
                path: dir.into(),
                what: "not a directory".into(),
            });
        }
        let mpath = dir.join(MANIFEST_NAME);
        let bytes = read_limited(&mpath, header::MAX_PAYLOAD + header::HEADER_LEN as u64)?;
        let manifest: Manifest = header::decode(ImageKind::Manifest, &mpath, &bytes)?;
        let this = ImageDir {
            path: dir.into(),
            manifest,
        };
        for d in &this.manifest.files {
            this.verify(d)?;
        }
        Ok(this)
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
        if name.contains('/') {
            return Err(ImageError::Invalid {
                path: self.path.clone(),
                what: format!("file name {name:?} escapes the checkpoint directory"),
            });
        }
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

    /// Reads a file listed in the manifest, checking size and checksum again
    /// (it could have changed since [`ImageDir::open`]).
    pub fn read_raw(&self, name: &str) -> Result<Vec<u8>, ImageError> {
        let d = self.digest(name)?;
        let path = self.path.join(name);
        let bytes = read_limited(&path, d.size)?;
        if bytes.len() as u64 != d.size {
            return Err(ImageError::Size {
                path,
                found: bytes.len() as u64,
                expected: d.size,
            });
        }
        if crc32c::crc32c(&bytes) != d.crc32c {
            return Err(ImageError::Checksum { path });
        }
        Ok(bytes)
    }

    /// Opens a page file for reading; its size was checked against the manifest.
    pub fn open_pages(&self, name: &str) -> Result<File, ImageError> {
        let d = self.digest(name)?;
        open_sized(&self.path.join(name), d.size)
    }

    fn verify(&self, d: &FileDigest) -> Result<(), ImageError> {
        let path = self.path.join(&d.name);
        if d.name.contains('/') {
            return Err(ImageError::Invalid {
                path,
                what: "file name escapes the checkpoint directory".into(),
            });
        }
        let mut f = open_sized(&path, d.size)?;
        let mut buf = vec![0u8; 1 << 20];
        let mut crc = 0u32;
        loop {
            let n = f
                .read(&mut buf)
                .map_err(|e| ImageError::io(&path, "read", e))?;
            if n == 0 {
                break;
            }
            crc = crc32c::crc32c_append(crc, &buf[..n]);
        }
        if crc != d.crc32c {
            return Err(ImageError::Checksum { path });
        }
        Ok(())
    }
}

/// Opens `path` and checks it is exactly `size` bytes long.
fn open_sized(path: &Path, size: u64) -> Result<File, ImageError> {
    let f = File::open(path).map_err(|e| ImageError::io(path, "open", e))?;
    let len = f
        .metadata()
        .map_err(|e| ImageError::io(path, "stat", e))?
        .len();
    if len != size {
        return Err(ImageError::Size {
            path: path.into(),
            found: len,
            expected: size,
        });
    }
    Ok(f)
}

fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, ImageError> {
    let f = File::open(path).map_err(|e| ImageError::io(path, "open", e))?;
    let len = f
        .metadata()
        .map_err(|e| ImageError::io(path, "stat", e))?
        .len();
    if len > limit {
        return Err(ImageError::TooLarge {
            path: path.into(),
            len,
            limit,
        });
    }
    let mut bytes = Vec::with_capacity(len as usize);
    f.take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| ImageError::io(path, "read", e))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::task::Core;

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
        w.commit(Manifest::default()).unwrap();

        let d = ImageDir::open(&dir).unwrap();
        let back: Core = d.read_meta("core-42.img", ImageKind::Core).unwrap();
        assert_eq!(back, core);
        let mut all = vec![1u8; 4096];
        all.extend_from_slice(&[2u8; 4096]);
        assert_eq!(
            d.digest("pages-42.img").unwrap().crc32c,
            crc32c::crc32c(&all)
        );
        assert!(
            !t.path()
                .join(format!("ck.tmp.{}", std::process::id()))
                .exists()
        );
    }

    #[test]
    fn dropped_writer_leaves_nothing_and_existing_dir_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let dir = t.path().join("ck");
        {
            let mut w = ImageWriter::create(&dir).unwrap();
            w.write_raw("ghost-0.img", b"abc").unwrap();
        }
        assert_eq!(fs::read_dir(t.path()).unwrap().count(), 0);
        fs::create_dir(&dir).unwrap();
        assert!(matches!(
            ImageWriter::create(&dir),
            Err(ImageError::Exists { .. })
        ));
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
        w.commit(Manifest::default()).unwrap();
        let g = dir.join("ghost-0.img");
        let mut bytes = fs::read(&g).unwrap();
        bytes[5000] ^= 1;
        fs::write(&g, &bytes).unwrap();
        let e = ImageDir::open(&dir).err().unwrap();
        assert!(e.to_string().contains("ghost-0.img"), "{e}");
        assert!(matches!(e, ImageError::Checksum { .. }));
        fs::write(&g, &bytes[..100]).unwrap();
        let e = ImageDir::open(&dir).err().unwrap();
        assert!(matches!(e, ImageError::Size { .. }), "{e}");
    }
}
