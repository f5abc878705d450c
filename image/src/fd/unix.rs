//! UNIX domain sockets: type, peer (by file id), address, shutdown state,
//! options, and the messages queued for the socket to read (raw image
//! `unix-FILE_ID.img`, see [`crate::unix_queue_name`]) or, on a
//! connection not yet accepted, those it sent (`unix-unaccepted-FILE_ID.img`,
//! [`crate::unix_unaccepted_name`]).
//!
//! The message is defined in `image/proto/fd_unix.proto`.

pub use crate::pb::{UnixAncillary, UnixBoundFile, UnixCreds, UnixSocketFile};

/// Most files one message may carry (the kernel's SCM_MAX_FD): a bound on
/// what an image may ask the restorer to send.
pub const MAX_FILES_PER_MESSAGE: usize = 253;

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
    /// The ancillary data is listed for a different number of messages
    /// than the queue holds.
    #[error("ancillary data listed for {listed} messages but {queued} are queued")]
    Ancillary {
        /// Entries of `ancillary`.
        listed: usize,
        /// Entries of `queue`.
        queued: usize,
    },
    /// A message carries more files than the kernel passes in one.
    #[error("a queued message carries {files} files (at most {MAX_FILES_PER_MESSAGE})")]
    TooManyFiles {
        /// Files listed for that message.
        files: usize,
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
        if !self.ancillary.is_empty() && self.ancillary.len() != self.queue.len() {
            return Err(QueueError::Ancillary {
                listed: self.ancillary.len(),
                queued: self.queue.len(),
            });
        }
        if let Some(a) = self
            .ancillary
            .iter()
            .find(|a| a.file_ids.len() > MAX_FILES_PER_MESSAGE)
        {
            return Err(QueueError::TooManyFiles {
                files: a.file_ids.len(),
            });
        }
        split(&self.queue, data)
    }

    /// Splits the image of the messages it sent on a connection not yet
    /// accepted (`unaccepted_queue`) likewise.
    pub fn unaccepted_messages<'d>(&self, data: &'d [u8]) -> Result<Vec<&'d [u8]>, QueueError> {
        split(&self.unaccepted_queue, data)
    }
}

/// Splits `data` into messages of `lengths`, checking it holds exactly
/// them and stays within the bounds ckpt accepts.
fn split<'d>(lengths: &[u32], data: &'d [u8]) -> Result<Vec<&'d [u8]>, QueueError> {
    if data.len() > MAX_QUEUE_BYTES || lengths.len() > MAX_QUEUE_MESSAGES {
        return Err(QueueError::TooLarge {
            messages: lengths.len(),
            bytes: data.len(),
        });
    }
    let listed: u64 = lengths.iter().map(|&l| u64::from(l)).sum();
    if listed != data.len() as u64 {
        return Err(QueueError::Length {
            listed,
            held: data.len() as u64,
        });
    }
    let mut rest = data;
    let mut out = Vec::with_capacity(lengths.len());
    for &len in lengths {
        let (m, tail) = rest.split_at(len as usize);
        out.push(m);
        rest = tail;
    }
    Ok(out)
}

impl UnixSocketFile {
    /// Some queued message carries files (SCM_RIGHTS).
    pub fn has_files_in_flight(&self) -> bool {
        self.ancillary.iter().any(|a| !a.file_ids.is_empty())
    }

    /// The ancillary data of queued message `i` (none if not listed).
    pub fn ancillary_of(&self, i: usize) -> Option<&UnixAncillary> {
        self.ancillary.get(i)
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
        if !self.unaccepted_queue.is_empty() {
            let sent: u64 = self.unaccepted_queue.iter().map(|&l| u64::from(l)).sum();
            s += &format!(
                " sent {} messages {sent} bytes before accept",
                self.unaccepted_queue.len()
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
        s += &format!(" queued {} messages {bytes} bytes", self.queue.len());
        let in_flight: Vec<String> = self
            .ancillary
            .iter()
            .flat_map(|a| a.file_ids.iter().map(u64::to_string))
            .collect();
        if !in_flight.is_empty() {
            s += &format!(" files in flight {}", in_flight.join(","));
        }
        if self.ancillary.iter().any(|a| a.creds.is_some()) {
            s += " with senders' credentials";
        }
        s
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

    #[test]
    fn data_sent_before_accept_splits_by_its_own_lengths() {
        let s = UnixSocketFile {
            queue: vec![],
            unaccepted_queue: vec![5, 3],
            ..Default::default()
        };
        assert_eq!(
            s.unaccepted_messages(b"earlyone").unwrap(),
            vec![&b"early"[..], &b"one"[..]]
        );
        assert_eq!(
            s.unaccepted_messages(b"early"),
            Err(QueueError::Length { listed: 8, held: 5 })
        );
        assert!(s.messages(b"").unwrap().is_empty());
        use crate::fd::Describe;
        assert!(
            s.describe()
                .contains("sent 2 messages 8 bytes before accept")
        );
    }

    #[test]
    fn ancillary_must_match_the_queue_and_the_kernel_bound() {
        let one = |n: usize| UnixAncillary {
            file_ids: vec![1; n],
            creds: None,
        };
        let mut s = UnixSocketFile {
            queue: vec![1, 1],
            ancillary: vec![one(1), one(0)],
            ..Default::default()
        };
        assert!(s.messages(b"ab").is_ok());
        assert!(s.has_files_in_flight());
        s.ancillary.pop();
        assert_eq!(
            s.messages(b"ab"),
            Err(QueueError::Ancillary {
                listed: 1,
                queued: 2
            })
        );
        s.ancillary = vec![one(MAX_FILES_PER_MESSAGE + 1), one(0)];
        assert!(s.messages(b"ab").is_err());
    }
}
