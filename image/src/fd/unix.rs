//! UNIX domain sockets: type, peer (by file id), address, shutdown state,
//! options, and the messages queued for the socket to read (raw image
//! `unix-FILE_ID.img`, see [`crate::unix_queue_name`]).
//!
//! The message is defined in `image/proto/fd_unix.proto`.

pub use crate::pb::{UnixBoundFile, UnixSocketFile};

/// Most bytes a socket's queue image may hold. The kernel caps a queue by
/// the buffer sizes (SO_SNDBUF up to `wmem_max`, or forced by root); this
/// bound only keeps a forged image from making the restorer allocate and
/// send without limit.
pub const MAX_QUEUE_BYTES: usize = 256 << 20;

/// Most messages one queue may list (a bound for the same reason).
pub const MAX_QUEUE_MESSAGES: usize = 1 << 20;

/// Why a queue image does not match its message lengths.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueueError {
    /// The lengths add up to more or less than the image holds.
    #[error("the queued message lengths add up to {listed} bytes but the image holds {held}")]
    Length {
        /// Sum of the listed lengths.
        listed: u64,
        /// Bytes in the image.
        held: u64,
    },
    /// More than [`MAX_QUEUE_BYTES`] or [`MAX_QUEUE_MESSAGES`].
    #[error("queue of {messages} messages, {bytes} bytes is larger than ckpt accepts")]
    TooLarge {
        /// Messages listed.
        messages: usize,
        /// Bytes held.
        bytes: usize,
    },
}

// Socket types: the same on every Linux architecture but MIPS; kept here so
// the format crate needs no libc.
const SOCK_STREAM: u32 = 1;
const SOCK_DGRAM: u32 = 2;
const SOCK_SEQPACKET: u32 = 5;

impl UnixSocketFile {
    /// `stream`, `dgram` or `seqpacket`.
    pub fn type_name(&self) -> &'static str {
        match self.sock_type {
            SOCK_STREAM => "stream",
            SOCK_DGRAM => "dgram",
            SOCK_SEQPACKET => "seqpacket",
            _ => "unknown-type",
        }
    }

    /// The bound name for people: a path as is, an abstract name as
    /// `@name`.
    pub fn printable_name(&self) -> String {
        printable(&self.name)
    }

    /// The name of what it is connected to, likewise.
    pub fn peer_name_printable(&self) -> String {
        printable(&self.peer_name)
    }

    /// Splits the queue image `data` into the queued messages, in order,
    /// after checking it holds exactly the listed lengths.
    pub fn messages<'d>(&self, data: &'d [u8]) -> Result<Vec<&'d [u8]>, QueueError> {
        if data.len() > MAX_QUEUE_BYTES || self.queue.len() > MAX_QUEUE_MESSAGES {
            return Err(QueueError::TooLarge {
                messages: self.queue.len(),
                bytes: data.len(),
            });
        }
        let listed: u64 = self.queue.iter().map(|&l| u64::from(l)).sum();
        if listed != data.len() as u64 {
            return Err(QueueError::Length {
                listed,
                held: data.len() as u64,
            });
        }
        let mut rest = data;
        let mut out = Vec::with_capacity(self.queue.len());
        for &len in &self.queue {
            let (m, tail) = rest.split_at(len as usize);
            out.push(m);
            rest = tail;
        }
        Ok(out)
    }
}

/// A socket name for people: a path as is, an abstract name as `@name`.
pub fn printable(name: &[u8]) -> String {
    match name.split_first() {
        Some((0, rest)) => format!("@{}", String::from_utf8_lossy(rest)),
        _ => String::from_utf8_lossy(name).into_owned(),
    }
}

/// A UNIX socket in one line: type, inode, name, peer, shutdown, queue.
impl super::Describe for UnixSocketFile {
    fn describe(&self) -> String {
        let mut s = format!("unix {} socket:[{}]", self.type_name(), self.ino);
        if !self.name.is_empty() {
            s += &format!(" name {}", self.printable_name());
        }
        if self.bound.as_ref().is_some_and(|b| b.unlinked) {
            s += " (unlinked)";
        }
        if self.listening {
            s += &format!(" listening backlog {}", self.backlog);
        }
        if self.connect_to_file_id != 0 {
            s += &format!(
                " {} file {} {}",
                if self.sock_type == SOCK_DGRAM {
                    "sends to"
                } else {
                    "pending on"
                },
                self.connect_to_file_id,
                self.peer_name_printable()
            );
        }
        if self.peer_closed {
            s += " peer closed";
        }
        if self.peer_file_id != 0 {
            s += &format!(
                " peer file {} socket:[{}]",
                self.peer_file_id, self.peer_ino
            );
        }
        if self.shutdown != 0 {
            s += &format!(" shutdown {}", self.shutdown);
        }
        let bytes: u64 = self.queue.iter().map(|&l| u64::from(l)).sum();
        s + &format!(" queued {} messages {bytes} bytes", self.queue.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_splits_exactly_or_is_refused() {
        let s = UnixSocketFile {
            queue: vec![3, 0, 2],
            ..Default::default()
        };
        assert_eq!(
            s.messages(b"abcde").unwrap(),
            vec![&b"abc"[..], &b""[..], &b"de"[..]]
        );
        assert_eq!(
            s.messages(b"abcdef"),
            Err(QueueError::Length { listed: 5, held: 6 })
        );
        assert!(s.messages(b"abcd").is_err());
        let huge = UnixSocketFile {
            queue: vec![u32::MAX, u32::MAX],
            ..Default::default()
        };
        assert!(huge.messages(b"").is_err());
    }
}
