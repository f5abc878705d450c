//! Command ABI shared by the host (dumper) and the freestanding parasite blob.
//!
//! This file is compiled three times: into the host library (`ckpt_parasite::proto`), into
//! the `no_std` blob (`#[path = "../src/proto.rs"] mod proto;` in `parasite/blob/main.rs`) and
//! into `parasite/build.rs` (to cross-check the blob's argument block size). It must therefore
//! only use `core`, and every type here is `#[repr(C)]` plain old data made of fixed-size
//! integers: no pointers (remote addresses are `u64`), no `bool`, no enums with data, and
//! explicit padding fields. The sizes are pinned by compile-time asserts at the bottom.
//!
//! Protocol: the host writes an [`Args`] block (with [`ARGS_MAGIC`] and a command number) at
//! the blob's args offset, runs the blob's entry point, waits for the `SIGTRAP` raised by the
//! blob's final `int3`, then reads the block back. [`Args::ret`] is `0` on success or a
//! negative errno (`-EINVAL` for a bad magic or an unknown command).

/// No-op command: the blob only validates the magic and sets `ret = 0` (useful as a ping).
pub const CMD_NONE: u32 = 0;
/// Collect per-process "misc" state into [`Args::misc`] (see [`MiscState`]).
pub const CMD_DUMP_MISC: u32 = 1;
/// Run by another thread of the infected process: its own state only it can ask for, into
/// [`Args::thread`] (see [`ThreadQuery`]).
pub const CMD_THREAD_QUERY: u32 = 2;
/// First command number available to users of the parasite; core commands stay below it.
pub const CMD_USER_FIRST: u32 = 64;

/// Value the host must store in [`Args::magic`]; the blob refuses to run without it.
pub const ARGS_MAGIC: u64 = 0x434b_5054_5041_5253; // "CKPTPARS"

/// Number of signals covered by [`MiscState::sigactions`] (signals `1..=64`).
pub const NSIG: usize = 64;

/// Number of interval timers in [`MiscState::itimers`] (`ITIMER_REAL`, `ITIMER_VIRTUAL`,
/// `ITIMER_PROF`, in that order).
pub const NITIMERS: usize = 3;

/// The x86_64 kernel `struct sigaction` as used by the raw `rt_sigaction` syscall with
/// `sigsetsize == 8` (this is *not* glibc's `struct sigaction`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSigaction {
    /// `sa_handler` / `sa_sigaction` (`SIG_DFL` = 0, `SIG_IGN` = 1, else a code address).
    pub handler: u64,
    /// `sa_flags` (`SA_RESTART`, `SA_SIGINFO`, `SA_RESTORER`, ...).
    pub flags: u64,
    /// `sa_restorer` (meaningful when `SA_RESTORER` is set).
    pub restorer: u64,
    /// `sa_mask`, one bit per signal: bit `n - 1` is signal `n`.
    pub mask: u64,
}

impl KernelSigaction {
    /// All-zero value (`SIG_DFL`, no flags, empty mask).
    pub const fn zeroed() -> Self {
        Self {
            handler: 0,
            flags: 0,
            restorer: 0,
            mask: 0,
        }
    }
}

/// The kernel's `struct __kernel_old_timeval` (x86_64).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeval {
    /// Seconds.
    pub sec: i64,
    /// Microseconds.
    pub usec: i64,
}

impl Timeval {
    /// Zero time.
    pub const fn zeroed() -> Self {
        Self { sec: 0, usec: 0 }
    }
}

/// The kernel's `struct __kernel_old_itimerval` as filled by `getitimer`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ITimerval {
    /// Reload value (`it_interval`).
    pub interval: Timeval,
    /// Time left until the next expiry (`it_value`); zero means disarmed.
    pub value: Timeval,
}

impl ITimerval {
    /// Disarmed timer.
    pub const fn zeroed() -> Self {
        Self {
            interval: Timeval::zeroed(),
            value: Timeval::zeroed(),
        }
    }
}

/// The kernel's `stack_t` on x86_64 (as used by `sigaltstack`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackT {
    /// `ss_sp`: base address of the alternate stack.
    pub sp: u64,
    /// `ss_flags` (`SS_ONSTACK` = 1, `SS_DISABLE` = 2, `SS_AUTODISARM` = 1 << 31).
    pub flags: i32,
    /// Explicit padding (the C struct has 4 implicit padding bytes here).
    pub _pad: i32,
    /// `ss_size`: size of the alternate stack in bytes.
    pub size: u64,
}

impl StackT {
    /// All-zero value.
    pub const fn zeroed() -> Self {
        Self {
            sp: 0,
            flags: 0,
            _pad: 0,
            size: 0,
        }
    }
}

/// Result of [`CMD_DUMP_MISC`]. Each `*_ret` field holds the raw syscall return value
/// (`0` or a negative errno) of the call that filled the field(s) next to it; on failure the
/// data field keeps whatever the host wrote there.
///
/// With a `stop_signal`, the command runs without syscall stops and ends the way a
/// [`ThreadQuery`] does (see there): one stop instead of two for each of its seventy syscalls.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MiscState {
    /// `rt_sigaction(sig, NULL, &old, 8)` for every signal; index = `signo - 1`. SIGKILL and
    /// SIGSTOP are queried as well (they report `SIG_DFL`).
    pub sigactions: [KernelSigaction; NSIG],
    /// Return value of each `rt_sigaction` call; index = `signo - 1`.
    pub sigaction_ret: [i64; NSIG],
    /// `getitimer` for `ITIMER_REAL`, `ITIMER_VIRTUAL`, `ITIMER_PROF` (indices 0, 1, 2).
    pub itimers: [ITimerval; NITIMERS],
    /// Return value of each `getitimer` call.
    pub itimer_ret: [i64; NITIMERS],
    /// `sigaltstack(NULL, &old)` of the thread that ran the blob.
    pub altstack: StackT,
    /// Return value of `sigaltstack`.
    pub altstack_ret: i64,
    /// `prctl(PR_GET_TID_ADDRESS)` of the thread that ran the blob (its `clear_child_tid`).
    pub tid_address: u64,
    /// Return value of `prctl(PR_GET_TID_ADDRESS)`.
    pub tid_address_ret: i64,
    /// Current program break, from `brk(0)` (the syscall cannot fail in this form).
    pub brk: u64,
    /// Input: the signal the blob ends by sending itself (0: none, the host stops the task
    /// at the "done" marker).
    pub stop_signal: u32,
    /// Set to 1 by the blob once every field above is filled.
    pub done: u32,
    /// The process-wide getters, each its raw return value: `prctl(PR_GET_SECUREBITS)`,
    /// `PR_GET_DUMPABLE`, `PR_GET_THP_DISABLE`, `PR_GET_MDWE` (EINVAL before 6.3),
    /// `PR_GET_TIMERSLACK` and `membarrier(MEMBARRIER_CMD_GET_REGISTRATIONS)` (EINVAL before
    /// 6.3).
    pub getters: Getters,
}

/// What [`CMD_DUMP_MISC`] asks the kernel beyond the task state: answers with no /proc file,
/// asked in the same run instead of one remote syscall (two stops) each.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Getters {
    /// `prctl(PR_GET_SECUREBITS)`.
    pub securebits_ret: i64,
    /// `prctl(PR_GET_PDEATHSIG, &pdeath_sig)`'s return value.
    pub pdeath_sig_ret: i64,
    /// The parent-death signal it wrote.
    pub pdeath_sig: u32,
    /// The child-subreaper flag `prctl(PR_GET_CHILD_SUBREAPER, &child_subreaper)` wrote.
    pub child_subreaper: u32,
    /// `prctl(PR_GET_CHILD_SUBREAPER)`'s return value.
    pub child_subreaper_ret: i64,
    /// `prctl(PR_GET_DUMPABLE)`.
    pub dumpable_ret: i64,
    /// `prctl(PR_GET_THP_DISABLE)`.
    pub thp_disable_ret: i64,
    /// `prctl(PR_GET_MDWE)`.
    pub mdwe_ret: i64,
    /// `prctl(PR_GET_TIMERSLACK)`.
    pub timer_slack_ret: i64,
    /// `membarrier(MEMBARRIER_CMD_GET_REGISTRATIONS, 0, 0)`.
    pub membarrier_ret: i64,
}

impl Getters {
    /// All-zero value.
    pub const fn zeroed() -> Self {
        Self {
            securebits_ret: 0,
            pdeath_sig_ret: 0,
            pdeath_sig: 0,
            child_subreaper: 0,
            child_subreaper_ret: 0,
            dumpable_ret: 0,
            thp_disable_ret: 0,
            mdwe_ret: 0,
            timer_slack_ret: 0,
            membarrier_ret: 0,
        }
    }
}

impl MiscState {
    /// All-zero value.
    pub const fn zeroed() -> Self {
        Self {
            sigactions: [KernelSigaction::zeroed(); NSIG],
            sigaction_ret: [0; NSIG],
            itimers: [ITimerval::zeroed(); NITIMERS],
            itimer_ret: [0; NITIMERS],
            altstack: StackT::zeroed(),
            altstack_ret: 0,
            tid_address: 0,
            tid_address_ret: 0,
            brk: 0,
            stop_signal: 0,
            done: 0,
            getters: Getters::zeroed(),
        }
    }
}

/// Input and result of [`CMD_THREAD_QUERY`]. Each `*_ret` field holds the raw syscall return
/// value (`0`, a value, or a negative errno) of the call that filled the field next to it.
///
/// The thread runs the command without syscall stops (`PTRACE_CONT`) and ends it by sending
/// itself `stop_signal`, unblocked for the purpose: a signal whose action in this process is to
/// be ignored, so that its tracer stops it there, while a thread whose dumper died (no tracer)
/// has it dropped by the kernel and goes on to the rescue path. The alternate stack found is
/// also written into the rescue frame (`frame_stack`), which must give it back.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadQuery {
    /// Input: the signal to end with (0: none, the command returns to the marker).
    pub stop_signal: u32,
    /// Explicit padding; write 0.
    pub _pad: u32,
    /// Input: address of the rescue frame's `uc_stack` (0: none).
    pub frame_stack: u64,
    /// `sigaltstack(NULL, &old)`.
    pub altstack: StackT,
    /// Return value of `sigaltstack`.
    pub altstack_ret: i64,
    /// `prctl(PR_GET_TID_ADDRESS)`: the thread's `clear_child_tid`.
    pub tid_address: u64,
    /// Return value of `prctl(PR_GET_TID_ADDRESS)`.
    pub tid_address_ret: i64,
    /// Return value of `prctl(PR_GET_TIMERSLACK)` (the slack itself).
    pub timer_slack_ret: i64,
    /// `prctl(PR_GET_PDEATHSIG)`.
    pub pdeath_sig: i32,
    /// Explicit padding.
    pub _pad2: i32,
    /// Return value of `prctl(PR_GET_PDEATHSIG)`.
    pub pdeath_sig_ret: i64,
    /// Return value of `prctl(PR_GET_SECUREBITS)` (the bits themselves).
    pub securebits_ret: i64,
    /// Set to 1 by the blob once every field above is filled.
    pub done: u64,
}

impl ThreadQuery {
    /// All-zero value.
    pub const fn zeroed() -> Self {
        Self {
            stop_signal: 0,
            _pad: 0,
            frame_stack: 0,
            altstack: StackT::zeroed(),
            altstack_ret: 0,
            tid_address: 0,
            tid_address_ret: 0,
            timer_slack_ret: 0,
            pdeath_sig: 0,
            _pad2: 0,
            pdeath_sig_ret: 0,
            securebits_ret: 0,
            done: 0,
        }
    }
}

/// The argument block exchanged with the blob, located at the blob's args offset
/// (`__parasite_args`, 64-byte aligned inside the blob's `.data`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Args {
    /// Must be [`ARGS_MAGIC`].
    pub magic: u64,
    /// Command number (`CMD_*`).
    pub cmd: u32,
    /// Explicit padding; write 0.
    pub _pad: u32,
    /// Written by the blob: `0` on success, negative errno on failure.
    pub ret: i64,
    /// Output of [`CMD_DUMP_MISC`].
    pub misc: MiscState,
    /// Input and output of [`CMD_THREAD_QUERY`].
    pub thread: ThreadQuery,
}

impl Args {
    /// All-zero block (note: `magic` is 0, so it must be set before running the blob).
    pub const fn zeroed() -> Self {
        Self {
            magic: 0,
            cmd: CMD_NONE,
            _pad: 0,
            ret: 0,
            misc: MiscState::zeroed(),
            thread: ThreadQuery::zeroed(),
        }
    }

    /// A block ready to send: [`ARGS_MAGIC`], the given command, everything else zero.
    pub const fn new(cmd: u32) -> Self {
        let mut a = Self::zeroed();
        a.magic = ARGS_MAGIC;
        a.cmd = cmd;
        a
    }
}

const _: () = assert!(core::mem::size_of::<KernelSigaction>() == 32);
const _: () = assert!(core::mem::size_of::<Timeval>() == 16);
const _: () = assert!(core::mem::size_of::<ITimerval>() == 32);
const _: () = assert!(core::mem::size_of::<StackT>() == 24);
const _: () = assert!(core::mem::size_of::<Getters>() == 9 * 8);
const _: () =
    assert!(core::mem::size_of::<MiscState>() == 2048 + 512 + 96 + 24 + 24 + 8 * 4 + 4 * 2 + 9 * 8);
const _: () = assert!(core::mem::size_of::<ThreadQuery>() == 16 + 24 + 8 * 8);
const _: () = assert!(
    core::mem::size_of::<Args>()
        == 24 + core::mem::size_of::<MiscState>() + core::mem::size_of::<ThreadQuery>()
);
const _: () = assert!(core::mem::align_of::<Args>() == 8);
const _: () = assert!(core::mem::offset_of!(Args, misc) == 24);
const _: () = assert!(core::mem::offset_of!(StackT, size) == 16);
