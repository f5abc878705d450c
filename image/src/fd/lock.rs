//! File locks a process holds (`FdTable::locks`): flock, POSIX and OFD
//! locks and leases, re-taken at restore once the process's fds are
//! installed.
//!
//! The message is defined in `image/proto/fd_lock.proto`.

pub use crate::pb::{FileLock, LockClass};

impl FileLock {
    /// The lock in words, as `ckpt show` and errors print it:
    /// `POSIX WRITE 0-99`, `FLOCK READ`, `OFD READ 100-EOF`.
    pub fn describe(&self) -> String {
        let class = match self.class() {
            LockClass::Flock => "FLOCK",
            LockClass::Posix => "POSIX",
            LockClass::Ofd => "OFD",
            LockClass::Lease => "LEASE",
            LockClass::Unspecified => "unknown",
        };
        let access = if self.write { "WRITE" } else { "READ" };
        if matches!(self.class(), LockClass::Flock | LockClass::Lease) {
            return format!("{class} {access}");
        }
        match self.last_byte() {
            Some(end) => format!("{class} {access} {}-{end}", self.start),
            None => format!("{class} {access} {}-EOF", self.start),
        }
    }

    /// The last byte of the range, `None` when it runs to the end of the
    /// file (or past what an offset can say, which only a bad image does).
    pub fn last_byte(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        self.start.checked_add(self.len - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_each_class() {
        let mut l = FileLock {
            fd: 3,
            class: LockClass::Posix as i32,
            write: true,
            start: 10,
            len: 5,
            lease_signal: 0,
        };
        assert_eq!(l.describe(), "POSIX WRITE 10-14");
        l.len = 0;
        assert_eq!(l.describe(), "POSIX WRITE 10-EOF");
        l.class = LockClass::Flock as i32;
        l.write = false;
        assert_eq!(l.describe(), "FLOCK READ");
        l.class = LockClass::Lease as i32;
        assert_eq!(l.describe(), "LEASE READ");
    }
}
