//! Paths ckpt writes as root (a pid file, a stats or log file, the parent
//! of a checkpoint), resolved without following a link a user controls.
//!
//! The kernel follows every symlink of a path, so a user who owns any
//! directory on it (`/tmp/u/d` a link to `/etc`) could make root replace
//! `/etc/passwd`. Here the path is walked one component at a time from `/`
//! (or the working directory) through `O_PATH` directory fds, and a
//! symlink is followed only if root or ckpt's own user owns it: such a
//! link says what its owner meant (Debian's `/var/run -> /run`), while
//! one of anybody else's is refused, naming it and its owner. The last
//! component is never followed: callers open or replace it through the
//! directory fd with `O_NOFOLLOW`.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use crate::sys::{self, FileType};

/// How many symlinks one path may go through, as the kernel allows
/// (`MAXSYMLINKS`): more is a loop (`ELOOP`).
pub const MAX_LINKS: u32 = 40;

/// Why a path ckpt was to write through was refused. Every variant names
/// the path as given.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// A symlink on the path belongs to another user, who could point it
    /// anywhere.
    #[error(
        "{path}: {link} is a symbolic link owned by uid {owner}, neither root nor ckpt's user; refusing to follow it"
    )]
    UntrustedLink {
        /// The path as given.
        path: PathBuf,
        /// The link, as reached on the path.
        link: PathBuf,
        /// The link's owner.
        owner: u32,
    },
    /// More than [`MAX_LINKS`] symlinks: a loop.
    #[error("{path}: more than {MAX_LINKS} symbolic links (a loop?)")]
    TooManyLinks {
        /// The path as given.
        path: PathBuf,
    },
    /// A component that must be a directory is something else.
    #[error("{path}: {at} is a {found}, not a directory")]
    NotADirectory {
        /// The path as given.
        path: PathBuf,
        /// The component, as reached on the path.
        at: PathBuf,
        /// What it is.
        found: &'static str,
    },
    /// The path ends in `..`, `/` or nothing: no file name to write.
    #[error("{path}: does not end in a file name")]
    NoName {
        /// The path as given.
        path: PathBuf,
    },
    /// The file to write is not a regular file (a FIFO would block, a
    /// device be clobbered, a symlink lead anywhere).
    #[error("{path}: is a {found}, not a regular file; refused")]
    NotRegular {
        /// The path as given.
        path: PathBuf,
        /// What it is.
        found: &'static str,
    },
    /// The file to write has other names: one could be another user's
    /// hard link to a file of root's.
    #[error("{path}: has {links} hard links; refusing to write a file that has other names")]
    HardLinked {
        /// The path as given.
        path: PathBuf,
        /// Its link count.
        links: u64,
    },
    /// The OS refused a step.
    #[error("{path}: cannot {op} {at}")]
    Io {
        /// The path as given.
        path: PathBuf,
        /// The component the step was on.
        at: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl PathError {
    /// The path as given.
    pub fn path(&self) -> &Path {
        match self {
            PathError::UntrustedLink { path, .. }
            | PathError::TooManyLinks { path }
            | PathError::NotADirectory { path, .. }
            | PathError::NoName { path }
            | PathError::NotRegular { path, .. }
            | PathError::HardLinked { path, .. }
            | PathError::Io { path, .. } => path,
        }
    }
}

/// One step of a walk.
enum Step {
    /// Back to `/` (an absolute link target).
    Root,
    /// `..`: the parent of the directory reached so far.
    Parent,
    /// A name inside the directory reached so far.
    Name(OsString),
}

/// The steps of `path`, in order (`.` components are no steps).
fn steps(path: &Path) -> impl Iterator<Item = Step> + '_ {
    path.components().filter_map(|c| match c {
        Component::RootDir => Some(Step::Root),
        Component::ParentDir => Some(Step::Parent),
        Component::Normal(n) => Some(Step::Name(n.to_owned())),
        Component::CurDir | Component::Prefix(_) => None,
    })
}

/// Whether ckpt may follow a symlink owned by `owner`: root's and its own
/// user's links are theirs to aim; anyone else's could aim root's writes
/// at any file.
fn trusted_owner(owner: u32) -> bool {
    owner == 0 || owner == sys::euid()
}

/// Opens directory `dir` (an `O_PATH` fd), following only symlinks owned
/// by root or ckpt's user. `path` is what the caller was given, for
/// messages.
fn walk(path: &Path, dir: &Path) -> Result<OwnedFd, PathError> {
    let io = |at: &Path, op: &'static str, source| PathError::Io {
        path: path.into(),
        at: at.into(),
        op,
        source,
    };
    let absolute = dir.is_absolute();
    let mut reached = if absolute {
        PathBuf::from("/")
    } else {
        PathBuf::new()
    };
    let mut cur = sys::open_walk_start(absolute)
        .map_err(|e| io(Path::new(if absolute { "/" } else { "." }), "open", e))?;
    let mut todo: VecDeque<Step> = steps(dir).collect();
    let mut links = 0;
    while let Some(step) = todo.pop_front() {
        let name = match step {
            Step::Root => {
                reached = PathBuf::from("/");
                cur = sys::open_walk_start(true).map_err(|e| io(&reached, "open", e))?;
                continue;
            }
            Step::Parent => OsString::from(".."),
            Step::Name(n) => n,
        };
        let at = reached.join(&name);
        let next = sys::open_path_at(cur.as_fd(), &name).map_err(|e| io(&at, "open", e))?;
        let st = sys::stat_fd(next.as_fd()).map_err(|e| io(&at, "stat", e))?;
        match FileType::of(&st) {
            FileType::Directory => {
                cur = next;
                reached = at;
            }
            FileType::Symlink => {
                if !trusted_owner(st.st_uid) {
                    return Err(PathError::UntrustedLink {
                        path: path.into(),
                        link: at,
                        owner: st.st_uid,
                    });
                }
                links += 1;
                if links > MAX_LINKS {
                    return Err(PathError::TooManyLinks { path: path.into() });
                }
                // Read from the link just checked, not by name: it may have
                // been swapped since.
                let target = sys::read_link_fd(next.as_fd()).map_err(|e| io(&at, "read", e))?;
                if target.is_empty() {
                    // As the kernel: an empty link leads nowhere.
                    return Err(io(&at, "follow", std::io::ErrorKind::NotFound.into()));
                }
                let target = PathBuf::from(target);
                // The target's steps go first, from the link's directory
                // (`cur`) or from `/`.
                for s in steps(&target).collect::<Vec<_>>().into_iter().rev() {
                    todo.push_front(s);
                }
            }
            other => {
                return Err(PathError::NotADirectory {
                    path: path.into(),
                    at,
                    found: other.name(),
                });
            }
        }
    }
    Ok(cur)
}

/// Opens directory `path` for reading (it can be listed and fsynced),
/// following only symlinks owned by root or ckpt's user.
pub fn open_dir(path: &Path) -> Result<OwnedFd, PathError> {
    let dir = walk(path, path)?;
    sys::reopen_dir(dir.as_fd()).map_err(|source| PathError::Io {
        path: path.into(),
        at: path.into(),
        op: "open",
        source,
    })
}

/// The directory a path to write names, reached without following a
/// symlink a user controls, and the last component's name in it (not yet
/// looked at: the caller opens it through the directory fd with
/// `O_NOFOLLOW`).
#[derive(Debug)]
pub struct TrustedParent {
    path: PathBuf,
    dir: OwnedFd,
    name: OsString,
}

impl TrustedParent {
    /// Resolves the directory of `path` (see the module's doc).
    pub fn resolve(path: &Path) -> Result<TrustedParent, PathError> {
        let name = path
            .file_name()
            .ok_or_else(|| PathError::NoName { path: path.into() })?
            .to_owned();
        let parent = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let dir = walk(path, parent)?;
        Ok(TrustedParent {
            path: path.into(),
            dir,
            name,
        })
    }

    /// The path as given (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory, an `O_PATH` fd (usable with the `*at` calls).
    pub fn dir(&self) -> BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// The last component of the path.
    pub fn name(&self) -> &OsStr {
        &self.name
    }

    /// The directory fd and the last component's name.
    pub fn into_parts(self) -> (OwnedFd, OsString) {
        (self.dir, self.name)
    }

    fn io(&self, op: &'static str, source: std::io::Error) -> PathError {
        PathError::Io {
            path: self.path.clone(),
            at: self.path.clone(),
            op,
            source,
        }
    }

    /// Replaces the file with `contents` at once: written to a new
    /// temporary file (`O_EXCL|O_NOFOLLOW`, mode `mode`) in the directory
    /// and renamed over the name there, so a reader never sees a partial
    /// file and a symlink at the name is replaced, never followed.
    pub fn replace_with(&self, contents: &[u8], mode: u32) -> Result<(), PathError> {
        self.check_caller_may_write()?;
        let mut tmp = self.name.clone();
        tmp.push(format!(".tmp.{}", std::process::id()));
        let mut f = sys::create_new_at(self.dir(), &tmp, mode)
            .map_err(|e| self.io("create a temporary file beside", e))?;
        let written = self
            .give_to_caller(f.as_fd())
            .and_then(|()| f.write_all(contents).map_err(|e| self.io("write", e)))
            .and_then(|()| {
                sys::rename_replacing_at(self.dir(), &tmp, &self.name)
                    .map_err(|e| self.io("rename into place", e))
            });
        if written.is_err() {
            let _ = sys::unlink_at(self.dir(), &tmp);
        }
        written
    }

    /// Opens the file for writing from its start, emptied: created with
    /// `mode` if missing; an existing one must be a regular file with no
    /// other name. Never through a symlink, never blocking on a FIFO.
    pub fn open_truncated(&self, mode: u32) -> Result<File, PathError> {
        self.check_caller_may_write()?;
        let not_regular = |found: FileType| PathError::NotRegular {
            path: self.path.clone(),
            found: found.name(),
        };
        // Looked at first so a FIFO or device is refused by its type,
        // without opening it at all.
        match sys::stat_at(self.dir(), &self.name) {
            Ok(st) if FileType::of(&st) != FileType::Regular => {
                return Err(not_regular(FileType::of(&st)));
            }
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
            Err(e) => return Err(self.io("stat", e)),
        }
        let f = sys::open_for_writing_at(self.dir(), &self.name, mode).map_err(|e| {
            match e.raw_os_error() {
                // O_NOFOLLOW: a symlink swapped in since the look.
                Some(libc::ELOOP) => not_regular(FileType::Symlink),
                _ => self.io("open", e),
            }
        })?;
        let st = sys::stat_fd(f.as_fd()).map_err(|e| self.io("stat", e))?;
        let kind = FileType::of(&st);
        if kind != FileType::Regular {
            return Err(not_regular(kind));
        }
        if st.st_nlink > 1 {
            return Err(PathError::HardLinked {
                path: self.path.clone(),
                links: st.st_nlink,
            });
        }
        sys::set_blocking(f.as_fd()).map_err(|e| self.io("open", e))?;
        f.set_len(0).map_err(|e| self.io("truncate", e))?;
        self.give_to_caller(f.as_fd())?;
        Ok(f)
    }

    /// Acting for a caller (the ckpt service's worker), root writes here
    /// only what the caller could: a name in a directory the caller may
    /// create names in, and not over a file of someone else's (in a
    /// sticky directory such as /tmp the caller could not replace it).
    fn check_caller_may_write(&self) -> Result<(), PathError> {
        let Some(caller) = crate::caller::acting_for() else {
            return Ok(());
        };
        let refuse = |why: String| {
            self.io(
                "write",
                std::io::Error::new(std::io::ErrorKind::PermissionDenied, why),
            )
        };
        let dir = sys::stat_fd(self.dir()).map_err(|e| self.io("stat", e))?;
        if !caller.may_create_in(dir.st_uid, dir.st_gid, dir.st_mode & 0o7777) {
            return Err(refuse(format!(
                "{caller} may not create files in its directory (owner uid {}, mode {:o})",
                dir.st_uid,
                dir.st_mode & 0o7777
            )));
        }
        match sys::stat_at(self.dir(), &self.name) {
            Ok(st) if st.st_uid != caller.uid => Err(refuse(format!(
                "exists and is uid {}'s, not {caller}'s",
                st.st_uid
            ))),
            _ => Ok(()),
        }
    }

    /// Acting for a caller, gives a file root just created for them to them.
    fn give_to_caller(&self, fd: BorrowedFd<'_>) -> Result<(), PathError> {
        match crate::caller::acting_for() {
            Some(c) => sys::chown_fd(fd, c.uid, c.gid).map_err(|e| self.io("chown", e)),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::{MetadataExt, symlink};

    /// A uid that is neither root nor ckpt's user.
    const OTHER: u32 = 65534;

    /// Whether links can be given to another user (the tests of refusals
    /// need root).
    fn as_root() -> bool {
        sys::euid() == 0
    }

    fn give_link(link: &Path, uid: u32) {
        std::os::unix::fs::lchown(link, Some(uid), None).unwrap();
    }

    #[test]
    fn a_link_of_another_user_in_the_middle_is_refused() {
        if !as_root() {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let victim_dir = t.path().join("root-only");
        fs::create_dir(&victim_dir).unwrap();
        fs::write(victim_dir.join("passwd"), "root's").unwrap();
        let user_dir = t.path().join("user");
        fs::create_dir(&user_dir).unwrap();
        let link = user_dir.join("d");
        symlink(&victim_dir, &link).unwrap();
        give_link(&link, OTHER);
        let path = link.join("passwd");
        let e = TrustedParent::resolve(&path).unwrap_err();
        assert!(
            matches!(&e, PathError::UntrustedLink { link: l, owner: OTHER, .. } if *l == link),
            "{e}"
        );
        let text = e.to_string();
        assert!(text.starts_with(&format!("{}: ", path.display())), "{text}");
        assert!(text.contains(&format!("uid {OTHER}")), "{text}");
        // A link reached through a followed one is checked too.
        let mine = t.path().join("mine");
        symlink(&user_dir, &mine).unwrap();
        assert!(matches!(
            TrustedParent::resolve(&mine.join("d/passwd")),
            Err(PathError::UntrustedLink { .. })
        ));
        assert!(matches!(
            open_dir(&link),
            Err(PathError::UntrustedLink { .. })
        ));
        assert_eq!(
            fs::read_to_string(victim_dir.join("passwd")).unwrap(),
            "root's"
        );
    }

    #[test]
    fn links_of_root_or_ckpts_user_are_followed() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        fs::create_dir_all(real.join("sub")).unwrap();
        // An absolute target and a relative one, chained, as /var/run -> /run.
        symlink(&real, t.path().join("abs")).unwrap();
        symlink("abs/sub", t.path().join("rel")).unwrap();
        let p = TrustedParent::resolve(&t.path().join("rel/file")).unwrap();
        assert_eq!(p.name(), "file");
        p.replace_with(b"42\n", 0o644).unwrap();
        let written = real.join("sub/file");
        assert_eq!(fs::read_to_string(&written).unwrap(), "42\n");
        assert_eq!(fs::metadata(&written).unwrap().mode() & 0o7777, 0o644);
        if as_root() {
            // Root's own link while ckpt runs as root: the /var/run case.
            assert_eq!(fs::symlink_metadata(t.path().join("abs")).unwrap().uid(), 0);
        }
        let fd = open_dir(&t.path().join("abs/sub")).unwrap();
        let st = sys::stat_fd(fd.as_fd()).unwrap();
        assert_eq!(st.st_ino, fs::metadata(real.join("sub")).unwrap().ino());
    }

    #[test]
    fn relative_paths_and_dot_dot_resolve_like_the_kernel() {
        let t = tempfile::tempdir().unwrap();
        fs::create_dir_all(t.path().join("a/b")).unwrap();
        fs::create_dir(t.path().join("c")).unwrap();
        symlink("../../c", t.path().join("a/b/up")).unwrap();
        // Relative to the working directory, without changing it (tests
        // run in parallel): as many `..` as it is deep, then the rest.
        let cwd = std::env::current_dir().unwrap();
        let mut rel = PathBuf::new();
        for _ in cwd.components().skip(1) {
            rel.push("..");
        }
        rel.push(t.path().strip_prefix("/").unwrap());
        let p = TrustedParent::resolve(&rel.join("a/b/../b/./up/f")).unwrap();
        p.replace_with(b"x", 0o600).unwrap();
        assert_eq!(fs::read(t.path().join("c/f")).unwrap(), b"x");
        // `..` after a followed link is its target's parent, as for the kernel.
        let p = TrustedParent::resolve(&t.path().join("a/b/up/../g")).unwrap();
        p.replace_with(b"y", 0o600).unwrap();
        assert_eq!(fs::read(t.path().join("g")).unwrap(), b"y");
        for bad in ["..", "/", ""] {
            assert!(
                matches!(
                    TrustedParent::resolve(Path::new(bad)),
                    Err(PathError::NoName { .. })
                ),
                "{bad:?}"
            );
        }
        fs::write(t.path().join("plain"), "").unwrap();
        assert!(matches!(
            TrustedParent::resolve(&t.path().join("plain/f")),
            Err(PathError::NotADirectory { .. })
        ));
    }

    #[test]
    fn a_link_loop_is_an_error() {
        let t = tempfile::tempdir().unwrap();
        symlink("b", t.path().join("a")).unwrap();
        symlink("a", t.path().join("b")).unwrap();
        let e = TrustedParent::resolve(&t.path().join("a/f")).unwrap_err();
        assert!(matches!(e, PathError::TooManyLinks { .. }), "{e}");
    }

    #[test]
    fn the_last_component_is_never_followed_nor_a_fifo_or_hard_link_opened() {
        let t = tempfile::tempdir().unwrap();
        let precious = t.path().join("precious");
        fs::write(&precious, "keep").unwrap();
        let link = t.path().join("link");
        symlink(&precious, &link).unwrap();
        let p = TrustedParent::resolve(&link).unwrap();
        assert!(matches!(
            p.open_truncated(0o600),
            Err(PathError::NotRegular { .. })
        ));
        // Replacing puts a file where the link was.
        p.replace_with(b"1\n", 0o644).unwrap();
        assert!(fs::symlink_metadata(&link).unwrap().is_file());
        assert_eq!(fs::read_to_string(&precious).unwrap(), "keep");
        let fifo = t.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(matches!(
            TrustedParent::resolve(&fifo).unwrap().open_truncated(0o600),
            Err(PathError::NotRegular { .. })
        ));
        let hard = t.path().join("hard");
        fs::hard_link(&precious, &hard).unwrap();
        assert!(matches!(
            TrustedParent::resolve(&hard).unwrap().open_truncated(0o600),
            Err(PathError::HardLinked { links: 2, .. })
        ));
        assert_eq!(fs::read_to_string(&precious).unwrap(), "keep");
        let fresh = t.path().join("fresh");
        let mut f = TrustedParent::resolve(&fresh)
            .unwrap()
            .open_truncated(0o600)
            .unwrap();
        f.write_all(b"log").unwrap();
        assert_eq!(fs::metadata(&fresh).unwrap().mode() & 0o777, 0o600);
    }
}
