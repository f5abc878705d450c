//! Open files, after CRIU's fdinfo/file split.
//!
//! An *fd* is a number in one process's table that points at an *open file
//! description* (what `open(2)` returns: flags, offset, the object behind
//! it). Several fds, in one process (`dup`) or across processes (inherited
//! over `fork`, passed over a socket), can point at one description and
//! share its offset and flags. So the image keeps the two apart:
//!
//! - `fds-PID.img` ([`FdTable`]): per process, `{fd, cloexec, file_id}`;
//! - `files.img` ([`Files`]): every open file description of the
//!   checkpoint once, `{id, flags, pos, kind}`, where `kind` holds what is
//!   specific to one kind of object (one module per kind beside this one).
//!
//! Sharing is "same `file_id`"; whatever later points at an open file (a
//! socket's peer, an epoll target, a file in flight in `SCM_RIGHTS`) refers
//! to it by id too.
//!
//! The messages are defined in `image/proto/fd.proto` (the table and the
//! description) and `image/proto/fd_KIND.proto` (one per kind).

pub mod dev;
pub mod epoll;
pub mod eventfd;
pub mod external;
pub mod fanotify;
pub mod fifo;
pub mod ib;
pub mod inet;
pub mod inotify;
pub mod lock;
pub mod memfd;
pub mod netlink;
pub mod packet;
pub mod pidfd;
pub mod pipe;
pub mod proc;
pub mod pty;
pub mod reg;
pub mod signalfd;
pub mod timerfd;
pub mod tty;
pub mod unix;

pub use crate::pb::{Fd, FdTable, File, Files, file};

/// What one kind's message says about its open file, in one line (as
/// `ckpt show` prints it). Each kind's module implements it.
pub trait Describe {
    /// The object behind the description, in words.
    fn describe(&self) -> String;
}

/// The one list of open-file kinds: each `file::Kind` variant with its
/// short name. The kinds' names, `ckpt show`'s descriptions and the list
/// the dumper's and restorer's registries are checked against all come
/// from here; a new kind is one line.
macro_rules! fd_kinds {
    ($($variant:ident => $name:literal,)*) => {
        /// Short names of every kind of open file, in schema order.
        pub const KIND_NAMES: &[&str] = &[$($name),*];

        impl File {
            /// Short name of the kind, for messages.
            pub fn kind_name(&self) -> &'static str {
                match &self.kind {
                    $(Some(file::Kind::$variant(_)) => $name,)*
                    None => "unknown",
                }
            }

            /// What the description refers to, in one line (empty for a
            /// file of no kind).
            pub fn describe(&self) -> String {
                match &self.kind {
                    $(Some(file::Kind::$variant(k)) => Describe::describe(k),)*
                    None => String::new(),
                }
            }

        }
    };
}

fd_kinds! {
    Reg => "reg",
    Dev => "dev",
    Tty => "tty",
    Pipe => "pipe",
    Eventfd => "eventfd",
    External => "external",
    Timerfd => "timerfd",
    Signalfd => "signalfd",
    Fifo => "fifo",
    Epoll => "epoll",
    Pty => "pty",
    Inet => "inet",
    Inotify => "inotify",
    Fanotify => "fanotify",
    Pidfd => "pidfd",
    Memfd => "memfd",
    Unix => "unix",
    Ib => "ib",
    Proc => "proc",
    Netlink => "netlink",
    Packet => "packet",
}

impl File {
    /// The access mode says the description can be written.
    pub fn writable(&self) -> bool {
        let acc = self.flags & O_ACCMODE;
        acc == O_WRONLY || acc == O_RDWR
    }

    /// The access mode says the description can be read.
    pub fn readable(&self) -> bool {
        let acc = self.flags & O_ACCMODE;
        acc == O_RDONLY || acc == O_RDWR
    }
}

// The access-mode values are the same on every Linux architecture; kept
// here so the format crate needs no libc.
const O_RDONLY: u32 = 0;
const O_WRONLY: u32 = 1;
const O_RDWR: u32 = 2;
const O_ACCMODE: u32 = 3;

impl Files {
    /// The file with this id.
    pub fn get(&self, id: u64) -> Option<&File> {
        self.files
            .binary_search_by_key(&id, |f| f.id)
            .ok()
            .map(|i| &self.files[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_and_access_modes() {
        let files = Files {
            files: (1..=3)
                .map(|id| File {
                    id,
                    flags: (id as u32 - 1) | 0o4000,
                    pos: 0,
                    kind: Some(file::Kind::Eventfd(eventfd::EventfdFile::default())),
                })
                .collect(),
        };
        assert_eq!(files.get(2).map(|f| f.id), Some(2));
        assert!(files.get(4).is_none());
        let (r, w, rw) = (&files.files[0], &files.files[1], &files.files[2]);
        assert!(r.readable() && !r.writable());
        assert!(!w.readable() && w.writable());
        assert!(rw.readable() && rw.writable());
        assert_eq!(r.kind_name(), "eventfd");
    }
}
