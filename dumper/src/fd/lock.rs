//! File locks, dump side: flock, POSIX and OFD locks and leases are saved
//! with the fd table of the process that re-takes them at restore; leases
//! being broken, delegations (and the mandatory locks of old kernels) are
//! refused by name, since a process restored without them would carry on
//! as if it still had them. A lease's break signal (`F_SETSIG`) is saved
//! with it; one whose signals go to another process than its holder's is
//! refused, since taking it again makes the taker the owner.
//!
//! The locks come from the `lock:` lines of `/proc/PID/fdinfo/N`, which list
//! the locks taken through that open file by this process (POSIX) or by this
//! open file description (OFD, flock; shown in every fd of every process
//! holding it).

use std::collections::HashSet;

use ckpt_image::fd::File;
use ckpt_image::fd::lock::{FileLock, LockClass};

use super::FdParams;
use crate::error::{DumpError, Result};
use crate::sys;

/// What fdinfo prints in the end column of a lock running to the end of the
/// file.
const TO_EOF: &str = "EOF";
/// The only locking mode Linux has had since 5.15 (mandatory locks were
/// removed); anything else is refused.
const ADVISORY: &str = "ADVISORY";
/// The state of a lease nobody is breaking.
const LEASE_ACTIVE: &str = "ACTIVE";
/// Kinds of file whose locks ckpt re-takes: files it reopens itself. A lock
/// on a file handed over at restore (a terminal, an external file) would be
/// taken on whatever restore hands over.
const LOCKABLE_KINDS: &[&str] = &["reg", "fifo"];

/// One lock held through an fd, as its fdinfo `lock:` line reports it.
#[derive(Debug, PartialEq, Eq)]
pub struct HeldLock {
    /// `POSIX`, `OFDLCK`, `FLOCK`, `LEASE`, ...
    pub class: String,
    /// `ADVISORY` (for a lease: `ACTIVE`, `BREAKING`, ...).
    pub mode: String,
    /// `READ`, `WRITE`, ... (for a lease, its type).
    pub access: String,
    /// First byte.
    pub start: String,
    /// Last byte, or `EOF`.
    pub end: String,
}

impl HeldLock {
    fn words(&self) -> String {
        format!("{} {}", self.class, self.access)
    }
}

/// Every lock listed in an fdinfo text.
pub fn held_locks(fdinfo: &str) -> Vec<HeldLock> {
    fdinfo
        .lines()
        .filter_map(|l| l.strip_prefix("lock:"))
        .map(|rest| {
            // "1: POSIX  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
            // "1: LEASE  ACTIVE    READ 1234 08:01:5678 0 EOF"
            let words: Vec<&str> = rest.split_whitespace().collect();
            let word = |i: usize| words.get(i).copied().unwrap_or("?").to_string();
            HeldLock {
                class: word(1),
                mode: word(2),
                access: word(3),
                start: word(6),
                end: word(7),
            }
        })
        .collect()
}

/// The locks already recorded, so a lock seen through several fds (a dup,
/// a description inherited over fork) is re-taken once.
#[derive(Default)]
pub struct SeenLocks {
    /// flock and OFD locks: per open file description, across the tree.
    per_description: HashSet<(u64, LockKey)>,
    /// POSIX locks: per process (cleared for each process) and inode.
    per_process: HashSet<(u64, u64, LockKey)>,
}

#[derive(PartialEq, Eq, Hash)]
struct LockKey {
    class: i32,
    write: bool,
    start: u64,
    len: u64,
}

impl SeenLocks {
    /// A new process's fds follow: its POSIX locks are its own.
    pub fn next_process(&mut self) {
        self.per_process.clear();
    }
}

/// The locks held through fd `p` (open file `file`) that this process must
/// re-take, new ones only; a lease or a lock ckpt cannot re-take is an
/// error naming it.
pub fn locks_of(p: &FdParams, file: &File, seen: &mut SeenLocks) -> Result<Vec<FileLock>> {
    let mut out = Vec::new();
    for held in held_locks(&p.info) {
        let lock = to_image(p, &held)?;
        if !LOCKABLE_KINDS.contains(&file.kind_name()) {
            return Err(p.unsupported(&format!(
                "file lock ({}) on a {} file {}",
                held.words(),
                file.kind_name(),
                p.link
            )));
        }
        let key = LockKey {
            class: lock.class,
            write: lock.write,
            start: lock.start,
            len: lock.len,
        };
        use std::os::unix::fs::MetadataExt;
        let new = match lock.class() {
            LockClass::Posix => seen.per_process.insert((p.meta.dev(), p.meta.ino(), key)),
            _ => seen.per_description.insert((file.id, key)),
        };
        if new {
            log::debug!(
                "pid {}: fd {}: {} on {}",
                p.pid,
                p.fd,
                lock.describe(),
                p.link
            );
            out.push(lock);
        }
    }
    Ok(out)
}

fn to_image(p: &FdParams, held: &HeldLock) -> Result<FileLock> {
    let refuse = |what: &str| {
        Err(p.unsupported(&format!(
            "{what} ({} {}) on {}",
            held.class, held.access, p.link
        )))
    };
    let class = match held.class.as_str() {
        "FLOCK" => LockClass::Flock,
        "POSIX" => LockClass::Posix,
        "OFDLCK" => LockClass::Ofd,
        "LEASE" => return lease(p, held),
        "DELEG" => return refuse("file lease (delegation)"),
        _ => return refuse("file lock"),
    };
    if held.mode != ADVISORY {
        return refuse(&format!("{} file lock", held.mode.to_lowercase()));
    }
    let write = match held.access.as_str() {
        "WRITE" => true,
        "READ" => false,
        _ => return refuse("file lock"),
    };
    let (start, len) = range(&held.start, &held.end).ok_or_else(|| DumpError::Parse {
        pid: p.pid,
        path: format!("fdinfo/{}", p.fd),
        what: format!("lock range {} {}", held.start, held.end),
    })?;
    Ok(FileLock {
        fd: p.fd,
        class: class as i32,
        write,
        start,
        len,
        lease_signal: 0,
    })
}

/// A lease (whole file): its type, and the signal its break sends.
fn lease(p: &FdParams, held: &HeldLock) -> Result<FileLock> {
    let refuse = |what: &str| {
        Err(p.unsupported(&format!(
            "file lease ({} {}) on {}: {what}",
            held.mode, held.access, p.link
        )))
    };
    if held.mode != LEASE_ACTIVE {
        return refuse("being broken (the kernel cannot be made to break it again)");
    }
    let write = match held.access.as_str() {
        "WRITE" => true,
        "READ" => false,
        _ => return refuse("of an unknown type"),
    };
    let owner = sys::file_owner(p.pid, p.fd).map_err(|e| DumpError::Proc {
        pid: p.pid,
        path: format!("fd/{} (F_GETOWN, F_GETSIG)", p.fd).into(),
        source: e,
    })?;
    if owner.owner != p.pid {
        return refuse(&format!(
            "its break is signalled to {} (F_SETOWN), not to its holder",
            owner.owner
        ));
    }
    Ok(FileLock {
        fd: p.fd,
        class: LockClass::Lease as i32,
        write,
        start: 0,
        len: 0,
        lease_signal: owner.signal,
    })
}

/// fdinfo's first and last byte (or `EOF`) as fcntl's start and length
/// (0: to the end of the file).
fn range(start: &str, end: &str) -> Option<(u64, u64)> {
    let start: u64 = start.parse().ok()?;
    if end == TO_EOF {
        return Some((start, 0));
    }
    let end: u64 = end.parse().ok()?;
    Some((start, end.checked_sub(start)?.checked_add(1)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fdinfo_lock_lines() {
        let info = "pos:\t0\nflags:\t0100002\nmnt_id:\t30\nino:\t123\n\
                    lock:\t1: POSIX  ADVISORY  WRITE 4242 00:1f:123 10 19\n\
                    lock:\t2: FLOCK  ADVISORY  READ 4242 00:1f:123 0 EOF\n";
        let locks = held_locks(info);
        assert_eq!(locks.len(), 2);
        assert_eq!(locks[0].class, "POSIX");
        assert_eq!(locks[0].access, "WRITE");
        assert_eq!(
            (locks[0].start.as_str(), locks[0].end.as_str()),
            ("10", "19")
        );
        assert_eq!(locks[1].class, "FLOCK");
        assert_eq!(locks[1].end, "EOF");
        assert!(held_locks("pos:\t0\nflags:\t02\n").is_empty());
    }

    #[test]
    fn ranges_become_start_and_length() {
        assert_eq!(range("100", "199"), Some((100, 100)));
        assert_eq!(range("0", "EOF"), Some((0, 0)));
        assert_eq!(range("5", "5"), Some((5, 1)));
        assert_eq!(range("10", "9"), None);
        assert_eq!(range("x", "EOF"), None);
    }
}
