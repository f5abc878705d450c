//! The raw ptrace requests nix does not wrap. All `unsafe` of this crate's
//! ptrace use lives here.

use nix::errno::Errno;
use nix::unistd::Pid;

/// `NT_X86_XSTATE` regset.
const NT_X86_XSTATE: libc::c_int = 0x202;
/// `PTRACE_GETSIGMASK` / `PTRACE_SETSIGMASK`.
const PTRACE_GETSIGMASK: libc::c_uint = 0x420a;
const PTRACE_SETSIGMASK: libc::c_uint = 0x420b;
/// `PTRACE_PEEKSIGINFO` and its "shared queue" flag.
const PTRACE_PEEKSIGINFO: libc::c_uint = 0x4209;
const PTRACE_PEEKSIGINFO_SHARED: u32 = 1;
/// `PTRACE_GET_RSEQ_CONFIGURATION` (5.13+).
const PTRACE_GET_RSEQ_CONFIGURATION: libc::c_uint = 0x420f;

/// Size of a kernel `siginfo_t`.
pub const SIGINFO_SIZE: usize = 128;

/// Size of the XSAVE area for the features the OS enabled (CPUID 0xD.0 EBX).
pub fn xsave_size() -> usize {
    // CPUID is available on every x86_64 CPU; leaf 0xD exists wherever the
    // kernel enabled XSAVE, which NT_X86_XSTATE needs anyway.
    let r = std::arch::x86_64::__cpuid_count(0xd, 0);
    (r.ebx as usize).max(512 + 64)
}

/// CPU vendor string (CPUID 0).
pub fn cpu_vendor() -> String {
    let r = std::arch::x86_64::__cpuid(0);
    let mut v = Vec::with_capacity(12);
    for w in [r.ebx, r.edx, r.ecx] {
        v.extend_from_slice(&w.to_le_bytes());
    }
    String::from_utf8_lossy(&v).into_owned()
}

fn check(ret: libc::c_long) -> Result<libc::c_long, Errno> {
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

/// Reads the full XSAVE area of a stopped tracee.
pub fn get_xstate(pid: Pid) -> Result<Vec<u8>, Errno> {
    let mut buf = vec![0u8; xsave_size()];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: iov describes `buf`, which outlives the call; the kernel writes
    // at most iov_len bytes and updates iov_len.
    check(unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGSET,
            pid.as_raw(),
            NT_X86_XSTATE as usize,
            &mut iov as *mut libc::iovec,
        )
    })?;
    buf.truncate(iov.iov_len);
    Ok(buf)
}

/// Writes the full XSAVE area of a stopped tracee.
pub fn set_xstate(pid: Pid, xstate: &[u8]) -> Result<(), Errno> {
    let mut iov = libc::iovec {
        iov_base: xstate.as_ptr() as *mut libc::c_void,
        iov_len: xstate.len(),
    };
    // SAFETY: iov describes `xstate`, which the kernel only reads.
    check(unsafe {
        libc::ptrace(
            libc::PTRACE_SETREGSET,
            pid.as_raw(),
            NT_X86_XSTATE as usize,
            &mut iov as *mut libc::iovec,
        )
    })?;
    Ok(())
}

/// Reads the blocked signal mask of a stopped tracee.
pub fn get_sigmask(pid: Pid) -> Result<u64, Errno> {
    let mut mask = 0u64;
    // SAFETY: the kernel writes 8 bytes (the size argument) into `mask`.
    check(unsafe {
        libc::ptrace(
            PTRACE_GETSIGMASK,
            pid.as_raw(),
            std::mem::size_of::<u64>(),
            &mut mask as *mut u64,
        )
    })?;
    Ok(mask)
}

/// Sets the blocked signal mask of a stopped tracee.
pub fn set_sigmask(pid: Pid, mask: u64) -> Result<(), Errno> {
    // SAFETY: the kernel reads 8 bytes from `mask`.
    check(unsafe {
        libc::ptrace(
            PTRACE_SETSIGMASK,
            pid.as_raw(),
            std::mem::size_of::<u64>(),
            &mask as *const u64,
        )
    })?;
    Ok(())
}

#[repr(C)]
struct PeekSiginfoArgs {
    off: u64,
    flags: u32,
    nr: i32,
}

/// Returns every queued signal (per-thread queue, or the shared one) without
/// dequeuing it.
pub fn peek_siginfo(pid: Pid, shared: bool) -> Result<Vec<[u8; SIGINFO_SIZE]>, Errno> {
    let mut out = Vec::new();
    loop {
        let args = PeekSiginfoArgs {
            off: out.len() as u64,
            flags: if shared { PTRACE_PEEKSIGINFO_SHARED } else { 0 },
            nr: 1,
        };
        let mut info = [0u8; SIGINFO_SIZE];
        // SAFETY: `args` is the kernel's struct ptrace_peeksiginfo_args and
        // `info` has room for nr=1 siginfo.
        let n = check(unsafe {
            libc::ptrace(
                PTRACE_PEEKSIGINFO,
                pid.as_raw(),
                &args as *const PeekSiginfoArgs,
                info.as_mut_ptr(),
            )
        })?;
        if n == 0 {
            return Ok(out);
        }
        out.push(info);
    }
}

/// The kernel's `struct ptrace_rseq_configuration`.
#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct RseqConfig {
    /// Address of the registered `struct rseq` (0 if none).
    pub rseq_abi_pointer: u64,
    /// Registered length.
    pub rseq_abi_size: u32,
    /// Abort signature.
    pub signature: u32,
    /// RSEQ flags.
    pub flags: u32,
    /// Padding.
    pub pad: u32,
}

/// Reads the rseq registration of a stopped tracee.
pub fn rseq_config(pid: Pid) -> Result<RseqConfig, Errno> {
    let mut conf = RseqConfig::default();
    // SAFETY: the kernel writes at most `size` bytes into `conf`.
    check(unsafe {
        libc::ptrace(
            PTRACE_GET_RSEQ_CONFIGURATION,
            pid.as_raw(),
            std::mem::size_of::<RseqConfig>(),
            &mut conf as *mut RseqConfig,
        )
    })?;
    Ok(conf)
}

/// `get_robust_list(pid)`: (head, len).
pub fn get_robust_list(pid: Pid) -> Result<(u64, u64), Errno> {
    let mut head: u64 = 0;
    let mut len: libc::size_t = 0;
    // SAFETY: the kernel writes one pointer and one size_t into our locals.
    check(unsafe {
        libc::syscall(
            libc::SYS_get_robust_list,
            pid.as_raw(),
            &mut head as *mut u64,
            &mut len as *mut libc::size_t,
        )
    })?;
    Ok((head, len as u64))
}

/// XCR0: the XSAVE features the OS enabled on this CPU.
pub fn xcr0() -> u64 {
    let osxsave = std::arch::x86_64::__cpuid(1).ecx & (1 << 27) != 0;
    if !osxsave {
        return 0;
    }
    let (lo, hi): (u32, u32);
    // SAFETY: xgetbv with ecx=0 is defined whenever CPUID.1:ECX.OSXSAVE is
    // set (checked above); it only reads XCR0 into edx:eax.
    unsafe {
        std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi, options(nomem, nostack));
    }
    (u64::from(hi) << 32) | u64::from(lo)
}

/// `PTRACE_GET_SYSCALL_INFO` (5.3+).
const PTRACE_GET_SYSCALL_INFO: libc::c_uint = 0x420e;

/// Which side of a syscall a PTRACE_SYSCALL stop is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyscallStop {
    /// Not a syscall stop.
    None,
    /// Syscall entry.
    Entry,
    /// Syscall exit.
    Exit,
    /// Seccomp stop.
    Seccomp,
}

/// What `PTRACE_GET_SYSCALL_INFO` says of a syscall stop.
pub struct SyscallInfo {
    /// Entry, exit or seccomp stop.
    pub stop: SyscallStop,
    /// Where the task is (after the `syscall` instruction).
    pub ip: u64,
    /// At entry, the syscall number; at exit, the return value.
    pub value: i64,
}

/// The syscall stop the task is in, with its place and number or result:
/// one call where registers would take another.
pub fn syscall_info(pid: Pid) -> Result<SyscallInfo, Errno> {
    // struct ptrace_syscall_info: u8 op, u8 pad[3], u32 arch,
    // u64 instruction_pointer, u64 stack_pointer, then the union whose
    // first word is `entry.nr` or `exit.rval`.
    let mut info = [0u64; 11];
    // SAFETY: the kernel writes at most `size` bytes into `info`.
    check(unsafe {
        libc::ptrace(
            PTRACE_GET_SYSCALL_INFO,
            pid.as_raw(),
            std::mem::size_of_val(&info),
            info.as_mut_ptr(),
        )
    })?;
    Ok(SyscallInfo {
        stop: match info[0] & 0xff {
            1 => SyscallStop::Entry,
            2 => SyscallStop::Exit,
            3 => SyscallStop::Seccomp,
            _ => SyscallStop::None,
        },
        ip: info[1],
        value: info[3] as i64,
    })
}

/// `pidfd_open(pid)` + `pidfd_getfd(fd)`: ckpt's own copy of fd `fd` of
/// `pid`.
pub fn take_fd(pid: i32, fd: i32) -> Result<std::os::fd::OwnedFd, Errno> {
    use std::os::fd::FromRawFd;
    // SAFETY: integer arguments only.
    let pidfd = check(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: pidfd_open returned a new fd that nothing else owns.
    let pidfd = unsafe { std::os::fd::OwnedFd::from_raw_fd(pidfd as i32) };
    use std::os::fd::AsRawFd;
    // SAFETY: integer arguments only.
    let got = check(unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) })?;
    // SAFETY: pidfd_getfd returned a new fd that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(got as i32) })
}

/// Sends `fd` over the datagram socket `sock` (one byte of payload).
pub fn send_fd(
    sock: std::os::fd::BorrowedFd<'_>,
    fd: std::os::fd::BorrowedFd<'_>,
) -> Result<(), Errno> {
    use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
    use std::os::fd::AsRawFd;
    let byte = [0u8; 1];
    let iov = [std::io::IoSlice::new(&byte)];
    let fds = [fd.as_raw_fd()];
    sendmsg::<()>(
        sock.as_raw_fd(),
        &iov,
        &[ControlMessage::ScmRights(&fds)],
        MsgFlags::empty(),
        None,
    )
    .map(|_| ())
}

/// `USERFAULTFD_IOC_NEW` on `/dev/userfaultfd`: `_IO(0xAA, 0)`.
pub const USERFAULTFD_IOC_NEW: u64 = 0xaa00;
/// `userfaultfd(2)` flag: only faults taken in user mode.
#[cfg(test)]
pub const UFFD_USER_MODE_ONLY: libc::c_int = 1;
/// `UFFD_API`.
const UFFD_API: u64 = 0xaa;
/// `UFFDIO_REGISTER_MODE_*`.
pub const UFFDIO_REGISTER_MODE_MISSING: u64 = 1;
pub const UFFDIO_REGISTER_MODE_WP: u64 = 2;
/// `UFFDIO_WRITEPROTECT_MODE_WP`.
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1;
/// Size of `struct uffd_msg`.
pub const UFFD_MSG_LEN: usize = 32;
/// `UFFD_EVENT_*`.
pub const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
pub const UFFD_EVENT_FORK: u8 = 0x13;
pub const UFFD_EVENT_REMAP: u8 = 0x14;
pub const UFFD_EVENT_REMOVE: u8 = 0x15;
pub const UFFD_EVENT_UNMAP: u8 = 0x16;
/// `UFFD_PAGEFAULT_FLAG_*`.
pub const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
pub const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;

/// `struct uffdio_api`.
#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

/// `struct uffdio_range`.
#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

/// `struct uffdio_register`.
#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// `struct uffdio_writeprotect`.
#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

/// `struct uffdio_zeropage`.
#[repr(C)]
struct UffdioZeropage {
    range: UffdioRange,
    mode: u64,
    zeropage: i64,
}

/// `struct uffdio_copy`.
#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

nix::ioctl_readwrite!(uffdio_api_ioctl, 0xaa, 0x3f, UffdioApi);
nix::ioctl_readwrite!(uffdio_register_ioctl, 0xaa, 0x00, UffdioRegister);
nix::ioctl_read!(uffdio_unregister_ioctl, 0xaa, 0x01, UffdioRange);
nix::ioctl_read!(uffdio_wake_ioctl, 0xaa, 0x02, UffdioRange);
nix::ioctl_readwrite!(uffdio_copy_ioctl, 0xaa, 0x03, UffdioCopy);
nix::ioctl_readwrite!(uffdio_zeropage_ioctl, 0xaa, 0x04, UffdioZeropage);
nix::ioctl_readwrite!(uffdio_writeprotect_ioctl, 0xaa, 0x06, UffdioWriteprotect);

/// `UFFDIO_API` asking for `features`.
pub fn uffd_api(fd: std::os::fd::BorrowedFd<'_>, features: u64) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    let mut a = UffdioApi {
        api: UFFD_API,
        features,
        ioctls: 0,
    };
    // SAFETY: the kernel reads and writes exactly this live struct.
    unsafe { uffdio_api_ioctl(fd.as_raw_fd(), &mut a) }.map(|_| ())
}

/// `UFFDIO_REGISTER`.
pub fn uffd_register(
    fd: std::os::fd::BorrowedFd<'_>,
    start: u64,
    len: u64,
    mode: u64,
) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    let mut r = UffdioRegister {
        range: UffdioRange { start, len },
        mode,
        ioctls: 0,
    };
    // SAFETY: the kernel reads and writes exactly this live struct; the
    // range is the other process's memory, never dereferenced here.
    unsafe { uffdio_register_ioctl(fd.as_raw_fd(), &mut r) }.map(|_| ())
}

/// `UFFDIO_UNREGISTER`.
pub fn uffd_unregister(fd: std::os::fd::BorrowedFd<'_>, start: u64, len: u64) -> Result<(), Errno> {
    range_ioctl(fd, start, len, uffdio_unregister_ioctl)
}

/// `UFFDIO_WAKE`.
pub fn uffd_wake(fd: std::os::fd::BorrowedFd<'_>, start: u64, len: u64) -> Result<(), Errno> {
    range_ioctl(fd, start, len, uffdio_wake_ioctl)
}

/// A userfaultfd ioctl whose argument is one `struct uffdio_range`.
fn range_ioctl(
    fd: std::os::fd::BorrowedFd<'_>,
    start: u64,
    len: u64,
    ioctl: unsafe fn(libc::c_int, *mut UffdioRange) -> nix::Result<libc::c_int>,
) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    let mut r = UffdioRange { start, len };
    // SAFETY: the kernel reads exactly this live struct.
    unsafe { ioctl(fd.as_raw_fd(), &mut r) }.map(|_| ())
}

/// `UFFDIO_WRITEPROTECT`, setting or clearing (and waking).
pub fn uffd_writeprotect(
    fd: std::os::fd::BorrowedFd<'_>,
    start: u64,
    len: u64,
    protect: bool,
) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    let mut w = UffdioWriteprotect {
        range: UffdioRange { start, len },
        mode: if protect {
            UFFDIO_WRITEPROTECT_MODE_WP
        } else {
            0
        },
    };
    // SAFETY: the kernel reads and writes exactly this live struct.
    unsafe { uffdio_writeprotect_ioctl(fd.as_raw_fd(), &mut w) }.map(|_| ())
}

/// What one `UFFDIO_COPY` or `UFFDIO_ZEROPAGE` call did: the kernel stops
/// at the first page it cannot fill and says how far it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillStep {
    /// Bytes filled from the start of the range.
    pub filled: u64,
    /// Why it stopped short (`None`: the whole range is filled).
    pub stopped: Option<Errno>,
}

/// Reads the outcome of one fill ioctl: `ret` its result, `progress` the
/// struct's `copy`/`zeropage` field (bytes done, or a negative errno).
fn fill_step(ret: Result<libc::c_int, Errno>, progress: i64, len: u64) -> FillStep {
    match ret {
        Ok(_) => FillStep {
            filled: len,
            stopped: None,
        },
        // A partial fill reports its length and EAGAIN; the page after it
        // is the one that stopped it, and the next call says why.
        Err(Errno::EAGAIN) if progress > 0 => FillStep {
            filled: (progress as u64).min(len),
            stopped: Some(Errno::EAGAIN),
        },
        Err(e) => FillStep {
            filled: 0,
            stopped: Some(e),
        },
    }
}

/// One `UFFDIO_COPY` of `data` to `dst` (waking the threads waiting there),
/// reporting how far it got instead of retrying.
pub fn uffd_copy_step(fd: std::os::fd::BorrowedFd<'_>, dst: u64, data: &[u8]) -> FillStep {
    use std::os::fd::AsRawFd;
    let mut c = UffdioCopy {
        dst,
        src: data.as_ptr() as u64,
        len: data.len() as u64,
        mode: 0,
        copy: 0,
    };
    // SAFETY: the kernel reads `len` bytes from `src`, which lie inside the
    // live slice `data`, and writes only into the other process.
    let ret = unsafe { uffdio_copy_ioctl(fd.as_raw_fd(), &mut c) };
    fill_step(ret, c.copy, data.len() as u64)
}

/// One `UFFDIO_ZEROPAGE` of `[start, start+len)` (waking).
pub fn uffd_zeropage_step(fd: std::os::fd::BorrowedFd<'_>, start: u64, len: u64) -> FillStep {
    use std::os::fd::AsRawFd;
    let mut z = UffdioZeropage {
        range: UffdioRange { start, len },
        mode: 0,
        zeropage: 0,
    };
    // SAFETY: the kernel reads and writes exactly this live struct; the
    // range is the other process's memory, never dereferenced here.
    let ret = unsafe { uffdio_zeropage_ioctl(fd.as_raw_fd(), &mut z) };
    fill_step(ret, z.zeropage, len)
}

/// Reads whole `struct uffd_msg`s; returns how many.
pub fn read_msgs(
    fd: std::os::fd::BorrowedFd<'_>,
    buf: &mut [[u8; UFFD_MSG_LEN]],
) -> Result<usize, Errno> {
    let bytes = buf.as_flattened_mut();
    let n = nix::unistd::read(fd, bytes)?;
    Ok(n / UFFD_MSG_LEN)
}

/// Whether `fd` becomes readable within `timeout_ms`.
pub fn poll_in(fd: std::os::fd::BorrowedFd<'_>, timeout_ms: i32) -> Result<bool, Errno> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    let timeout = PollTimeout::try_from(timeout_ms).unwrap_or(PollTimeout::MAX);
    match poll(&mut fds, timeout) {
        Ok(n) => Ok(n > 0),
        Err(Errno::EINTR) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `PTRACE_SECCOMP_GET_FILTER`: copy a classic BPF filter of the tracee.
const PTRACE_SECCOMP_GET_FILTER: libc::c_uint = 0x420c;
/// `PTRACE_SECCOMP_GET_METADATA`: the flags a filter was installed with.
const PTRACE_SECCOMP_GET_METADATA: libc::c_uint = 0x420d;
/// Size of one classic BPF instruction (`struct sock_filter`).
pub const SOCK_FILTER_SIZE: usize = 8;

/// Sets the ptrace options of a stopped tracee (raw, for the options nix
/// does not name, such as `PTRACE_O_SUSPEND_SECCOMP`).
pub fn set_options(pid: Pid, options: libc::c_int) -> Result<(), Errno> {
    // SAFETY: PTRACE_SETOPTIONS takes the options in `data` and no memory.
    check(unsafe {
        libc::ptrace(
            libc::PTRACE_SETOPTIONS,
            pid.as_raw(),
            0usize,
            options as usize,
        )
    })?;
    Ok(())
}

/// The tracee's seccomp filter `index` (0 is the oldest: the kernel's
/// `get_nth_filter` counts from there, unlike what ptrace(2) says)
/// as raw `struct sock_filter` instructions, or `None` past the oldest.
/// At most `max_insns` instructions are accepted.
pub fn seccomp_filter(pid: Pid, index: u64, max_insns: usize) -> Result<Option<Vec<u8>>, Errno> {
    // SAFETY: with a null buffer the kernel only returns the length.
    let len = match check(unsafe {
        libc::ptrace(
            PTRACE_SECCOMP_GET_FILTER,
            pid.as_raw(),
            index as usize,
            std::ptr::null_mut::<libc::c_void>(),
        )
    }) {
        Ok(n) => n as usize,
        Err(Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    if len > max_insns {
        return Err(Errno::E2BIG);
    }
    let mut buf = vec![0u8; len * SOCK_FILTER_SIZE];
    // SAFETY: `buf` holds `len` instructions, the filter's length just
    // read; filters are immutable once attached, so it cannot grow.
    let got = check(unsafe {
        libc::ptrace(
            PTRACE_SECCOMP_GET_FILTER,
            pid.as_raw(),
            index as usize,
            buf.as_mut_ptr().cast::<libc::c_void>(),
        )
    })? as usize;
    buf.truncate(got.min(len) * SOCK_FILTER_SIZE);
    Ok(Some(buf))
}

/// The kernel's `struct seccomp_metadata`.
#[repr(C)]
struct SeccompMetadata {
    filter_off: u64,
    flags: u64,
}

/// The `SECCOMP_FILTER_FLAG_*` flags the kernel reports for filter `index`
/// (only those it keeps: `SECCOMP_FILTER_FLAG_LOG`).
pub fn seccomp_filter_flags(pid: Pid, index: u64) -> Result<u64, Errno> {
    let mut md = SeccompMetadata {
        filter_off: index,
        flags: 0,
    };
    // SAFETY: the kernel reads `filter_off` and writes at most the size
    // given (the whole struct) into `md`.
    check(unsafe {
        libc::ptrace(
            PTRACE_SECCOMP_GET_METADATA,
            pid.as_raw(),
            std::mem::size_of::<SeccompMetadata>(),
            &mut md as *mut SeccompMetadata,
        )
    })?;
    Ok(md.flags)
}

/// What `waitpid(__WALL)` reported for a traced task.
#[derive(Debug)]
pub enum Waited {
    /// Everything nix can describe.
    Status(nix::sys::wait::WaitStatus),
    /// A signal-delivery stop of a real-time signal (its number), which
    /// nix's `Signal` cannot hold: `WaitStatus::from_raw` fails on it, and
    /// the stop would be lost.
    RtSignalStop(i32),
}

/// `waitpid(pid, __WALL)`, for stops nix cannot describe too; with
/// `WNOHANG` when `nohang`: `None` while the task has nothing to report.
pub fn wait_traced_opt(pid: Pid, nohang: bool) -> Result<Option<Waited>, Errno> {
    let mut status: libc::c_int = 0;
    let flags = libc::__WALL | if nohang { libc::WNOHANG } else { 0 };
    // SAFETY: waitpid writes one int into `status`, which lives for the call.
    let r = unsafe { libc::waitpid(pid.as_raw(), &mut status, flags) };
    if r < 0 {
        return Err(Errno::last());
    }
    if r == 0 {
        return Ok(None);
    }
    let signal_stop = libc::WIFSTOPPED(status)
        && status >> 16 == 0
        && libc::WSTOPSIG(status) != (libc::SIGTRAP | 0x80);
    if signal_stop && nix::sys::signal::Signal::try_from(libc::WSTOPSIG(status)).is_err() {
        return Ok(Some(Waited::RtSignalStop(libc::WSTOPSIG(status))));
    }
    nix::sys::wait::WaitStatus::from_raw(Pid::from_raw(r), status).map(|s| Some(Waited::Status(s)))
}

/// `tgkill(tgid, tid, sig)`: a signal to one thread.
pub fn tgkill(tgid: i32, tid: i32, sig: i32) -> Result<(), Errno> {
    // SAFETY: integers only.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, tgid, tid, sig) };
    if r < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// `PTRACE_CONT`, delivering signal number `sig` (0: none), real-time
/// signals included.
pub fn cont_with(pid: Pid, sig: i32) -> Result<(), Errno> {
    // SAFETY: integer arguments only; the data argument carries the signal.
    let r = unsafe {
        libc::ptrace(
            libc::PTRACE_CONT,
            pid.as_raw(),
            std::ptr::null_mut::<libc::c_void>(),
            sig as libc::c_long as *mut libc::c_void,
        )
    };
    check(r).map(drop)
}
