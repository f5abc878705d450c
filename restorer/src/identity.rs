//! Is the file a restored process got the one it had? A file is reopened by
//! path, and a path is only a name: between dump and restore it can be
//! replaced (by a symbolic link to a secret, by a shorter file, by a patched
//! binary) or simply change (a log that kept growing). Each reopened file is
//! checked *after* it was opened, on what was actually opened (`fstat`
//! through `/proc/PID/fd/N`), so no rename in between can slip past the
//! check.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use ckpt_image::mm::FileId;

/// What a file looked like at dump time, as far as restore checks it.
pub struct Expected<'a> {
    /// `st_mode`: type and permission bits.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Which inode it was (compared on the dumping host only).
    pub inode: Inode,
    /// What is compared of the contents.
    pub contents: Contents<'a>,
}

/// A device and inode number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Inode {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

/// How the contents are compared.
pub enum Contents<'a> {
    /// Not at all: a directory (whose entries come and go), or a file the
    /// user said may change (`--allow-changed`).
    Any,
    /// Same size and modification time, and on the dumping host the same
    /// status change time too (which no one but root can set back, so a
    /// `touch -r` after an edit does not hide it).
    Unmodified {
        /// Size in bytes.
        size: u64,
        /// Modification time, ns since the epoch.
        mtime_ns: i64,
        /// Status change time, ns since the epoch, if recorded.
        ctime_ns: Option<i64>,
    },
    /// At least as long as it was, its times free to move: a file the
    /// process only reads (a log it follows, as `tail -f` does), which
    /// others may have appended to since; the process reads on from its
    /// offset, as it would have had it run on. A shorter file is refused:
    /// what the process had read is gone and its offset may lie past the
    /// end.
    Grown {
        /// Size in bytes at the dump.
        size: u64,
    },
    /// Same bytes (private mappings of code and libraries). Owner, mode,
    /// inode and times are not compared: the bytes are all that reaches
    /// the process, and a byte-identical copy is as good as the original.
    Sha256 {
        /// Size in bytes (checked first; cheaper than hashing).
        size: u64,
        /// The digest.
        digest: &'a [u8],
    },
}

/// Why a file is not the one the process had, in words for an error.
#[derive(Debug)]
pub struct Mismatch(pub String);

/// Where restore runs relative to the dump, and what it already hashed.
pub struct FileChecks {
    /// Restoring on the host that dumped (its manifest's hostname is this
    /// host's): device and inode numbers still mean the same files.
    pub same_host: bool,
    hashes: HashMap<HashKey, Vec<u8>>,
}

/// A hashed file, unchanged since it was hashed.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct HashKey {
    inode: Inode,
    size: u64,
    mtime_ns: i64,
    ctime_ns: i64,
}

impl FileChecks {
    /// Checks for a restore whose image was dumped on `dumped_on`.
    pub fn new(dumped_on: &str) -> Self {
        let here = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        FileChecks {
            same_host: !dumped_on.is_empty() && here.trim() == dumped_on,
            hashes: HashMap::new(),
        }
    }

    /// Compares the file opened at `opened` (a `/proc/PID/fd/N` link)
    /// with what was recorded.
    pub fn verify(&mut self, opened: &Path, want: &Expected<'_>) -> Result<(), Mismatch> {
        let found = std::fs::metadata(opened)
            .map_err(|e| Mismatch(format!("cannot stat the reopened file: {e}")))?;
        let got_type = found.mode() & libc::S_IFMT;
        let want_type = want.mode & libc::S_IFMT;
        if got_type != want_type {
            return Err(Mismatch(format!(
                "is now a {}, was a {}",
                type_name(got_type),
                type_name(want_type)
            )));
        }
        if let Contents::Sha256 { size, digest } = want.contents {
            if found.size() != size {
                return Err(Mismatch(format!(
                    "changed since the dump (size {size} -> {})",
                    found.size()
                )));
            }
            let got = self.sha256(opened, &found)?;
            if got != digest {
                return Err(Mismatch(
                    "contents changed since the dump (SHA-256 differs)".into(),
                ));
            }
            return Ok(());
        }
        if (found.uid(), found.gid()) != (want.uid, want.gid) {
            return Err(Mismatch(format!(
                "owner changed since the dump (uid:gid {}:{} -> {}:{})",
                want.uid,
                want.gid,
                found.uid(),
                found.gid()
            )));
        }
        if found.mode() & PERMISSION_BITS != want.mode & PERMISSION_BITS {
            return Err(Mismatch(format!(
                "mode changed since the dump ({:04o} -> {:04o})",
                want.mode & PERMISSION_BITS,
                found.mode() & PERMISSION_BITS
            )));
        }
        let inode = Inode {
            dev: found.dev(),
            ino: found.ino(),
        };
        if self.same_host && inode != want.inode {
            return Err(Mismatch(format!(
                "replaced by another file since the dump (inode {} -> {})",
                want.inode.ino, inode.ino
            )));
        }
        if let Contents::Grown { size } = want.contents
            && found.size() < size
        {
            return Err(Mismatch(format!(
                "shorter than at the dump (size {size} -> {})",
                found.size()
            )));
        }
        if let Contents::Unmodified {
            size,
            mtime_ns,
            ctime_ns,
        } = want.contents
        {
            if found.size() != size {
                return Err(Mismatch(format!(
                    "changed since the dump (size {size} -> {})",
                    found.size()
                )));
            }
            let ctime_moved = self.same_host && ctime_ns.is_some_and(|c| c != ctime_of(&found));
            if mtime_of(&found) != mtime_ns || ctime_moved {
                return Err(Mismatch(
                    "modified since the dump (same size, but its modification or change time moved)"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    fn sha256(&mut self, opened: &Path, m: &std::fs::Metadata) -> Result<Vec<u8>, Mismatch> {
        let key = HashKey {
            inode: Inode {
                dev: m.dev(),
                ino: m.ino(),
            },
            size: m.size(),
            mtime_ns: mtime_of(m),
            ctime_ns: ctime_of(m),
        };
        if let Some(h) = self.hashes.get(&key) {
            return Ok(h.clone());
        }
        let h = std::fs::File::open(opened)
            .and_then(FileId::content_sha256)
            .map_err(|e| Mismatch(format!("cannot read it to compare its contents: {e}")))?;
        self.hashes.insert(key, h.clone());
        Ok(h)
    }
}

/// Permission bits of `st_mode` (setuid, setgid, sticky, rwx).
pub const PERMISSION_BITS: u32 = 0o7777;
const NANOS_PER_SEC: i64 = 1_000_000_000;

fn mtime_of(m: &std::fs::Metadata) -> i64 {
    m.mtime() * NANOS_PER_SEC + m.mtime_nsec()
}

fn ctime_of(m: &std::fs::Metadata) -> i64 {
    m.ctime() * NANOS_PER_SEC + m.ctime_nsec()
}

fn type_name(file_type: u32) -> &'static str {
    match file_type {
        libc::S_IFREG => "regular file",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symbolic link",
        libc::S_IFCHR => "character device",
        libc::S_IFBLK => "block device",
        libc::S_IFIFO => "FIFO",
        libc::S_IFSOCK => "socket",
        _ => "file of unknown type",
    }
}
