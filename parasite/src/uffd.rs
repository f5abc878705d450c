//! A userfaultfd bound to another process's address space, held by ckpt.
//!
//! A userfaultfd watches the memory of the process that created it, but
//! every operation on it (register, write-protect, copy, reading faults)
//! acts on that process's memory whoever holds the fd. So ckpt creates one
//! inside a stopped task ([`create_in`]), takes it over with `pidfd_getfd`
//! and closes the task's copy: the task ends up with no new fd, and its
//! faults reach ckpt. The dumper uses this to keep a snapshot consistent
//! while the job runs (write-protect), the restorer to fill memory on demand
//! (missing pages).
//!
//! Creating one that also catches faults taken inside the kernel (a `read`
//! into protected memory) needs privilege the task's user usually lacks
//! (`vm.unprivileged_userfaultfd` is 0 on most systems). ckpt, as root,
//! opens `/dev/userfaultfd` and hands that fd to the task, which turns it
//! into a userfaultfd of its own with `USERFAULTFD_IOC_NEW`: the task gains
//! nothing it keeps, and the userfaultfd is complete. Without the device,
//! the task's own `userfaultfd(2)` is tried.
//!
//! Thin typed wrappers over the ioctls follow; the `userfaultfd` crate only
//! creates userfaultfds for its own process and does not expose the
//! asynchronous write-protect features, so the few ioctls are written here
//! (their raw calls in `sys.rs`).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;

use crate::error::{ParasiteError, Result};
use crate::sys;
use crate::tracee::Tracee;

/// Something that runs syscalls inside a stopped task, with a scratch
/// buffer in the task's memory for their arguments.
pub trait RemoteCalls {
    /// The task.
    fn tracee(&self) -> &Tracee;
    /// Runs one syscall inside the task and checks its result.
    fn remote_syscall(&self, name: &'static str, nr: i64, args: [u64; 6]) -> Result<u64>;
    /// A buffer in the task's memory free for syscall arguments: address
    /// and length.
    fn scratch(&self) -> (u64, usize);
}

impl RemoteCalls for crate::Infection<'_> {
    fn tracee(&self) -> &Tracee {
        crate::Infection::tracee(self)
    }
    fn remote_syscall(&self, name: &'static str, nr: i64, args: [u64; 6]) -> Result<u64> {
        self.syscall(name, nr, args)
    }
    fn scratch(&self) -> (u64, usize) {
        self.syscall_buffer()
    }
}

impl RemoteCalls for crate::remote::Remote<'_> {
    fn tracee(&self) -> &Tracee {
        self.t
    }
    fn remote_syscall(&self, name: &'static str, nr: i64, args: [u64; 6]) -> Result<u64> {
        self.call(name, nr, args)
    }
    fn scratch(&self) -> (u64, usize) {
        self.scratch_buffer()
    }
}

/// The device that makes complete userfaultfds for whoever holds it open.
const DEVICE: &str = "/dev/userfaultfd";

/// Where the pieces of the fd hand-over sit in the scratch buffer.
mod slot {
    /// `int sv[2]` of socketpair.
    pub const PAIR: u64 = 0;
    /// `struct msghdr`.
    pub const MSGHDR: u64 = 16;
    /// `struct iovec`.
    pub const IOV: u64 = 80;
    /// One byte of payload (a datagram must carry at least one).
    pub const BYTE: u64 = 96;
    /// Control buffer, room for one fd.
    pub const CMSG: u64 = 104;
    /// Bytes used.
    pub const END: u64 = CMSG + super::CMSG_SPACE_ONE_FD;
}

/// `CMSG_SPACE(sizeof(int))` on x86_64.
const CMSG_SPACE_ONE_FD: u64 = 24;
/// Offset of the fd in a control message (`CMSG_DATA`).
const CMSG_DATA_OFFSET: usize = 16;

/// Creates a userfaultfd for the task's address space and returns ckpt's
/// copy; the task is left without it. The task must be stopped under
/// `calls`.
pub fn create_in(calls: &impl RemoteCalls) -> Result<Userfault> {
    let pid = calls.tracee().pid();
    let remote_fd = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(DEVICE)
    {
        Ok(dev) => through_device(calls, &OwnedFd::from(dev))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let flags = (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64;
            calls.remote_syscall("userfaultfd", libc::SYS_userfaultfd, [flags, 0, 0, 0, 0, 0])?
                as i32
        }
        Err(e) => {
            return Err(ParasiteError::Userfault {
                pid,
                what: "open /dev/userfaultfd",
                errno: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
            });
        }
    };
    let taken = sys::take_fd(pid, remote_fd);
    let closed = remote_close(calls, remote_fd);
    let fd = taken.map_err(|errno| ParasiteError::Userfault {
        pid,
        what: "pidfd_getfd",
        errno,
    })?;
    closed?;
    Ok(Userfault { pid, fd })
}

/// Like [`create_in`], but the task keeps its copy too, moved to the
/// lowest free fd at or above `min_fd` (out of the way of the fds a program
/// expects to get), so the userfaultfd outlives ckpt. Returns ckpt's copy
/// and the task's fd.
pub fn create_kept_in(calls: &impl RemoteCalls, min_fd: i32) -> Result<(Userfault, i32)> {
    let uffd = create_in(calls)?;
    // Hand the task a copy of ckpt's: it lands at the lowest free fd,
    // which is then moved up.
    let low = put_fd(calls, uffd.fd.as_fd())?;
    let high = calls.remote_syscall(
        "fcntl F_DUPFD_CLOEXEC",
        libc::SYS_fcntl,
        [
            low as u64,
            libc::F_DUPFD_CLOEXEC as u64,
            min_fd as u64,
            0,
            0,
            0,
        ],
    );
    remote_close(calls, low)?;
    Ok((uffd, high? as i32))
}

/// Takes over the userfaultfd the task holds at `fd` (left there).
pub fn adopt(pid: i32, fd: i32) -> Result<Userfault> {
    let fd = sys::take_fd(pid, fd).map_err(|errno| ParasiteError::Userfault {
        pid,
        what: "pidfd_getfd",
        errno,
    })?;
    Ok(Userfault { pid, fd })
}

/// Gives the task a copy of ckpt's `fd` (over a socket pair made inside
/// it); returns its number there.
fn put_fd(calls: &impl RemoteCalls, fd: BorrowedFd<'_>) -> Result<i32> {
    let t = calls.tracee();
    let pid = t.pid();
    let (buf, len) = calls.scratch();
    if (len as u64) < slot::END {
        return Err(ParasiteError::Layout {
            pid,
            what: "no room to hand over an fd".into(),
        });
    }
    let pair_flags = (libc::SOCK_DGRAM | libc::SOCK_CLOEXEC) as u64;
    calls.remote_syscall(
        "socketpair",
        libc::SYS_socketpair,
        [libc::AF_UNIX as u64, pair_flags, 0, buf + slot::PAIR, 0, 0],
    )?;
    let mut pair = [0u8; 8];
    t.read_mem(buf + slot::PAIR, &mut pair)?;
    let ends = [
        i32::from_le_bytes([pair[0], pair[1], pair[2], pair[3]]),
        i32::from_le_bytes([pair[4], pair[5], pair[6], pair[7]]),
    ];
    let received = (|| -> Result<i32> {
        let sender = sys::take_fd(pid, ends[1]).map_err(|errno| ParasiteError::Userfault {
            pid,
            what: "pidfd_getfd (socket)",
            errno,
        })?;
        sys::send_fd(sender.as_fd(), fd).map_err(|errno| ParasiteError::Userfault {
            pid,
            what: "sendmsg",
            errno,
        })?;
        receive_fd(calls, buf, ends[0])
    })();
    for end in ends {
        remote_close(calls, end)?;
    }
    received
}

fn remote_close(calls: &impl RemoteCalls, fd: i32) -> Result<()> {
    calls
        .remote_syscall("close", libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0])
        .map(|_| ())
}

/// Hands `dev` to the task and has the task make its userfaultfd from it.
/// Returns the task's fd number.
fn through_device(calls: &impl RemoteCalls, dev: &OwnedFd) -> Result<i32> {
    let device_fd = put_fd(calls, dev.as_fd())?;
    let made = calls.remote_syscall(
        "ioctl USERFAULTFD_IOC_NEW",
        libc::SYS_ioctl,
        [
            device_fd as u64,
            sys::USERFAULTFD_IOC_NEW,
            (libc::O_CLOEXEC | libc::O_NONBLOCK) as u64,
            0,
            0,
            0,
        ],
    );
    remote_close(calls, device_fd)?;
    Ok(made? as i32)
}

/// `recvmsg` of one fd on `sock` inside the task; returns its number there.
fn receive_fd(calls: &impl RemoteCalls, buf: u64, sock: i32) -> Result<i32> {
    let t = calls.tracee();
    let mut hdr = [0u8; (slot::IOV - slot::MSGHDR) as usize];
    let mut put = |at: usize, v: u64| hdr[at..at + 8].copy_from_slice(&v.to_le_bytes());
    // struct msghdr: name, namelen, iov, iovlen, control, controllen, flags.
    put(16, buf + slot::IOV);
    put(24, 1);
    put(32, buf + slot::CMSG);
    put(40, CMSG_SPACE_ONE_FD);
    t.write_mem(buf + slot::MSGHDR, &hdr)?;
    let mut iov = [0u8; 16];
    iov[..8].copy_from_slice(&(buf + slot::BYTE).to_le_bytes());
    iov[8..].copy_from_slice(&1u64.to_le_bytes());
    t.write_mem(buf + slot::IOV, &iov)?;
    t.write_mem(buf + slot::CMSG, &[0u8; CMSG_SPACE_ONE_FD as usize])?;
    calls.remote_syscall(
        "recvmsg",
        libc::SYS_recvmsg,
        [
            sock as u64,
            buf + slot::MSGHDR,
            libc::MSG_CMSG_CLOEXEC as u64,
            0,
            0,
            0,
        ],
    )?;
    let mut cmsg = [0u8; CMSG_SPACE_ONE_FD as usize];
    t.read_mem(buf + slot::CMSG, &mut cmsg)?;
    let level = i32::from_le_bytes([cmsg[8], cmsg[9], cmsg[10], cmsg[11]]);
    let kind = i32::from_le_bytes([cmsg[12], cmsg[13], cmsg[14], cmsg[15]]);
    if level != libc::SOL_SOCKET || kind != libc::SCM_RIGHTS {
        return Err(ParasiteError::Userfault {
            pid: t.pid(),
            what: "recvmsg /dev/userfaultfd: no fd arrived",
            errno: Errno::EPROTO,
        });
    }
    let d = CMSG_DATA_OFFSET;
    Ok(i32::from_le_bytes([
        cmsg[d],
        cmsg[d + 1],
        cmsg[d + 2],
        cmsg[d + 3],
    ]))
}

/// Features asked of a userfaultfd (`UFFD_FEATURE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Features(pub u64);

impl Features {
    /// Write-protect faults are reported as such.
    pub const PAGEFAULT_FLAG_WP: Features = Features(1 << 0);
    /// A `fork` of the process is reported with a new userfaultfd for the
    /// child (whose registered ranges stay registered there).
    pub const EVENT_FORK: Features = Features(1 << 1);
    /// An `mremap` of a registered range is reported (and the range stays
    /// registered at its new place).
    pub const EVENT_REMAP: Features = Features(1 << 2);
    /// `madvise(MADV_DONTNEED/REMOVE)` of a registered range is reported.
    pub const EVENT_REMOVE: Features = Features(1 << 3);
    /// `munmap` of a registered range is reported.
    pub const EVENT_UNMAP: Features = Features(1 << 6);
    /// Faults carry the faulting thread's id.
    pub const THREAD_ID: Features = Features(1 << 8);
    /// Write-protection also covers pages never touched yet.
    pub const WP_UNPOPULATED: Features = Features(1 << 13);
    /// Write faults on protected pages resolve in the kernel (the page is
    /// marked written) instead of reaching the reader.
    pub const WP_ASYNC: Features = Features(1 << 15);

    /// Both sets.
    pub const fn with(self, other: Features) -> Features {
        Features(self.0 | other.0)
    }
}

/// How a range is registered (`UFFDIO_REGISTER_MODE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterMode {
    /// Faults on pages not present.
    Missing,
    /// Writes to write-protected pages.
    WriteProtect,
}

/// One message read from a userfaultfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A thread faulted at `addr` and waits (unless the fd is asynchronous).
    Fault {
        /// Faulting address (page aligned unless exact addresses were asked).
        addr: u64,
        /// A write (else a read).
        write: bool,
        /// A write to a write-protected page.
        write_protect: bool,
    },
    /// `madvise` dropped `[start, end)`.
    Remove {
        /// First byte.
        start: u64,
        /// One past the last byte.
        end: u64,
    },
    /// `munmap` removed `[start, end)`.
    Unmap {
        /// First byte.
        start: u64,
        /// One past the last byte.
        end: u64,
    },
    /// `mremap` moved `len` bytes from `from` to `to`.
    Remap {
        /// Old start.
        from: u64,
        /// New start.
        to: u64,
        /// Length.
        len: u64,
    },
    /// The process forked: `ufd` is a new userfaultfd for the child, just
    /// installed in the reader's fd table (take it with
    /// [`Userfault::from_fork`]).
    Fork {
        /// The new fd's number in this process.
        ufd: i32,
    },
    /// Anything else.
    Other {
        /// The raw event code.
        code: u8,
    },
}

/// A userfaultfd of another process, held by ckpt.
#[derive(Debug)]
pub struct Userfault {
    pid: i32,
    fd: OwnedFd,
}

impl Userfault {
    /// The process whose memory it watches (for messages).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    fn err(&self, what: &'static str) -> impl Fn(Errno) -> ParasiteError + '_ {
        move |errno| ParasiteError::Userfault {
            pid: self.pid,
            what,
            errno,
        }
    }

    /// The API handshake, once per fd: asks for `features` and fails naming
    /// the process when the kernel lacks one.
    pub fn enable(&self, features: Features) -> Result<()> {
        sys::uffd_api(self.fd.as_fd(), features.0).map_err(self.err("UFFDIO_API"))
    }

    /// Registers `[start, start+len)`.
    pub fn register(&self, start: u64, len: u64, mode: RegisterMode) -> Result<()> {
        let mode = match mode {
            RegisterMode::Missing => sys::UFFDIO_REGISTER_MODE_MISSING,
            RegisterMode::WriteProtect => sys::UFFDIO_REGISTER_MODE_WP,
        };
        sys::uffd_register(self.fd.as_fd(), start, len, mode).map_err(self.err("UFFDIO_REGISTER"))
    }

    /// Unregisters `[start, start+len)` (waking anything waiting there).
    pub fn unregister(&self, start: u64, len: u64) -> Result<()> {
        sys::uffd_unregister(self.fd.as_fd(), start, len).map_err(self.err("UFFDIO_UNREGISTER"))
    }

    /// Sets (`protect`) or clears write protection on `[start, start+len)`;
    /// clearing wakes the threads waiting there.
    pub fn write_protect(&self, start: u64, len: u64, protect: bool) -> Result<Applied> {
        match sys::uffd_writeprotect(self.fd.as_fd(), start, len, protect) {
            Ok(()) => Ok(Applied::Done),
            Err(Errno::EAGAIN) => Ok(Applied::Busy),
            Err(e) => Err(self.err("UFFDIO_WRITEPROTECT")(e)),
        }
    }

    /// One `UFFDIO_COPY` of `data` to `dst` (waking the threads waiting
    /// there) that reports where and why it stopped instead of retrying:
    /// the caller decides what a present page or a changing map means.
    pub fn copy_step(&self, dst: u64, data: &[u8]) -> Result<Fill> {
        self.step(
            sys::uffd_copy_step(self.fd.as_fd(), dst, data),
            "UFFDIO_COPY",
        )
    }

    /// One `UFFDIO_ZEROPAGE` of `[start, start+len)`, as [`Self::copy_step`].
    pub fn zeropage_step(&self, start: u64, len: u64) -> Result<Fill> {
        self.step(
            sys::uffd_zeropage_step(self.fd.as_fd(), start, len),
            "UFFDIO_ZEROPAGE",
        )
    }

    fn step(&self, s: sys::FillStep, what: &'static str) -> Result<Fill> {
        let stop = match s.stopped {
            None => None,
            Some(Errno::EEXIST) => Some(Stop::Present),
            Some(Errno::EAGAIN) => Some(Stop::Changing),
            Some(Errno::ENOENT) => Some(Stop::Unmapped),
            Some(Errno::ESRCH) => Some(Stop::Exited),
            Some(e) => return Err(self.err(what)(e)),
        };
        Ok(Fill {
            filled: s.filled,
            stop,
        })
    }

    /// Takes the child's userfaultfd a [`Event::Fork`] carried (`ufd`,
    /// never taken before); `parent` names the forking process in messages.
    pub fn from_fork(ufd: i32, parent: i32) -> Userfault {
        // SAFETY: the kernel installed `ufd` in this process's table while
        // the event was read; nothing else knows or owns it.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(ufd) };
        Userfault { pid: parent, fd }
    }

    /// Wakes threads waiting on `[start, start+len)`.
    pub fn wake(&self, start: u64, len: u64) -> Result<()> {
        sys::uffd_wake(self.fd.as_fd(), start, len).map_err(self.err("UFFDIO_WAKE"))
    }

    /// Reads the messages available now (none when nothing is pending).
    pub fn read_events(&self) -> Result<Vec<Event>> {
        let mut out = Vec::new();
        let mut buf = [[0u8; sys::UFFD_MSG_LEN]; 32];
        loop {
            let n = match sys::read_msgs(self.fd.as_fd(), &mut buf) {
                Ok(n) => n,
                Err(Errno::EAGAIN) => return Ok(out),
                Err(e) => return Err(self.err("read")(e)),
            };
            out.extend(buf[..n].iter().map(decode));
            if n < buf.len() {
                return Ok(out);
            }
        }
    }

    /// Waits up to `timeout_ms` for a message.
    pub fn wait(&self, timeout_ms: i32) -> Result<bool> {
        sys::poll_in(self.fd.as_fd(), timeout_ms).map_err(self.err("poll"))
    }

    /// The fd itself (to poll it with others).
    pub fn as_raw_fd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    /// Its inode number (each userfaultfd has its own).
    pub fn inode(&self) -> Result<u64> {
        nix::sys::stat::fstat(self.fd.as_fd())
            .map(|st| st.st_ino)
            .map_err(self.err("fstat"))
    }
}

impl AsFd for Userfault {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// What [`Userfault::write_protect`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Protection set or cleared.
    Done,
    /// Nothing: the process is changing its address space and waits until
    /// its event is read (`EAGAIN`). Read the pending events, then retry.
    Busy,
}

/// What one [`Userfault::copy_step`] or [`Userfault::zeropage_step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fill {
    /// Bytes filled from the start of the range.
    pub filled: u64,
    /// Why it stopped before the end (`None`: the whole range is filled).
    pub stop: Option<Stop>,
}

/// Why a fill stopped short, at the page just after what it filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// That page is present already.
    Present,
    /// The address space is changing (an event is waiting to be read), or
    /// the kernel stopped for its own reasons: read events, then retry.
    Changing,
    /// The range is no longer mapped or registered.
    Unmapped,
    /// The address space is gone (the process exited or called exec).
    Exited,
}

fn decode(m: &[u8; sys::UFFD_MSG_LEN]) -> Event {
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&m[at..at + 8]);
        u64::from_le_bytes(b)
    };
    // struct uffd_msg: event (u8), padding to 8, then a 24-byte union.
    match m[0] {
        sys::UFFD_EVENT_PAGEFAULT => {
            let flags = word(8);
            Event::Fault {
                addr: word(16),
                write: flags & sys::UFFD_PAGEFAULT_FLAG_WRITE != 0,
                write_protect: flags & sys::UFFD_PAGEFAULT_FLAG_WP != 0,
            }
        }
        sys::UFFD_EVENT_FORK => Event::Fork {
            ufd: i32::from_le_bytes([m[8], m[9], m[10], m[11]]),
        },
        sys::UFFD_EVENT_REMOVE => Event::Remove {
            start: word(8),
            end: word(16),
        },
        sys::UFFD_EVENT_UNMAP => Event::Unmap {
            start: word(8),
            end: word(16),
        },
        sys::UFFD_EVENT_REMAP => Event::Remap {
            from: word(8),
            to: word(16),
            len: word(24),
        },
        code => Event::Other { code },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_messages() {
        let mut m = [0u8; sys::UFFD_MSG_LEN];
        m[0] = sys::UFFD_EVENT_PAGEFAULT;
        m[8..16].copy_from_slice(
            &(sys::UFFD_PAGEFAULT_FLAG_WRITE | sys::UFFD_PAGEFAULT_FLAG_WP).to_le_bytes(),
        );
        m[16..24].copy_from_slice(&0x7000u64.to_le_bytes());
        assert_eq!(
            decode(&m),
            Event::Fault {
                addr: 0x7000,
                write: true,
                write_protect: true
            }
        );
        m[0] = sys::UFFD_EVENT_REMAP;
        m[8..16].copy_from_slice(&0x1000u64.to_le_bytes());
        m[16..24].copy_from_slice(&0x9000u64.to_le_bytes());
        m[24..32].copy_from_slice(&0x2000u64.to_le_bytes());
        assert_eq!(
            decode(&m),
            Event::Remap {
                from: 0x1000,
                to: 0x9000,
                len: 0x2000
            }
        );
        m[0] = sys::UFFD_EVENT_FORK;
        m[8..12].copy_from_slice(&7i32.to_le_bytes());
        assert_eq!(decode(&m), Event::Fork { ufd: 7 });
    }

    /// A userfaultfd of this very process, write-protecting one page: the
    /// kernel-side operations ckpt relies on, without a second process.
    #[test]
    fn write_protect_reports_writes() {
        // SAFETY: integer arguments only.
        let raw = unsafe {
            libc::syscall(
                libc::SYS_userfaultfd,
                libc::O_CLOEXEC | libc::O_NONBLOCK | sys::UFFD_USER_MODE_ONLY,
            )
        };
        if raw < 0 {
            eprintln!("skipped: userfaultfd unavailable: {}", Errno::last());
            return;
        }
        // SAFETY: a fresh fd nothing else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw as i32) };
        let u = Userfault { pid: 0, fd };
        u.enable(Features::PAGEFAULT_FLAG_WP).unwrap();
        let page = nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
            .unwrap()
            .unwrap() as usize;
        let mut mem = vec![0u8; page * 3];
        let at = (mem.as_mut_ptr() as usize).next_multiple_of(page);
        // SAFETY: `at` lies inside `mem`, one page is within its bounds.
        unsafe { std::ptr::write_volatile(at as *mut u8, 1) };
        u.register(at as u64, page as u64, RegisterMode::WriteProtect)
            .unwrap();
        assert_eq!(
            u.write_protect(at as u64, page as u64, true).unwrap(),
            Applied::Done
        );
        assert!(!u.wait(0).unwrap(), "no fault yet");
        let writer = std::thread::spawn(move || {
            // SAFETY: as above; the write blocks until unprotected.
            unsafe { std::ptr::write_volatile(at as *mut u8, 2) };
        });
        assert!(u.wait(5000).unwrap(), "the write was reported");
        let events = u.read_events().unwrap();
        assert_eq!(
            events,
            vec![Event::Fault {
                addr: at as u64,
                write: true,
                write_protect: true
            }]
        );
        // SAFETY: reading our own live page.
        assert_eq!(unsafe { std::ptr::read_volatile(at as *const u8) }, 1);
        assert_eq!(
            u.write_protect(at as u64, page as u64, false).unwrap(),
            Applied::Done
        );
        writer.join().unwrap();
        // SAFETY: as above.
        assert_eq!(unsafe { std::ptr::read_volatile(at as *const u8) }, 2);
        drop(mem);
    }
}
