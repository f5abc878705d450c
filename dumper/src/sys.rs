//! Raw syscalls of the dumper that neither nix nor the parasite crate wrap.

/// `kcmp` type: compare two file descriptors' open file descriptions.
const KCMP_FILE: libc::c_int = 0;

/// True when fd `a` of `pid_a` and fd `b` of `pid_b` share one open file
/// description, per `kcmp(2)`.
pub fn same_file_description_of(pid_a: i32, a: i32, pid_b: i32, b: i32) -> std::io::Result<bool> {
    // SAFETY: kcmp takes only integers and touches no memory of ours.
    let r = unsafe { libc::syscall(libc::SYS_kcmp, pid_a, pid_b, KCMP_FILE, a, b) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r == 0)
    }
}

/// `kcmp` type: compare an fd with a file registered in an epoll.
const KCMP_EPOLL_TFD: libc::c_int = 7;

/// `struct kcmp_epoll_slot`: which registration of epoll `efd` to compare.
#[repr(C)]
struct KcmpEpollSlot {
    efd: u32,
    tfd: u32,
    toff: u32,
}

/// Whether fd `fd` of `pid` is the file registered in epoll `efd` of
/// `epoll_pid` as its `toff`-th registration under fd number `tfd`
/// (`kcmp(KCMP_EPOLL_TFD)`). `Err` with `EOPNOTSUPP` or `EINVAL` where the
/// kernel cannot tell.
pub fn same_epoll_target(
    pid: i32,
    fd: i32,
    epoll_pid: i32,
    efd: i32,
    tfd: i32,
    toff: u32,
) -> std::io::Result<bool> {
    let slot = KcmpEpollSlot {
        efd: efd as u32,
        tfd: tfd as u32,
        toff,
    };
    // SAFETY: the only pointer is to a live local struct of the layout
    // kcmp(2) documents, which the kernel only reads.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pid,
            epoll_pid,
            KCMP_EPOLL_TFD,
            fd,
            &slot as *const KcmpEpollSlot,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r == 0)
    }
}

/// `lseek(fd, off, whence)`; `None` where SEEK_DATA finds no more data
/// (ENXIO).
pub fn seek(fd: i32, off: u64, whence: i32) -> std::io::Result<Option<u64>> {
    // SAFETY: lseek takes only integers.
    let r = unsafe { libc::lseek(fd, off as libc::off_t, whence) };
    if r >= 0 {
        return Ok(Some(r as u64));
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ENXIO) {
        Ok(None)
    } else {
        Err(e)
    }
}

fn ret(r: libc::c_long) -> Result<libc::c_long, i32> {
    if r < 0 {
        Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    } else {
        Ok(r)
    }
}

fn close(fd: libc::c_long) {
    let _ = nix::unistd::close(fd as i32);
}

/// `prctl(PR_SET_MM, PR_SET_MM_MAP_SIZE)`: the size of `struct prctl_mm_map`,
/// or an errno if the kernel lacks PR_SET_MM_MAP.
pub fn prctl_mm_map_size() -> Result<u32, i32> {
    let mut size: u32 = 0;
    // SAFETY: the only pointer is to a live local u32 the kernel writes.
    ret(unsafe { libc::syscall(libc::SYS_prctl, 35, 15, &mut size as *mut u32, 0, 0) })?;
    Ok(size)
}

/// `kcmp(self, self, KCMP_VM)`: works wherever kcmp exists.
pub fn kcmp_probe() -> Result<(), i32> {
    let me = std::process::id() as libc::c_long;
    // SAFETY: integer arguments only.
    ret(unsafe { libc::syscall(libc::SYS_kcmp, me, me, 1, 0, 0) }).map(|_| ())
}

/// `pidfd_open(self)` + `pidfd_getfd(2)`: the fd-stealing path.
pub fn pidfd_getfd_probe() -> Result<(), i32> {
    // SAFETY: integer arguments only.
    let pidfd = ret(unsafe { libc::syscall(libc::SYS_pidfd_open, std::process::id(), 0) })?;
    // SAFETY: integer arguments only; stderr is open in any ckpt run.
    let r = ret(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd, 2, 0) });
    close(pidfd);
    r.map(close)
}

/// `userfaultfd(UFFD_USER_MODE_ONLY)`.
pub fn userfaultfd_probe() -> Result<(), i32> {
    // SAFETY: integer arguments only.
    ret(unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | 1) }).map(close)
}

/// `PAGEMAP_SCAN` = `_IOWR('f', 16, struct pm_scan_arg)` with a 96-byte argument.
const PAGEMAP_SCAN: libc::c_ulong = 0xc060_6610;

/// Page categories of `PAGEMAP_SCAN` (uapi linux/fs.h).
pub mod page_is {
    /// The page is file backed (or shared anonymous / shmem).
    pub const FILE: u64 = 1 << 2;
    /// The page is present in memory.
    pub const PRESENT: u64 = 1 << 3;
    /// The page is swapped out.
    pub const SWAPPED: u64 = 1 << 4;
    /// The page is the shared zero page (read-faulted, never written).
    pub const PFNZERO: u64 = 1 << 5;
}

/// The kernel's `struct pm_scan_arg`.
#[repr(C)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

const _: () = assert!(std::mem::size_of::<PmScanArg>() == 96);

/// One run of pages with the same categories (`struct page_region`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageRegion {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// `page_is` bits (restricted to the return mask).
    pub categories: u64,
}

/// Scans `[start, end)` of the process behind `pagemap` with the
/// `PAGEMAP_SCAN` ioctl (6.7+), appending every run of pages that has any
/// of `anyof` to `out`, reported with the categories in `report`.
pub fn pagemap_scan(
    pagemap: &std::fs::File,
    start: u64,
    end: u64,
    anyof: u64,
    report: u64,
    out: &mut Vec<PageRegion>,
) -> std::io::Result<()> {
    let mut regions = vec![PageRegion::default(); 512];
    let mut cur = start;
    while cur < end {
        let mut arg = PmScanArg {
            size: std::mem::size_of::<PmScanArg>() as u64,
            flags: 0,
            start: cur,
            end,
            walk_end: 0,
            vec: regions.as_mut_ptr() as u64,
            vec_len: regions.len() as u64,
            max_pages: 0,
            category_inverted: 0,
            category_mask: 0,
            category_anyof_mask: anyof,
            return_mask: report,
        };
        // SAFETY: `arg` is a valid pm_scan_arg whose `vec` points to
        // `regions`, which has room for `vec_len` page_regions and outlives
        // the call; the kernel writes at most that many and updates walk_end.
        let n = unsafe {
            libc::ioctl(
                std::os::fd::AsRawFd::as_raw_fd(pagemap),
                PAGEMAP_SCAN,
                &mut arg as *mut PmScanArg,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        out.extend_from_slice(&regions[..n as usize]);
        if arg.walk_end <= cur {
            break;
        }
        cur = arg.walk_end;
    }
    Ok(())
}

/// True when this kernel has the `PAGEMAP_SCAN` ioctl.
pub fn pagemap_scan_probe(pagemap: &std::fs::File) -> Result<(), i32> {
    let probe = [0u8; 1];
    let addr = probe.as_ptr() as u64 & !4095;
    pagemap_scan(
        pagemap,
        addr,
        addr + 4096,
        page_is::PRESENT,
        page_is::PRESENT,
        &mut Vec::new(),
    )
    .map_err(|e| e.raw_os_error().unwrap_or(0))
}

/// Forks a child that only sleeps in `pause()` until killed.
pub fn fork_sleeper() -> nix::Result<nix::unistd::Pid> {
    use nix::unistd::{ForkResult, fork};
    // SAFETY: the child only calls async-signal-safe pause() in a loop.
    match unsafe { fork() }? {
        ForkResult::Child => loop {
            // SAFETY: pause is async-signal-safe and touches no memory.
            unsafe {
                libc::pause();
            }
        },
        ForkResult::Parent { child } => Ok(child),
    }
}

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

/// The message at `index` of queue `msqid`, copied without receiving it
/// (`msgrcv(MSG_COPY | IPC_NOWAIT)`), as (mtype, text); `None` past the
/// end. `max_text` bounds the text (msgmax).
pub fn msg_copy(
    msqid: i32,
    index: usize,
    max_text: usize,
) -> std::io::Result<Option<(i64, Vec<u8>)>> {
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
    Ok(Some((mtype, buf[long..long + r as usize].to_vec())))
}

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
