//! Directory-fd file operations for image directories, on nix's safe
//! wrappers. Every name is resolved relative to a directory fd and never
//! through a symlink in its last component, so a directory another user
//! can write cannot redirect what ckpt reads or writes.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::dir::Dir;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, FcntlArg, OFlag, RenameFlags};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::UnlinkatFlags;

/// Mode of an image directory, whatever the umask.
pub const DIR_MODE: u32 = 0o700;
/// Mode of an image file, whatever the umask.
pub const FILE_MODE: u32 = 0o600;

/// Which object a name referred to: a rename or a swap changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    dev: u64,
    ino: u64,
}

impl Identity {
    /// The identity of a stat result.
    pub fn of(st: &FileStat) -> Self {
        Identity {
            dev: st.st_dev,
            ino: st.st_ino,
        }
    }
}

/// The kind of a stat result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    /// A regular file.
    Regular,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// A FIFO, socket or device.
    Special,
}

impl FileType {
    /// The type of a stat result.
    pub fn of(st: &FileStat) -> Self {
        match SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) {
            SFlag::S_IFREG => FileType::Regular,
            SFlag::S_IFDIR => FileType::Directory,
            SFlag::S_IFLNK => FileType::Symlink,
            _ => FileType::Special,
        }
    }

    /// For error messages.
    pub fn name(self) -> &'static str {
        match self {
            FileType::Regular => "regular file",
            FileType::Directory => "directory",
            FileType::Symlink => "symbolic link",
            FileType::Special => "FIFO, socket or device",
        }
    }
}

fn io_err(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

/// Opens a directory by path, following symlinks anywhere in it (the
/// caller chose the path); used to read a checkpoint and for the key's
/// directory. Paths ckpt writes as root go through
/// [`crate::trusted_path`] instead.
pub fn open_dir_path(path: &Path) -> io::Result<OwnedFd> {
    nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err)
}

/// Where a path walk starts: `/` for an absolute path, the working
/// directory for a relative one. An `O_PATH` fd: it only names the
/// directory, so search permission is all a walk needs.
pub fn open_walk_start(absolute: bool) -> io::Result<OwnedFd> {
    let start = if absolute { "/" } else { "." };
    nix::fcntl::open(
        start,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err)
}

/// Opens `name` inside `dir` as an `O_PATH` fd without following it: a
/// symlink gives an fd of the link itself, whose owner can then be
/// checked before anything it points at is reached.
pub fn open_path_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err)
}

/// The target of the symlink `link` was opened as (an `O_PATH` fd from
/// [`open_path_at`]): read from that very link, not by name again.
pub fn read_link_fd(link: BorrowedFd<'_>) -> io::Result<OsString> {
    nix::fcntl::readlinkat(link, "").map_err(io_err)
}

/// The directory `dir` names (maybe an `O_PATH` fd) opened for reading,
/// so it can be listed and fsynced.
pub fn reopen_dir(dir: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    nix::fcntl::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err)
}

/// Creates a new file `name` inside `dir` for writing with mode `mode`
/// (forced with `fchmod`, whatever the umask): never an existing file,
/// never through a symlink.
pub fn create_new_at(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> io::Result<File> {
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )
    .map_err(io_err)?;
    set_mode(fd.as_fd(), mode)?;
    Ok(File::from(fd))
}

/// Opens `name` inside `dir` for writing, creating it with `mode` if
/// missing: never through a symlink (`ELOOP`), and `O_NONBLOCK` so a FIFO
/// cannot block the open (the caller checks the type on the fd and then
/// clears the flag with [`set_blocking`]).
pub fn open_for_writing_at(dir: BorrowedFd<'_>, name: &OsStr, mode: u32) -> io::Result<File> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_WRONLY
            | OFlag::O_CREAT
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_NOCTTY
            | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(mode),
    )
    .map(File::from)
    .map_err(io_err)
}

/// Clears `O_NONBLOCK` (and every other status flag) on `fd`.
pub fn set_blocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    nix::fcntl::fcntl(fd, FcntlArg::F_SETFL(OFlag::empty()))
        .map(drop)
        .map_err(io_err)
}

/// Renames `old` to `new` inside `dir`, replacing whatever non-directory
/// `new` names (a symlink there is replaced, never followed).
pub fn rename_replacing_at(dir: BorrowedFd<'_>, old: &OsStr, new: &OsStr) -> io::Result<()> {
    nix::fcntl::renameat(dir, old, dir, new).map_err(io_err)
}

/// Opens directory `name` inside `dir`, refusing a symlink.
pub fn open_dir_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<OwnedFd> {
    nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err)
}

/// Creates directory `name` inside `dir` with [`DIR_MODE`] (the umask can
/// only take bits away, which the caller's `fchmod` restores).
pub fn mkdir_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(DIR_MODE)).map_err(io_err)
}

/// Creates a new file `name` inside `dir`: never an existing file, never
/// through a symlink, mode [`FILE_MODE`] whatever the umask.
pub fn create_file_at(dir: BorrowedFd<'_>, name: &OsStr, read_back: bool) -> io::Result<File> {
    let access = if read_back {
        OFlag::O_RDWR
    } else {
        OFlag::O_WRONLY
    };
    let fd = nix::fcntl::openat(
        dir,
        name,
        access | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(FILE_MODE),
    )
    .map_err(io_err)?;
    set_mode(fd.as_fd(), FILE_MODE)?;
    Ok(File::from(fd))
}

/// Opens `name` inside `dir` for reading: no symlink, and O_NONBLOCK so a
/// FIFO cannot block the open (cleared again once the file is known to be
/// regular). Returns the file and its stat.
pub fn open_regular_at(dir: BorrowedFd<'_>, name: &OsStr) -> Result<(File, FileStat), OpenError> {
    let fd = nix::fcntl::openat(
        dir,
        name,
        OFlag::O_RDONLY
            | OFlag::O_NOFOLLOW
            | OFlag::O_NONBLOCK
            | OFlag::O_CLOEXEC
            | OFlag::O_NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| match e {
        // O_NOFOLLOW on a symlink.
        Errno::ELOOP => OpenError::NotRegular(FileType::Symlink),
        e => OpenError::Io(io_err(e)),
    })?;
    let st = nix::sys::stat::fstat(fd.as_fd()).map_err(|e| OpenError::Io(io_err(e)))?;
    let kind = FileType::of(&st);
    if kind != FileType::Regular {
        return Err(OpenError::NotRegular(kind));
    }
    nix::fcntl::fcntl(fd.as_fd(), FcntlArg::F_SETFL(OFlag::empty()))
        .map_err(|e| OpenError::Io(io_err(e)))?;
    Ok((File::from(fd), st))
}

/// Why [`open_regular_at`] failed.
#[derive(Debug)]
pub enum OpenError {
    /// The name is not a regular file.
    NotRegular(FileType),
    /// The OS refused.
    Io(io::Error),
}

/// Stats `name` inside `dir` without following a symlink.
pub fn stat_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<FileStat> {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).map_err(io_err)
}

/// Stats an open fd.
pub fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<FileStat> {
    nix::sys::stat::fstat(fd).map_err(io_err)
}

/// Sets the permission bits of an open file or directory.
pub fn set_mode(fd: BorrowedFd<'_>, mode: u32) -> io::Result<()> {
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode)).map_err(io_err)
}

/// Gives `name` inside `dir` (never through a symlink) to `uid`:`gid`.
pub fn chown_at(dir: BorrowedFd<'_>, name: &OsStr, uid: u32, gid: u32) -> io::Result<()> {
    nix::unistd::fchownat(
        dir,
        name,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .map_err(io_err)
}

/// Gives an open file or directory to `uid`:`gid`.
pub fn chown_fd(fd: BorrowedFd<'_>, uid: u32, gid: u32) -> io::Result<()> {
    nix::unistd::fchown(
        fd,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
    )
    .map_err(io_err)
}

/// Flushes a file or directory to stable storage.
pub fn sync(fd: BorrowedFd<'_>) -> io::Result<()> {
    nix::unistd::fsync(fd).map_err(io_err)
}

/// Turns `O_DIRECT` on or off for `fd`: writes then go from the caller's
/// (aligned) buffers to the disk, past the page cache. Fails on
/// filesystems without direct I/O.
pub fn set_direct(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    let flags =
        OFlag::from_bits_truncate(nix::fcntl::fcntl(fd, FcntlArg::F_GETFL).map_err(io_err)?);
    let flags = if on {
        flags | OFlag::O_DIRECT
    } else {
        flags - OFlag::O_DIRECT
    };
    nix::fcntl::fcntl(fd, FcntlArg::F_SETFL(flags))
        .map(drop)
        .map_err(io_err)
}

/// Whether a direct read of the first page of `file` (opened with
/// `O_DIRECT`) works: a filesystem may take the flag at open and refuse
/// reads aligned to less than its own block.
pub fn direct_read_works(file: &File) -> bool {
    /// The alignment the restorer's direct reads keep: a page.
    const PAGE: usize = 4096;
    let Ok(mut buf) = memmap2::MmapMut::map_anon(PAGE) else {
        return false;
    };
    std::os::unix::fs::FileExt::read_at(file, &mut buf[..], 0).is_ok()
}

/// Whether `fd` lives in memory (tmpfs or ramfs): no disk behind it, so
/// neither direct I/O nor preallocation (which fills real pages there)
/// helps.
pub fn in_memory(fd: BorrowedFd<'_>) -> bool {
    nix::sys::statfs::fstatfs(fd).is_ok_and(|fs| memory_filesystem(&fs))
}

/// Whether a filesystem keeps its files in memory (tmpfs, ramfs).
pub fn memory_filesystem(fs: &nix::sys::statfs::Statfs) -> bool {
    /// ramfs's statfs type (nix names tmpfs's only).
    const RAMFS_MAGIC: nix::sys::statfs::FsType = nix::sys::statfs::FsType(0x8584_58f6);
    let t = fs.filesystem_type();
    t == nix::sys::statfs::TMPFS_MAGIC || t == RAMFS_MAGIC
}

/// Allocates the first `len` bytes of `fd` on disk (its size becomes at
/// least `len`) without writing them.
pub fn preallocate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    let len = i64::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    nix::fcntl::fallocate(fd, nix::fcntl::FallocateFlags::empty(), 0, len).map_err(io_err)
}

/// Sets the length of `fd` to `len`.
pub fn truncate(fd: BorrowedFd<'_>, len: u64) -> io::Result<()> {
    let len = i64::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    nix::unistd::ftruncate(fd, len).map_err(io_err)
}

/// Starts writing back `len` bytes of `fd` at `offset` without waiting for
/// them (`sync_file_range(SYNC_FILE_RANGE_WRITE)`): the disk works while
/// more data is produced, and the final fsync only waits for what is left.
#[allow(unsafe_code)]
pub fn start_writeback(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    // SAFETY: a plain syscall on a file descriptor borrowed for the call;
    // no memory is passed.
    let r =
        unsafe { libc::sync_file_range(fd.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Asks the kernel to start reading `len` bytes of `fd` from `offset` into
/// the page cache now (`posix_fadvise(POSIX_FADV_WILLNEED)`), without
/// waiting: hints for several files go to the disk together instead of one
/// cold read after the other. Only a hint, so a failure is not reported.
pub fn read_ahead(fd: BorrowedFd<'_>, offset: u64, len: u64) {
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    let _ = nix::fcntl::posix_fadvise(
        fd,
        offset,
        len,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_WILLNEED,
    );
}

/// Maps the first `len` bytes of `file` read-only. Only for files in
/// ckpt's own unfinished checkpoint directory, which no one else can open,
/// and known to hold `len` bytes: a mapping of a file someone truncates
/// under it would fault (`SIGBUS`) instead of failing a read.
#[allow(unsafe_code)]
pub fn map_own_file(file: &File, len: usize) -> io::Result<memmap2::Mmap> {
    // SAFETY: the caller guarantees the file is ckpt's own and holds `len`
    // bytes; nothing truncates or rewrites it while the map lives, so the
    // mapped slice stays valid and unchanged.
    unsafe { memmap2::MmapOptions::new().len(len).map(file) }
}

/// How a rename into place went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenameOutcome {
    /// Renamed; nothing was at the new name.
    Renamed,
    /// Something already has the new name; nothing was changed.
    Exists,
}

/// Renames `old` to `new` inside `dir`, never replacing anything at `new`.
/// Filesystems without RENAME_NOREPLACE (EINVAL) get a plain rename, which
/// still cannot replace a non-empty directory; the caller checks afterwards
/// that the new name holds what it renamed.
pub fn rename_noreplace_at(
    dir: BorrowedFd<'_>,
    old: &OsStr,
    new: &OsStr,
) -> io::Result<RenameOutcome> {
    match nix::fcntl::renameat2(dir, old, dir, new, RenameFlags::RENAME_NOREPLACE) {
        Ok(()) => Ok(RenameOutcome::Renamed),
        Err(Errno::EEXIST | Errno::ENOTEMPTY) => Ok(RenameOutcome::Exists),
        Err(Errno::EINVAL) => match stat_at(dir, new) {
            Ok(_) => Ok(RenameOutcome::Exists),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                match nix::fcntl::renameat(dir, old, dir, new) {
                    Ok(()) => Ok(RenameOutcome::Renamed),
                    Err(Errno::EEXIST | Errno::ENOTEMPTY) => Ok(RenameOutcome::Exists),
                    Err(e) => Err(io_err(e)),
                }
            }
            Err(e) => Err(e),
        },
        Err(e) => Err(io_err(e)),
    }
}

/// Removes the non-directory entry `name` of `dir` (a symlink itself, never
/// its target).
pub fn unlink_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    nix::unistd::unlinkat(dir, name, UnlinkatFlags::NoRemoveDir).map_err(io_err)
}

/// Removes the empty directory `name` of `dir`.
pub fn rmdir_at(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    nix::unistd::unlinkat(dir, name, UnlinkatFlags::RemoveDir).map_err(io_err)
}

/// The names in directory `dir`, without `.` and `..`.
pub fn list(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let mut d = Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io_err)?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e.map_err(io_err)?;
        let name = e.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(OsStr::from_bytes(name).to_owned());
        }
    }
    Ok(out)
}

/// The effective uid ckpt runs as.
pub fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Whether `pid` names a live process (or one we cannot see, which counts
/// as live so its files are left alone). A zombie is not live: a dumper
/// killed with its job writes nothing more, reaped or not.
pub fn pid_alive(pid: u32) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(raw), None) {
        Ok(()) => !is_zombie(pid),
        Err(e) => e != Errno::ESRCH,
    }
}

/// Whether `/proc` shows `pid` as a zombie (or dead); a process it does not
/// show is not said to be one.
fn is_zombie(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which may hold ')' itself.
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next());
    matches!(state, Some('Z' | 'X'))
}

/// Sets this thread's filesystem uid and gid (the ids the kernel checks
/// file access against) and returns the previous ones. Leaving uid 0
/// drops the filesystem capabilities (CAP_DAC_OVERRIDE, CAP_FOWNER, ...)
/// from the effective set; returning to it restores them.
#[allow(unsafe_code)]
pub fn set_fs_ids(uid: u32, gid: u32) -> (u32, u32) {
    // SAFETY: setfsgid/setfsuid take plain ids and change only this
    // thread's credentials; they cannot fail in a way that harms memory.
    unsafe {
        let old_gid = libc::setfsgid(gid) as u32;
        let old_uid = libc::setfsuid(uid) as u32;
        (old_uid, old_gid)
    }
}

/// This thread's filesystem uid.
#[allow(unsafe_code)]
pub fn fs_uid() -> u32 {
    // SAFETY: setfsuid(-1) is invalid, so it changes nothing and returns
    // the current filesystem uid.
    unsafe { libc::setfsuid(u32::MAX) as u32 }
}
