//! The coordinator's Unix socket file (`ckpt coord --listen-unix PATH`), made safely.
//!
//! The coordinator runs as root, and the path comes from its command line, so the file it
//! creates, replaces and removes must be the one meant, whatever other users do:
//!
//! * the directory is opened once (`O_DIRECTORY | O_NOFOLLOW`) and must be owned by us
//!   and writable by nobody else, so no other user can add, swap or remove entries in it;
//!   every later step goes through that open directory (`/proc/self/fd/N/NAME`), never
//!   through the path again, so renaming a directory above it changes nothing;
//! * an existing entry of that name is replaced only if it is a socket, ours, and nobody
//!   is listening on it (a coordinator that died without cleaning up); anything else
//!   (a regular file, a symlink, another user's socket, a live coordinator) is refused;
//! * the socket is bound, made mode 0600 and only then listened on, so no connect can
//!   succeed while the file still has the umask's mode: only our user (root) can connect.
//!   A peer that can connect is still not trusted: it goes through the same handshake,
//!   caps and eviction rules as a TCP peer;
//! * the file is removed on exit, if it is still the one we bound (same device and inode).

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use crate::sys;

/// Mode of the socket file: connecting needs write permission, and only our user (root,
/// as the agents are) may connect.
const SOCKET_MODE: u32 = 0o600;
/// Permission bits that would let another user change the directory's entries.
const FOREIGN_WRITE: u32 = 0o022;
/// `sun_path` holds 108 bytes including the terminating NUL.
const SUN_PATH_MAX: usize = 107;

/// A bound socket file; removed on drop if it is still ours.
#[derive(Debug)]
pub(crate) struct SocketFile {
    /// The directory, held open: every access goes through it.
    dir: File,
    name: OsString,
    dev: u64,
    ino: u64,
}

fn refuse(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, why)
}

impl SocketFile {
    /// Creates (or replaces a stale one of ours) the socket file at `path` and listens on
    /// it with `backlog`; the listener is non-blocking.
    pub(crate) fn bind(path: &Path, backlog: i32) -> io::Result<(UnixListener, SocketFile)> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a path to a file",
            ));
        };
        if !path.is_absolute() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the socket path must be absolute",
            ));
        }
        let dir = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(parent)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "directory {}: {e} (it must be a real directory, not a symlink)",
                        parent.display()
                    ),
                )
            })?;
        let meta = dir.metadata()?;
        let me = sys::euid();
        if meta.uid() != me {
            return Err(refuse(format!(
                "directory {} belongs to uid {}, not to us (uid {me})",
                parent.display(),
                meta.uid()
            )));
        }
        if meta.mode() & FOREIGN_WRITE != 0 {
            return Err(refuse(format!(
                "directory {} is writable by group or others (mode {:o}): another user could replace the socket",
                parent.display(),
                meta.mode() & 0o7777
            )));
        }
        // dev/ino 0 until bound: no file has inode 0, so a drop before then removes nothing.
        let mut file = SocketFile {
            dir,
            name: name.to_os_string(),
            dev: 0,
            ino: 0,
        };
        let at = file.proc_path();
        if at.as_os_str().len() > SUN_PATH_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "socket file name too long",
            ));
        }
        file.clear_stale(path, me)?;
        let sock = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
        sock.bind(&socket2::SockAddr::unix(&at)?)?;
        // Nobody can connect before listen(): set the mode first.
        let bound = std::fs::symlink_metadata(&at)?;
        // From here a failure removes the file again (on drop).
        file.dev = bound.dev();
        file.ino = bound.ino();
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(SOCKET_MODE))?;
        sock.listen(backlog)?;
        sock.set_nonblocking(true)?;
        Ok((UnixListener::from(std::os::fd::OwnedFd::from(sock)), file))
    }

    /// The entry through the held directory descriptor.
    fn proc_path(&self) -> PathBuf {
        Path::new(&format!("/proc/self/fd/{}", self.dir.as_raw_fd())).join(&self.name)
    }

    /// Removes a stale socket of ours at the name; refuses anything else there.
    fn clear_stale(&self, path: &Path, me: u32) -> io::Result<()> {
        let at = self.proc_path();
        let old = match std::fs::symlink_metadata(&at) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        if !old.file_type().is_socket() {
            return Err(refuse(format!(
                "{} exists and is not a socket: not replacing it",
                path.display()
            )));
        }
        if old.uid() != me {
            return Err(refuse(format!(
                "{} is a socket of uid {}, not ours: not replacing it",
                path.display(),
                old.uid()
            )));
        }
        if UnixStream::connect(&at).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{} is in use by a running coordinator", path.display()),
            ));
        }
        std::fs::remove_file(&at)
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        let at = self.proc_path();
        if std::fs::symlink_metadata(&at).is_ok_and(|m| m.dev() == self.dev && m.ino() == self.ino)
        {
            let _ = std::fs::remove_file(&at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_is_private_replaced_only_when_stale_and_removed() {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let p = d.path().join("c.sock");
        let (l, f) = SocketFile::bind(&p, 16).unwrap();
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert!(m.file_type().is_socket());
        assert_eq!(m.mode() & 0o777, SOCKET_MODE);
        // Live: a second coordinator is refused.
        let e = SocketFile::bind(&p, 16).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AddrInUse, "{e}");
        // Stale (listener closed, file left behind as after a crash): replaced.
        drop(l);
        std::mem::forget(f);
        let (_l2, f2) = SocketFile::bind(&p, 16).unwrap();
        drop(f2);
        assert!(std::fs::symlink_metadata(&p).is_err(), "removed on drop");
        // Not a socket: refused and left alone.
        std::fs::write(&p, b"x").unwrap();
        assert!(SocketFile::bind(&p, 16).is_err());
        assert_eq!(std::fs::read(&p).unwrap(), b"x");
        std::fs::remove_file(&p).unwrap();
        // A symlink at the name: refused, its target untouched.
        let target = d.path().join("target");
        std::fs::write(&target, b"t").unwrap();
        std::os::unix::fs::symlink(&target, &p).unwrap();
        assert!(SocketFile::bind(&p, 16).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"t");
        std::fs::remove_file(&p).unwrap();
        // A directory others may write to: refused.
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert!(SocketFile::bind(&p, 16).is_err());
        // A symlinked directory: refused.
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let sub = d.path().join("real");
        std::fs::create_dir(&sub).unwrap();
        let link = d.path().join("link");
        std::os::unix::fs::symlink(&sub, &link).unwrap();
        assert!(SocketFile::bind(&link.join("c.sock"), 16).is_err());
    }
}
