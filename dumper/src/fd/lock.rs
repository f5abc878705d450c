//! File locks. ckpt does not save them yet, and a process restored without
//! the lock it held would carry on as if it still had it while another
//! process wrote meanwhile (a database transaction silently lost). So a
//! process holding any lock (POSIX, OFD, flock, lease) is refused by name,
//! as CRIU does without `--file-locks`.
//!
//! The locks come from the `lock:` lines of `/proc/PID/fdinfo/N`, which list
//! the locks taken through that open file by this process (or, for OFD and
//! flock locks, by this open file description).

use super::FdParams;
use crate::error::{DumpError, Result};

/// One lock held through an fd, as its fdinfo `lock:` line reports it.
#[derive(Debug, PartialEq, Eq)]
pub struct HeldLock {
    /// `POSIX`, `OFDLCK`, `FLOCK`, `LEASE`, ...
    pub class: String,
    /// `READ`, `WRITE`, ... (for a lease, its state and type).
    pub access: String,
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
                access: word(3),
            }
        })
        .collect()
}

/// Fails the dump if the process holds a lock through this fd.
pub fn refuse_locks(p: &FdParams) -> Result<()> {
    match held_locks(&p.info).into_iter().next() {
        None => Ok(()),
        Some(l) => Err(DumpError::Unsupported {
            pid: p.pid,
            what: format!(
                "fd {}: file lock ({} {}) on {}",
                p.fd, l.class, l.access, p.link
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fdinfo_lock_lines() {
        let info = "pos:\t0\nflags:\t0100002\nmnt_id:\t30\nino:\t123\n\
                    lock:\t1: POSIX  ADVISORY  WRITE 4242 00:1f:123 0 EOF\n\
                    lock:\t2: FLOCK  ADVISORY  READ 4242 00:1f:123 0 EOF\n";
        assert_eq!(
            held_locks(info),
            vec![
                HeldLock {
                    class: "POSIX".into(),
                    access: "WRITE".into()
                },
                HeldLock {
                    class: "FLOCK".into(),
                    access: "READ".into()
                },
            ]
        );
        assert!(held_locks("pos:\t0\nflags:\t02\n").is_empty());
    }
}
