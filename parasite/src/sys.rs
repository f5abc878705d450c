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

/// Tells a syscall-entry stop from a syscall-exit stop.
pub fn syscall_stop(pid: Pid) -> Result<SyscallStop, Errno> {
    // struct ptrace_syscall_info starts with `__u8 op`; the rest is not needed.
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
    Ok(match info[0] & 0xff {
        1 => SyscallStop::Entry,
        2 => SyscallStop::Exit,
        3 => SyscallStop::Seccomp,
        _ => SyscallStop::None,
    })
}
