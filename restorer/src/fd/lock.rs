//! File locks, restore side: once every fd of a process is installed (so
//! no later close releases a POSIX lock), each saved lock is re-taken
//! inside the process through its fd, without waiting: flock for flock
//! locks, `F_SETLK` for POSIX locks (owned by the process, whose pid is the
//! dumped one), `F_OFD_SETLK` for OFD locks (owned by the open file
//! description, which every fd sharing it holds again). A conflicting lock
//! someone took since the dump fails the restore, naming the lock and,
//! where the kernel tells, its holder: the process must not run believing
//! it holds a lock it does not.
//!
//! A lease is taken with `F_SETLEASE` (after `F_SETSIG` if it had a break
//! signal of its own), which makes the process the owner its break is
//! signalled to. The process still runs with the restorer's privileges
//! here, which would pass the kernel's check (own the file or have
//! CAP_LEASE) for any file; so ckpt checks it first, with the dumped
//! filesystem uid and capabilities.

use ckpt_image::fd::lock::{FileLock, LockClass};
use ckpt_parasite::error::ParasiteError;
use ckpt_parasite::remote::Remote;

use crate::error::{RestoreError, Result};

/// `struct flock` on x86-64: l_type (i16), l_whence (i16), padding,
/// l_start (i64), l_len (i64), l_pid (i32), padding.
const FLOCK_SIZE: usize = 32;
const FLOCK_TYPE: usize = 0;
const FLOCK_WHENCE: usize = 2;
const FLOCK_START: usize = 8;
const FLOCK_LEN: usize = 16;
const FLOCK_PID: usize = 24;
/// Argument slot of the scratch area for the `struct flock`.
const FLOCK_SLOT: u64 = 0;

/// `F_SETSIG` (the same on every Linux architecture; libc lacks it).
const F_SETSIG: i32 = 10;

/// `CAP_LEASE`: leases on files the process does not own.
pub const CAP_LEASE: u32 = 28;

/// What the dumped process could lease: the kernel's rule, checked by ckpt
/// since the process has more privileges while it is rebuilt.
pub struct LeaseRights {
    /// Its filesystem uid (`None`: the image has no credentials).
    pub fs_uid: Option<u32>,
    /// It had CAP_LEASE in its effective set.
    pub cap_lease: bool,
}

/// Re-takes every lock of the process behind `r`.
pub fn retake(r: &Remote<'_>, locks: &[FileLock], rights: &LeaseRights) -> Result<()> {
    for lock in locks {
        log::debug!("pid {}: fd {}: {}", r.t.pid(), lock.fd, lock.describe());
        if lock.class() == LockClass::Lease {
            check_lease_right(r.t.pid(), lock, rights)?;
        }
        if let Err(e) = take(r, lock) {
            return Err(explain(r, lock, e));
        }
    }
    Ok(())
}

/// The process owns the file it leases, or had CAP_LEASE.
fn check_lease_right(pid: i32, lock: &FileLock, rights: &LeaseRights) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    if rights.cap_lease {
        return Ok(());
    }
    let at = format!("/proc/{pid}/fd/{}", lock.fd);
    let meta =
        std::fs::metadata(&at).map_err(|e| RestoreError::os(pid, format!("stat {at}"), e))?;
    if rights.fs_uid == Some(meta.uid()) {
        return Ok(());
    }
    let path = std::fs::read_link(&at).map_or_else(|_| "?".into(), |p| p.display().to_string());
    Err(RestoreError::fd_changed(
        pid,
        lock.fd,
        path,
        format!(
            "{}: the file's owner is uid {}, not the process's, and it had no CAP_LEASE",
            lock.describe(),
            meta.uid()
        ),
    ))
}

fn take(r: &Remote<'_>, lock: &FileLock) -> std::result::Result<(), ParasiteError> {
    let fd = lock.fd as u64;
    match lock.class() {
        LockClass::Flock => {
            let how = if lock.write {
                libc::LOCK_EX
            } else {
                libc::LOCK_SH
            };
            r.call(
                "flock",
                libc::SYS_flock,
                [fd, (how | libc::LOCK_NB) as u64, 0, 0, 0, 0],
            )?;
        }
        LockClass::Posix | LockClass::Ofd => {
            let arg = r.put(FLOCK_SLOT, &flock_bytes(lock))?;
            let (name, cmd) = set_cmd(lock.class());
            r.call(name, libc::SYS_fcntl, [fd, cmd as u64, arg, 0, 0, 0])?;
        }
        LockClass::Lease => {
            if lock.lease_signal != 0 {
                r.call(
                    "fcntl(F_SETSIG)",
                    libc::SYS_fcntl,
                    [fd, F_SETSIG as u64, lock.lease_signal as u64, 0, 0, 0],
                )?;
            }
            let kind = if lock.write {
                libc::F_WRLCK
            } else {
                libc::F_RDLCK
            };
            r.call(
                "fcntl(F_SETLEASE)",
                libc::SYS_fcntl,
                [fd, libc::F_SETLEASE as u64, kind as u64, 0, 0, 0],
            )?;
        }
        LockClass::Unspecified => unreachable!("validated"),
    }
    Ok(())
}

/// The non-blocking fcntl command taking a lock of this class.
fn set_cmd(class: LockClass) -> (&'static str, i32) {
    match class {
        LockClass::Ofd => ("fcntl(F_OFD_SETLK)", libc::F_OFD_SETLK),
        _ => ("fcntl(F_SETLK)", libc::F_SETLK),
    }
}

/// The fcntl command asking who holds a lock conflicting with one of this
/// class.
fn get_cmd(class: LockClass) -> i32 {
    match class {
        LockClass::Ofd => libc::F_OFD_GETLK,
        _ => libc::F_GETLK,
    }
}

fn flock_bytes(lock: &FileLock) -> [u8; FLOCK_SIZE] {
    let mut b = [0u8; FLOCK_SIZE];
    let kind = if lock.write {
        libc::F_WRLCK
    } else {
        libc::F_RDLCK
    } as i16;
    b[FLOCK_TYPE..FLOCK_TYPE + 2].copy_from_slice(&kind.to_le_bytes());
    b[FLOCK_WHENCE..FLOCK_WHENCE + 2].copy_from_slice(&(libc::SEEK_SET as i16).to_le_bytes());
    b[FLOCK_START..FLOCK_START + 8].copy_from_slice(&lock.start.to_le_bytes());
    b[FLOCK_LEN..FLOCK_LEN + 8].copy_from_slice(&lock.len.to_le_bytes());
    b
}

/// A one-line error for a lock that could not be re-taken, naming who holds
/// the conflicting one when the kernel says.
fn explain(r: &Remote<'_>, lock: &FileLock, e: ParasiteError) -> RestoreError {
    let pid = r.t.pid();
    let path = std::fs::read_link(format!("/proc/{pid}/fd/{}", lock.fd))
        .map(|p| p.display().to_string())
        .unwrap_or_else(|_| "?".into());
    let conflict = matches!(
        e,
        ParasiteError::RemoteSyscall { errno, .. }
            if errno == nix::errno::Errno::EAGAIN || errno == nix::errno::Errno::EACCES
    );
    let what = if conflict {
        match holder(r, lock) {
            Some(h) => format!(
                "cannot re-take {}: a conflicting lock is held by pid {h}",
                lock.describe()
            ),
            None => format!(
                "cannot re-take {}: a conflicting lock is held by another process or open file",
                lock.describe()
            ),
        }
    } else {
        format!("cannot re-take {}: {e}", lock.describe())
    };
    RestoreError::fd_changed(pid, lock.fd, path, what)
}

/// The pid holding a lock that conflicts with `lock` (fcntl locks only;
/// an OFD holder has none).
fn holder(r: &Remote<'_>, lock: &FileLock) -> Option<i32> {
    if matches!(lock.class(), LockClass::Flock | LockClass::Lease) {
        return None;
    }
    let arg = r.put(FLOCK_SLOT, &flock_bytes(lock)).ok()?;
    r.call(
        "fcntl(F_GETLK)",
        libc::SYS_fcntl,
        [lock.fd as u64, get_cmd(lock.class()) as u64, arg, 0, 0, 0],
    )
    .ok()?;
    let mut b = [0u8; FLOCK_SIZE];
    r.t.read_mem(arg, &mut b).ok()?;
    let held_pid = i32::from_le_bytes(b[FLOCK_PID..FLOCK_PID + 4].try_into().ok()?);
    (held_pid > 0).then_some(held_pid)
}
