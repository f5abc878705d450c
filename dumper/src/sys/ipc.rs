//! SysV IPC: reading shared memory segments, semaphores and message
//! queues of the dumped tree, and removing those of a tree `--kill` ended.

/// `msgrcv` flag: copy the message at an index instead of receiving it
/// (needs CONFIG_CHECKPOINT_RESTORE).
const MSG_COPY: libc::c_int = 0o40000;

fn check(r: libc::c_long) -> std::io::Result<libc::c_long> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// A read-only attach of a SysV shared memory segment in ckpt itself,
/// detached on drop.
pub struct ShmAttach {
    addr: *mut libc::c_void,
    len: usize,
}

impl ShmAttach {
    /// Attaches segment `shmid` (of `len` bytes, rounded to pages) read-only.
    pub fn new(shmid: i32, len: usize) -> std::io::Result<Self> {
        // SAFETY: a new mapping chosen by the kernel; nothing of ours moves.
        let addr = unsafe { libc::shmat(shmid, std::ptr::null(), libc::SHM_RDONLY) };
        if addr as isize == -1 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self { addr, len })
    }

    /// The segment's bytes. Another process may write them meanwhile, so
    /// they are only ever copied out, never trusted to stay put.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the attach maps `len` readable bytes until drop.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len) }
    }

    /// Which pages the segment holds, one bool per page: swapped-out pages
    /// are read back first (`MADV_WILLNEED` on shmem swaps in), then
    /// `mincore` reports what is in the segment's page cache; holes are
    /// neither, and reading them would allocate them.
    pub fn present_pages(&self) -> std::io::Result<Vec<bool>> {
        let pages = self.len.div_ceil(4096);
        let mut vec = vec![0u8; pages];
        // SAFETY: advice on our own mapping; touches no memory of ours.
        check(unsafe { libc::madvise(self.addr, self.len, libc::MADV_WILLNEED) } as libc::c_long)?;
        // SAFETY: `vec` has one byte per page of the mapping, as mincore
        // writes.
        check(unsafe { libc::mincore(self.addr, self.len, vec.as_mut_ptr()) } as libc::c_long)?;
        Ok(vec.iter().map(|b| b & 1 != 0).collect())
    }
}

impl Drop for ShmAttach {
    fn drop(&mut self) {
        // SAFETY: detaches our own attach; `bytes` borrows end before drop.
        unsafe { libc::shmdt(self.addr) };
    }
}

/// Every semaphore value of set `semid` (`semctl(GETALL)`).
pub fn sem_getall(semid: i32, nsems: usize) -> std::io::Result<Vec<u16>> {
    let mut vals = vec![0u16; nsems];
    // SAFETY: GETALL writes nsems unsigned shorts into the array.
    check(unsafe { libc::semctl(semid, 0, libc::GETALL, vals.as_mut_ptr()) } as libc::c_long)?;
    Ok(vals)
}

/// The pid of the last operation on semaphore `n` of `semid` (`GETPID`).
pub fn sem_getpid(semid: i32, n: i32) -> std::io::Result<i32> {
    // SAFETY: GETPID takes no argument memory.
    check(unsafe { libc::semctl(semid, n, libc::GETPID) } as libc::c_long).map(|r| r as i32)
}

/// `msg_qbytes` of queue `msqid` (`msgctl(IPC_STAT)`).
pub fn msg_qbytes(msqid: i32) -> std::io::Result<u64> {
    // SAFETY: an all-zero msqid_ds is a valid value; IPC_STAT fills it.
    let mut ds: libc::msqid_ds = unsafe { std::mem::zeroed() };
    // SAFETY: `ds` is a live msqid_ds the kernel writes.
    check(unsafe { libc::msgctl(msqid, libc::IPC_STAT, &mut ds) } as libc::c_long)?;
    Ok(ds.msg_qbytes as u64)
}

/// A message copied out of a queue.
pub struct CopiedMessage {
    /// Its type.
    pub mtype: i64,
    /// Its text.
    pub text: Vec<u8>,
}

/// The message at `index` of queue `msqid`, copied without receiving it
/// (`msgrcv(MSG_COPY | IPC_NOWAIT)`); `None` past the end. `max_text`
/// bounds the text (msgmax).
pub fn msg_copy(
    msqid: i32,
    index: usize,
    max_text: usize,
) -> std::io::Result<Option<CopiedMessage>> {
    let mut buf = vec![0u8; std::mem::size_of::<libc::c_long>() + max_text];
    // SAFETY: `buf` holds a long mtype and max_text bytes of text, as
    // msgrcv writes at most.
    let r = unsafe {
        libc::msgrcv(
            msqid,
            buf.as_mut_ptr().cast(),
            max_text,
            index as libc::c_long,
            MSG_COPY | libc::IPC_NOWAIT,
        )
    };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENOMSG) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    let long = std::mem::size_of::<libc::c_long>();
    let mtype = i64::from_ne_bytes(buf[..long].try_into().expect("8 bytes"));
    Ok(Some(CopiedMessage {
        mtype,
        text: buf[long..long + r as usize].to_vec(),
    }))
}

// Twin in restorer/src/sys/ipc.rs (IpcKind, ipc_rmid): kept apart because the dumper and restorer share no syscall crate.
/// Which SysV IPC object kind an `IPC_RMID` is for.
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
    check(r as libc::c_long).map(drop)
}
