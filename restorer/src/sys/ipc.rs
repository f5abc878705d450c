//! SysV IPC: creating the tree's shared memory segments, semaphore sets
//! and message queues with their ids, and the keeper that removes them if
//! the restorer dies before the tree runs.

use super::check_ret;

/// Mode of a SysV object while the restorer creates and fills it: only
/// root (the restorer) may use it until its owner and mode are set.
pub const NEW_OBJECT_MODE: i32 = 0o600;

/// `shmget(key, size, IPC_CREAT | IPC_EXCL | 0600)`: a new segment only
/// root (the restorer) can use until its owner and mode are set.
pub fn shm_create(key: i32, size: u64) -> std::io::Result<i32> {
    // SAFETY: integers only.
    check_ret(unsafe {
        libc::shmget(
            key,
            size as usize,
            libc::IPC_CREAT | libc::IPC_EXCL | NEW_OBJECT_MODE,
        )
    } as libc::c_long)
    .map(|r| r as i32)
}

/// `semget(key, nsems, IPC_CREAT | IPC_EXCL | 0600)`.
pub fn sem_create(key: i32, nsems: i32) -> std::io::Result<i32> {
    // SAFETY: integers only.
    check_ret(unsafe {
        libc::semget(
            key,
            nsems,
            libc::IPC_CREAT | libc::IPC_EXCL | NEW_OBJECT_MODE,
        )
    } as libc::c_long)
    .map(|r| r as i32)
}

/// `msgget(key, IPC_CREAT | IPC_EXCL | 0600)`.
pub fn msg_create(key: i32) -> std::io::Result<i32> {
    // SAFETY: integers only.
    check_ret(
        unsafe { libc::msgget(key, libc::IPC_CREAT | libc::IPC_EXCL | NEW_OBJECT_MODE) }
            as libc::c_long,
    )
    .map(|r| r as i32)
}

/// Owner, group and permission bits of an object (`IPC_SET`).
#[derive(Debug, Clone, Copy)]
pub struct IpcOwner {
    /// Owner uid.
    pub uid: u32,
    /// Owner gid.
    pub gid: u32,
    /// Permission bits.
    pub mode: u32,
}

/// `shmctl(IPC_SET)`.
pub fn shm_set(id: i32, o: IpcOwner) -> std::io::Result<()> {
    // SAFETY: an all-zero shmid_ds is valid; IPC_STAT fills it.
    let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: `ds` is a live shmid_ds, written by IPC_STAT and read by IPC_SET.
    check_ret(unsafe { libc::shmctl(id, libc::IPC_STAT, &mut ds) } as libc::c_long)?;
    ds.shm_perm.uid = o.uid;
    ds.shm_perm.gid = o.gid;
    ds.shm_perm.mode = o.mode as _;
    // SAFETY: as above.
    check_ret(unsafe { libc::shmctl(id, libc::IPC_SET, &mut ds) } as libc::c_long).map(drop)
}

/// `semctl(IPC_SET)`.
pub fn sem_set(id: i32, o: IpcOwner) -> std::io::Result<()> {
    // SAFETY: an all-zero semid_ds is valid; IPC_STAT fills it.
    let mut ds: libc::semid_ds = unsafe { std::mem::zeroed() };
    let dsp = &mut ds as *mut libc::semid_ds;
    // SAFETY: `dsp` points at a live semid_ds, written by IPC_STAT.
    let r = unsafe { libc::semctl(id, 0, libc::IPC_STAT, dsp) };
    check_ret(r as libc::c_long)?;
    ds.sem_perm.uid = o.uid;
    ds.sem_perm.gid = o.gid;
    ds.sem_perm.mode = o.mode as _;
    let dsp = &mut ds as *mut libc::semid_ds;
    // SAFETY: as above; IPC_SET only reads it.
    let r = unsafe { libc::semctl(id, 0, libc::IPC_SET, dsp) };
    check_ret(r as libc::c_long).map(drop)
}

/// `semctl(SETALL)`.
pub fn sem_setall(id: i32, values: &[u16]) -> std::io::Result<()> {
    // SAFETY: SETALL reads nsems unsigned shorts; `values` has that many
    // (checked by the caller against the set it created).
    check_ret(unsafe { libc::semctl(id, 0, libc::SETALL, values.as_ptr()) } as libc::c_long)
        .map(drop)
}

/// `msgctl(IPC_SET)` with the queue's byte limit too.
pub fn msg_set(id: i32, o: IpcOwner, qbytes: u64) -> std::io::Result<()> {
    // SAFETY: an all-zero msqid_ds is valid; IPC_STAT fills it.
    let mut ds: libc::msqid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: `ds` is a live msqid_ds, written by IPC_STAT and read by IPC_SET.
    check_ret(unsafe { libc::msgctl(id, libc::IPC_STAT, &mut ds) } as libc::c_long)?;
    ds.msg_perm.uid = o.uid;
    ds.msg_perm.gid = o.gid;
    ds.msg_perm.mode = o.mode as _;
    ds.msg_qbytes = qbytes as _;
    // SAFETY: as above.
    check_ret(unsafe { libc::msgctl(id, libc::IPC_SET, &mut ds) } as libc::c_long).map(drop)
}

/// `msgsnd(IPC_NOWAIT)` of one message.
pub fn msg_send(id: i32, mtype: i64, text: &[u8]) -> std::io::Result<()> {
    let long = std::mem::size_of::<libc::c_long>();
    let mut buf = Vec::with_capacity(long + text.len());
    buf.extend_from_slice(&mtype.to_ne_bytes());
    buf.extend_from_slice(text);
    // SAFETY: `buf` is a long mtype followed by text.len() bytes, which
    // msgsnd only reads.
    check_ret(
        unsafe { libc::msgsnd(id, buf.as_ptr().cast(), text.len(), libc::IPC_NOWAIT) }
            as libc::c_long,
    )
    .map(drop)
}

// Twin in dumper/src/sys/ipc.rs (IpcKind, ipc_rmid): kept apart because the dumper and restorer share no syscall crate.
/// Which SysV IPC object kind an id is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpcKind {
    /// Shared memory segment.
    Shm,
    /// Semaphore set.
    Sem,
    /// Message queue.
    Msg,
}

/// Removes SysV object `id` (`IPC_RMID`).
pub fn ipc_rmid(kind: IpcKind, id: i32) -> std::io::Result<()> {
    // SAFETY: IPC_RMID takes no argument memory (a null buffer is allowed).
    let r = unsafe {
        match kind {
            IpcKind::Shm => libc::shmctl(id, libc::IPC_RMID, std::ptr::null_mut()),
            IpcKind::Sem => libc::semctl(id, 0, libc::IPC_RMID),
            IpcKind::Msg => libc::msgctl(id, libc::IPC_RMID, std::ptr::null_mut()),
        }
    };
    check_ret(r as libc::c_long).map(drop)
}

/// A read-write attach of a segment in the restorer, detached on drop.
pub struct ShmAttach {
    addr: *mut libc::c_void,
    len: usize,
}

impl ShmAttach {
    /// Attaches segment `shmid` (`len` bytes, whole pages) read-write.
    pub fn new(shmid: i32, len: usize) -> std::io::Result<Self> {
        // SAFETY: a new mapping placed by the kernel; nothing of ours moves.
        let addr = unsafe { libc::shmat(shmid, std::ptr::null(), 0) };
        if addr as isize == -1 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self { addr, len })
    }

    /// The segment's bytes, to fill.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the attach maps `len` writable bytes until drop; only
        // the restorer's own segment, which no process uses yet.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len) }
    }
}

impl Drop for ShmAttach {
    fn drop(&mut self) {
        // SAFETY: detaches our own attach; borrows of it ended before drop.
        unsafe { libc::shmdt(self.addr) };
    }
}

/// `shmctl(SHM_LOCK)`: keep the segment's pages in memory.
pub fn shm_lock(id: i32) -> std::io::Result<()> {
    // SAFETY: SHM_LOCK takes no argument memory (a null buffer is allowed).
    let r = unsafe { libc::shmctl(id, libc::SHM_LOCK, std::ptr::null_mut()) };
    check_ret(r as libc::c_long).map(drop)
}

/// Record code telling the [`IpcKeeper`] child to forget every object.
const KEEPER_FORGET: i32 = 0;

/// A child process that removes the SysV objects a restore created if the
/// restorer dies before the tree runs: a SIGKILLed restorer runs no
/// destructor, and objects left with the checkpoint's ids and keys would
/// fail every later restore ("already taken here") and hold the job's data.
///
/// The restorer sends it one record per object it created over a pipe
/// (close-on-exec; restored processes close their inherited copy while
/// they are rebuilt, or die with the restorer). A "forget" record ends it
/// with nothing removed; end of file before one (every writer dead)
/// makes it remove what it was told, newest first, and exit.
pub struct IpcKeeper {
    to_keeper: std::os::fd::OwnedFd,
    pid: i32,
}

impl IpcKeeper {
    /// Forks the keeper, able to remember `capacity` objects (the records
    /// are stored in memory allocated before the fork: the child of a
    /// multi-threaded process must not allocate).
    pub fn spawn(capacity: usize) -> std::io::Result<Self> {
        use std::os::fd::FromRawFd;
        let mut ends = [0i32; 2];
        // SAFETY: pipe2 writes two fds into the array we own.
        check_ret(unsafe { libc::pipe2(ends.as_mut_ptr(), libc::O_CLOEXEC) } as libc::c_long)?;
        let mut records: Vec<[i32; 2]> = Vec::with_capacity(capacity.max(1));
        let (buf, cap) = (records.as_mut_ptr(), records.capacity());
        // SAFETY: the child runs only `keeper_main`, raw syscalls on memory
        // allocated before the fork; it never returns.
        match unsafe { libc::fork() } {
            -1 => {
                let e = std::io::Error::last_os_error();
                // SAFETY: closing the two fds pipe2 just gave us.
                unsafe {
                    libc::close(ends[0]);
                    libc::close(ends[1]);
                }
                Err(e)
            }
            // SAFETY: in the child, as above.
            0 => unsafe { keeper_main(ends[0], buf, cap) },
            pid => {
                // SAFETY: the read end is the child's; ours goes.
                unsafe { libc::close(ends[0]) };
                drop(records);
                Ok(IpcKeeper {
                    // SAFETY: the write end is a fresh fd owned by nobody else.
                    to_keeper: unsafe { std::os::fd::OwnedFd::from_raw_fd(ends[1]) },
                    pid,
                })
            }
        }
    }

    /// Tells the keeper object `id` of `kind` was created.
    pub fn record(&self, kind: IpcKind, id: i32) -> std::io::Result<()> {
        let code = match kind {
            IpcKind::Shm => 1,
            IpcKind::Sem => 2,
            IpcKind::Msg => 3,
        };
        keeper_send(&self.to_keeper, [code, id])
    }

    /// Ends the keeper with nothing removed (the tree runs, or the
    /// restorer removed the objects itself) and reaps it.
    pub fn release(self) {
        let _ = keeper_send(&self.to_keeper, [KEEPER_FORGET, 0]);
        drop(self.to_keeper);
        let mut status = 0;
        // SAFETY: waits for our own child; status is a local.
        unsafe { libc::waitpid(self.pid, &mut status, 0) };
    }
}

fn keeper_send(to: &std::os::fd::OwnedFd, record: [i32; 2]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: writes the 8 bytes of a local array to an fd we own; a pipe
    // write of fewer than PIPE_BUF bytes is all or nothing.
    let n = unsafe { libc::write(to.as_raw_fd(), record.as_ptr().cast(), 8) };
    if n == 8 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The keeper's whole life, in the forked child.
///
/// # Safety
/// Only in the child of a fork: `buf` holds `cap` records allocated before
/// the fork; raw syscalls only.
unsafe fn keeper_main(from: i32, buf: *mut [i32; 2], cap: usize) -> ! {
    // SAFETY: raw syscalls on integers and on `buf`, which has room for
    // `cap` records; the process ends with _exit.
    unsafe {
        // Holding none of the restorer's fds: its stdio and pipes must end
        // with it, not with us.
        if from > 0 {
            libc::syscall(libc::SYS_close_range, 0, from - 1, 0);
        }
        libc::syscall(libc::SYS_close_range, from + 1, u32::MAX, 0);
        libc::setsid();
        for sig in [libc::SIGHUP, libc::SIGINT, libc::SIGTERM, libc::SIGPIPE] {
            libc::signal(sig, libc::SIG_IGN);
        }
        let mut n = 0;
        loop {
            let mut rec = [0i32; 2];
            let r = libc::read(from, rec.as_mut_ptr().cast(), 8);
            if r == 8 {
                if rec[0] == KEEPER_FORGET {
                    libc::_exit(0);
                }
                if n < cap {
                    *buf.add(n) = rec;
                    n += 1;
                }
                continue;
            }
            if r < 0 && *libc::__errno_location() == libc::EINTR {
                continue;
            }
            break;
        }
        while n > 0 {
            n -= 1;
            let [code, id] = *buf.add(n);
            match code {
                1 => libc::syscall(libc::SYS_shmctl, id, libc::IPC_RMID, 0),
                2 => libc::syscall(libc::SYS_semctl, id, 0, libc::IPC_RMID, 0),
                _ => libc::syscall(libc::SYS_msgctl, id, libc::IPC_RMID, 0),
            };
        }
        libc::_exit(0)
    }
}
