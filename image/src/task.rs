//! Per-process state that is not memory or files: registers, signals,
//! credentials, limits and the mm fields the kernel keeps about the
//! address space.

/// Everything about one task that the restorer sets after memory and fds.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Core {
    /// PID (= TID of the only thread for now).
    #[prost(int32, tag = "1")]
    pub pid: i32,
    /// Command name (`/proc/PID/comm`).
    #[prost(string, tag = "2")]
    pub comm: String,
    /// Target of `/proc/PID/exe`.
    #[prost(string, tag = "3")]
    pub exe: String,
    /// Working directory.
    #[prost(string, tag = "4")]
    pub cwd: String,
    /// Root directory.
    #[prost(string, tag = "5")]
    pub root: String,
    /// File-creation mask.
    #[prost(uint32, tag = "6")]
    pub umask: u32,
    /// Execution domain (`personality(0xffffffff)`).
    #[prost(uint32, tag = "7")]
    pub personality: u32,
    /// User and group ids and capabilities.
    #[prost(message, optional, tag = "8")]
    pub creds: Option<Creds>,
    /// General-purpose registers.
    #[prost(message, optional, tag = "9")]
    pub regs: Option<GpRegs>,
    /// The full XSAVE area (x87, SSE, AVX, ... as enabled by XCR0), exactly
    /// as `PTRACE_GETREGSET NT_X86_XSTATE` returned it.
    #[prost(bytes = "vec", tag = "10")]
    pub xstate: Vec<u8>,
    /// Blocked signal mask (bit n-1 = signal n).
    #[prost(uint64, tag = "11")]
    pub sigmask: u64,
    /// Disposition of every signal that is not SIG_DFL with no flags.
    #[prost(message, repeated, tag = "12")]
    pub sigactions: Vec<SigAction>,
    /// Signals queued but not yet delivered.
    #[prost(message, repeated, tag = "13")]
    pub pending: Vec<PendingSignal>,
    /// Interval timers that were armed.
    #[prost(message, repeated, tag = "14")]
    pub itimers: Vec<ITimer>,
    /// Alternate signal stack.
    #[prost(message, optional, tag = "15")]
    pub altstack: Option<AltStack>,
    /// `set_tid_address` pointer (clear_child_tid).
    #[prost(uint64, tag = "16")]
    pub tid_address: u64,
    /// `set_robust_list` head and length.
    #[prost(message, optional, tag = "17")]
    pub robust_list: Option<RobustList>,
    /// Registered restartable sequence area, if any.
    #[prost(message, optional, tag = "18")]
    pub rseq: Option<Rseq>,
    /// Resource limits.
    #[prost(message, repeated, tag = "19")]
    pub rlimits: Vec<Rlimit>,
    /// Address-space layout fields (`prctl(PR_SET_MM_MAP)`).
    #[prost(message, optional, tag = "20")]
    pub mm: Option<MmFields>,
    /// Process group id.
    #[prost(int32, tag = "21")]
    pub pgid: i32,
    /// Session id.
    #[prost(int32, tag = "22")]
    pub sid: i32,
    /// The process's other threads, in creation order; the fields above are
    /// the thread-group leader's.
    #[prost(message, repeated, tag = "23")]
    pub threads: Vec<ThreadCore>,
}

/// Per-thread state of a thread other than the leader.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ThreadCore {
    /// Thread id.
    #[prost(int32, tag = "1")]
    pub tid: i32,
    /// Thread name (`/proc/PID/task/TID/comm`).
    #[prost(string, tag = "2")]
    pub comm: String,
    /// General-purpose registers (fs_base is the thread's TLS).
    #[prost(message, optional, tag = "3")]
    pub regs: Option<GpRegs>,
    /// The thread's XSAVE area.
    #[prost(bytes = "vec", tag = "4")]
    pub xstate: Vec<u8>,
    /// The thread's blocked signal mask.
    #[prost(uint64, tag = "5")]
    pub sigmask: u64,
    /// Signals queued to this thread only.
    #[prost(message, repeated, tag = "6")]
    pub pending: Vec<PendingSignal>,
    /// The thread's alternate signal stack.
    #[prost(message, optional, tag = "7")]
    pub altstack: Option<AltStack>,
    /// `set_tid_address` pointer (clear_child_tid, used by pthread_join).
    #[prost(uint64, tag = "8")]
    pub tid_address: u64,
    /// `set_robust_list` registration.
    #[prost(message, optional, tag = "9")]
    pub robust_list: Option<RobustList>,
    /// `rseq` registration.
    #[prost(message, optional, tag = "10")]
    pub rseq: Option<Rseq>,
}

/// Credentials at dump time.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Creds {
    /// Real, effective, saved and filesystem uid.
    #[prost(uint32, repeated, tag = "1")]
    pub uids: Vec<u32>,
    /// Real, effective, saved and filesystem gid.
    #[prost(uint32, repeated, tag = "2")]
    pub gids: Vec<u32>,
    /// Supplementary groups.
    #[prost(uint32, repeated, tag = "3")]
    pub groups: Vec<u32>,
    /// Effective capabilities.
    #[prost(uint64, tag = "4")]
    pub cap_eff: u64,
    /// Permitted capabilities.
    #[prost(uint64, tag = "5")]
    pub cap_prm: u64,
    /// Inheritable capabilities.
    #[prost(uint64, tag = "6")]
    pub cap_inh: u64,
    /// Bounding set.
    #[prost(uint64, tag = "7")]
    pub cap_bnd: u64,
    /// Ambient set.
    #[prost(uint64, tag = "8")]
    pub cap_amb: u64,
}

/// x86_64 `struct user_regs_struct`, field by field.
#[allow(missing_docs)]
#[derive(Clone, PartialEq, prost::Message)]
pub struct GpRegs {
    #[prost(uint64, tag = "1")]
    pub r15: u64,
    #[prost(uint64, tag = "2")]
    pub r14: u64,
    #[prost(uint64, tag = "3")]
    pub r13: u64,
    #[prost(uint64, tag = "4")]
    pub r12: u64,
    #[prost(uint64, tag = "5")]
    pub rbp: u64,
    #[prost(uint64, tag = "6")]
    pub rbx: u64,
    #[prost(uint64, tag = "7")]
    pub r11: u64,
    #[prost(uint64, tag = "8")]
    pub r10: u64,
    #[prost(uint64, tag = "9")]
    pub r9: u64,
    #[prost(uint64, tag = "10")]
    pub r8: u64,
    #[prost(uint64, tag = "11")]
    pub rax: u64,
    #[prost(uint64, tag = "12")]
    pub rcx: u64,
    #[prost(uint64, tag = "13")]
    pub rdx: u64,
    #[prost(uint64, tag = "14")]
    pub rsi: u64,
    #[prost(uint64, tag = "15")]
    pub rdi: u64,
    #[prost(uint64, tag = "16")]
    pub orig_rax: u64,
    #[prost(uint64, tag = "17")]
    pub rip: u64,
    #[prost(uint64, tag = "18")]
    pub cs: u64,
    #[prost(uint64, tag = "19")]
    pub eflags: u64,
    #[prost(uint64, tag = "20")]
    pub rsp: u64,
    #[prost(uint64, tag = "21")]
    pub ss: u64,
    #[prost(uint64, tag = "22")]
    pub fs_base: u64,
    #[prost(uint64, tag = "23")]
    pub gs_base: u64,
    #[prost(uint64, tag = "24")]
    pub ds: u64,
    #[prost(uint64, tag = "25")]
    pub es: u64,
    #[prost(uint64, tag = "26")]
    pub fs: u64,
    #[prost(uint64, tag = "27")]
    pub gs: u64,
}

/// One signal's disposition, in the kernel's `struct sigaction` layout.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SigAction {
    /// Signal number.
    #[prost(uint32, tag = "1")]
    pub signo: u32,
    /// Handler address, or 0 (SIG_DFL) / 1 (SIG_IGN).
    #[prost(uint64, tag = "2")]
    pub handler: u64,
    /// SA_* flags.
    #[prost(uint64, tag = "3")]
    pub flags: u64,
    /// SA_RESTORER trampoline.
    #[prost(uint64, tag = "4")]
    pub restorer: u64,
    /// Signals blocked while the handler runs.
    #[prost(uint64, tag = "5")]
    pub mask: u64,
}

/// A queued signal with its full siginfo.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PendingSignal {
    /// True when queued to the whole process, false for this thread only.
    #[prost(bool, tag = "1")]
    pub shared: bool,
    /// The 128-byte kernel `siginfo_t`.
    #[prost(bytes = "vec", tag = "2")]
    pub siginfo: Vec<u8>,
}

/// An armed interval timer (`setitimer`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ITimer {
    /// ITIMER_REAL (0), ITIMER_VIRTUAL (1) or ITIMER_PROF (2).
    #[prost(int32, tag = "1")]
    pub which: i32,
    /// Reload value in microseconds.
    #[prost(uint64, tag = "2")]
    pub interval_us: u64,
    /// Time to next expiry in microseconds.
    #[prost(uint64, tag = "3")]
    pub value_us: u64,
}

/// `sigaltstack` state.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AltStack {
    /// Base address.
    #[prost(uint64, tag = "1")]
    pub sp: u64,
    /// SS_* flags.
    #[prost(int32, tag = "2")]
    pub flags: i32,
    /// Size in bytes.
    #[prost(uint64, tag = "3")]
    pub size: u64,
}

/// `set_robust_list` registration.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RobustList {
    /// List head address.
    #[prost(uint64, tag = "1")]
    pub head: u64,
    /// Length of the head structure.
    #[prost(uint64, tag = "2")]
    pub len: u64,
}

/// `rseq` registration.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Rseq {
    /// Address of `struct rseq`.
    #[prost(uint64, tag = "1")]
    pub addr: u64,
    /// Registered length.
    #[prost(uint32, tag = "2")]
    pub len: u32,
    /// Abort signature.
    #[prost(uint32, tag = "3")]
    pub signature: u32,
}

/// One resource limit; `u64::MAX` means unlimited.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Rlimit {
    /// RLIMIT_* number.
    #[prost(uint32, tag = "1")]
    pub resource: u32,
    /// Soft limit.
    #[prost(uint64, tag = "2")]
    pub soft: u64,
    /// Hard limit.
    #[prost(uint64, tag = "3")]
    pub hard: u64,
}

/// The kernel's bookkeeping about the address space (`struct prctl_mm_map`).
#[allow(missing_docs)]
#[derive(Clone, PartialEq, prost::Message)]
pub struct MmFields {
    #[prost(uint64, tag = "1")]
    pub start_code: u64,
    #[prost(uint64, tag = "2")]
    pub end_code: u64,
    #[prost(uint64, tag = "3")]
    pub start_data: u64,
    #[prost(uint64, tag = "4")]
    pub end_data: u64,
    #[prost(uint64, tag = "5")]
    pub start_brk: u64,
    #[prost(uint64, tag = "6")]
    pub brk: u64,
    #[prost(uint64, tag = "7")]
    pub start_stack: u64,
    #[prost(uint64, tag = "8")]
    pub arg_start: u64,
    #[prost(uint64, tag = "9")]
    pub arg_end: u64,
    #[prost(uint64, tag = "10")]
    pub env_start: u64,
    #[prost(uint64, tag = "11")]
    pub env_end: u64,
    /// The saved auxiliary vector, raw (`/proc/PID/auxv`).
    #[prost(bytes = "vec", tag = "12")]
    pub auxv: Vec<u8>,
}
