//! The ckpt parasite blob: freestanding, position-independent code that the dumper maps into a
//! ptrace-stopped process and runs there.
//!
//! Built by `parasite/build.rs` with plain `$RUSTC` as a static PIE linked at address 0 (see
//! `parasite.ld`), then flattened into `blob.bin`. Life cycle of one call:
//!
//! 1. The host maps the image (RWX), applies the R_X86_64_RELATIVE relocations, writes an
//!    [`proto::Args`] block at `__parasite_args` and sets `rip` to [`parasite_entry`].
//! 2. The entry switches to the blob's own 16 KiB stack (the target's stack and its red zone
//!    are never touched), clears DF and calls [`parasite_main`].
//! 3. `parasite_main` validates the block, runs the command with raw syscalls and stores `ret`.
//! 4. The entry executes `int3`; the host waits for that `SIGTRAP` and reads the block back.
//!    A stray return after that hits `ud2` (SIGILL).
#![no_std]
#![no_main]

mod mem;
#[allow(dead_code)]
#[path = "../src/proto.rs"]
mod proto;

use core::arch::{asm, naked_asm};
use proto::{
    ARGS_MAGIC, Args, CMD_DUMP_MISC, CMD_NONE, CMD_THREAD_QUERY, KernelSigaction, MiscState,
    NITIMERS, NSIG, ThreadQuery,
};

const EINVAL: i64 = 22;

const SYS_BRK: u64 = 12;
const SYS_RT_SIGACTION: u64 = 13;
const SYS_GETITIMER: u64 = 36;
const SYS_RT_SIGPROCMASK: u64 = 14;
const SYS_GETPID: u64 = 39;
const SYS_SIGALTSTACK: u64 = 131;
const SYS_PRCTL: u64 = 157;
const SYS_GETTID: u64 = 186;
const SYS_TGKILL: u64 = 234;
const SYS_MEMBARRIER: u64 = 324;
const PR_GET_DUMPABLE: u64 = 3;
const PR_GET_CHILD_SUBREAPER: u64 = 37;
const PR_GET_THP_DISABLE: u64 = 42;
const PR_GET_MDWE: u64 = 66;
const MEMBARRIER_CMD_GET_REGISTRATIONS: u64 = 1 << 9;
const PR_GET_PDEATHSIG: u64 = 2;
const PR_GET_SECUREBITS: u64 = 27;
const PR_GET_TIMERSLACK: u64 = 30;
const PR_GET_TID_ADDRESS: u64 = 40;
const SIG_UNBLOCK: u64 = 1;
/// `SS_ONSTACK`: reported by sigaltstack, refused by the frame's restore.
const SS_ONSTACK: i32 = 1;
/// `sigsetsize` argument of `rt_sigaction` on x86_64.
const KERNEL_SIGSET_SIZE: u64 = 8;

/// The argument block. The linker script puts `.parasite.args` first in `.data`, so this static
/// lives exactly at `__parasite_args`. It is `no_mangle` (externally visible) so that LLVM can
/// not assume it still holds its zero initializer when the host has written it.
#[unsafe(no_mangle)]
#[unsafe(link_section = ".parasite.args")]
static mut PARASITE_ARGS: Args = Args::zeroed();

/// Entry point: switch to the blob stack, clear DF, run [`parasite_main`], trap to the host.
/// Stack pointer for the rescue path: the address just past `pretcode` of an
/// `rt_sigframe` the host built from the task's own registers, xstate and
/// mask. Written by the host before the first command.
#[unsafe(no_mangle)]
static mut PARASITE_RESCUE_SP: u64 = 0;

/// Entry point and the fixed code around it.
///
/// * `parasite_entry`: run the command in the args block on our own stack.
/// * `parasite_done`: just after the "done" marker syscall (getpid). The host
///   runs commands under PTRACE_SYSCALL and stops at this syscall's entry.
/// * `parasite_rescue`: falls through from the marker. It is only ever
///   reached if the dumper died (the host never lets the task pass the
///   marker): `rt_sigreturn` to the task's original state.
/// * `parasite_trampoline`: `syscall`, then the marker and the rescue, so a
///   task left at a remote syscall's exit by a dead dumper also goes home.
/// * `parasite_call_return`: where a function of the task's own that the
///   host calls returns to: its result into rdi (the marker overwrites
///   rax), then the marker and the rescue.
#[unsafe(no_mangle)]
#[unsafe(naked)]
#[unsafe(link_section = ".text.entry")]
pub extern "C" fn parasite_entry() -> ! {
    naked_asm!(
        "cld",
        "lea rsp, [rip + __parasite_stack_top]",
        "and rsp, -16",
        "call {main}",
        "2:",
        "mov eax, 39",
        "syscall",
        ".globl parasite_done",
        "parasite_done:",
        ".globl parasite_rescue",
        "parasite_rescue:",
        "mov rsp, qword ptr [rip + {rescue_sp}]",
        "mov eax, 15",
        "syscall",
        "ud2",
        ".globl parasite_trampoline",
        "parasite_trampoline:",
        "syscall",
        "jmp 2b",
        ".globl parasite_call_return",
        "parasite_call_return:",
        "mov rdi, rax",
        "jmp 2b",
        main = sym parasite_main,
        rescue_sp = sym PARASITE_RESCUE_SP,
    )
}

extern "C" fn parasite_main() {
    let args = &raw mut PARASITE_ARGS;
    // SAFETY: `args` points at the static argument block, which the host filled in before
    // starting us; the blob runs single-threaded, so nothing else accesses it concurrently.
    unsafe {
        let magic = (&raw const (*args).magic).read_volatile();
        let cmd = (&raw const (*args).cmd).read_volatile();
        let ret = if magic != ARGS_MAGIC {
            -EINVAL
        } else {
            match cmd {
                CMD_NONE => 0,
                CMD_DUMP_MISC => dump_misc(&raw mut (*args).misc),
                CMD_THREAD_QUERY => thread_query(&raw mut (*args).thread),
                _ => -EINVAL,
            }
        };
        (&raw mut (*args).ret).write_volatile(ret);
    }
}

/// Fills a [`MiscState`] with raw syscalls. Always returns 0: per-call failures are reported
/// in the `*_ret` fields.
///
/// # Safety
/// `m` must be valid for writes of a whole `MiscState`.
unsafe fn dump_misc(m: *mut MiscState) -> i64 {
    // SAFETY: `m` is valid for writes (caller contract); every pointer handed to the kernel is
    // a field of `*m` of exactly the size the syscall writes, and all indices are in bounds.
    unsafe {
        let sigactions = (&raw mut (*m).sigactions).cast::<KernelSigaction>();
        let sigaction_ret = (&raw mut (*m).sigaction_ret).cast::<i64>();
        for i in 0..NSIG {
            let old = sigactions.add(i);
            let r = syscall4(
                SYS_RT_SIGACTION,
                i as u64 + 1,
                0,
                old as u64,
                KERNEL_SIGSET_SIZE,
            );
            sigaction_ret.add(i).write(r);
        }

        let itimers = (&raw mut (*m).itimers).cast::<proto::ITimerval>();
        let itimer_ret = (&raw mut (*m).itimer_ret).cast::<i64>();
        for i in 0..NITIMERS {
            let r = syscall4(SYS_GETITIMER, i as u64, itimers.add(i) as u64, 0, 0);
            itimer_ret.add(i).write(r);
        }

        let r = syscall4(SYS_SIGALTSTACK, 0, &raw mut (*m).altstack as u64, 0, 0);
        (*m).altstack_ret = r;

        let r = syscall4(
            SYS_PRCTL,
            PR_GET_TID_ADDRESS,
            &raw mut (*m).tid_address as u64,
            0,
            0,
        );
        (*m).tid_address_ret = r;

        (*m).brk = syscall4(SYS_BRK, 0, 0, 0, 0) as u64;

        let g = &raw mut (*m).getters;
        (*g).securebits_ret = syscall4(SYS_PRCTL, PR_GET_SECUREBITS, 0, 0, 0);
        (*g).pdeath_sig_ret = syscall4(
            SYS_PRCTL,
            PR_GET_PDEATHSIG,
            &raw mut (*g).pdeath_sig as u64,
            0,
            0,
        );
        (*g).child_subreaper_ret = syscall4(
            SYS_PRCTL,
            PR_GET_CHILD_SUBREAPER,
            &raw mut (*g).child_subreaper as u64,
            0,
            0,
        );
        (*g).dumpable_ret = syscall4(SYS_PRCTL, PR_GET_DUMPABLE, 0, 0, 0);
        (*g).thp_disable_ret = syscall4(SYS_PRCTL, PR_GET_THP_DISABLE, 0, 0, 0);
        (*g).mdwe_ret = syscall4(SYS_PRCTL, PR_GET_MDWE, 0, 0, 0);
        (*g).timer_slack_ret = syscall4(SYS_PRCTL, PR_GET_TIMERSLACK, 0, 0, 0);
        (*g).membarrier_ret = syscall4(SYS_MEMBARRIER, MEMBARRIER_CMD_GET_REGISTRATIONS, 0, 0, 0);
        (&raw mut (*m).done).write_volatile(1);
        stop_with(u64::from((*m).stop_signal));
    }
    0
}

/// Fills a [`ThreadQuery`] in the thread running the blob, patches the rescue frame's
/// alternate stack, then sends the thread its stop signal (see [`ThreadQuery`]). Always
/// returns 0: per-call failures are in the `*_ret` fields.
///
/// # Safety
/// `q` must be valid for reads and writes of a whole `ThreadQuery`; `frame_stack`, when not 0,
/// must be the writable `uc_stack` of the rescue frame.
unsafe fn thread_query(q: *mut ThreadQuery) -> i64 {
    // SAFETY: `q` is valid (caller contract); every pointer handed to the kernel is a field of
    // `*q` of the size the syscall writes, and `frame_stack` is the host's frame (contract).
    unsafe {
        let r = syscall4(SYS_SIGALTSTACK, 0, &raw mut (*q).altstack as u64, 0, 0);
        (*q).altstack_ret = r;
        let frame_stack = (*q).frame_stack;
        if r == 0 && frame_stack != 0 {
            let mut given_back = (*q).altstack;
            given_back.flags &= !SS_ONSTACK;
            (frame_stack as *mut proto::StackT).write_unaligned(given_back);
        }
        (*q).tid_address_ret = syscall4(
            SYS_PRCTL,
            PR_GET_TID_ADDRESS,
            &raw mut (*q).tid_address as u64,
            0,
            0,
        );
        (*q).timer_slack_ret = syscall4(SYS_PRCTL, PR_GET_TIMERSLACK, 0, 0, 0);
        (*q).pdeath_sig_ret = syscall4(
            SYS_PRCTL,
            PR_GET_PDEATHSIG,
            &raw mut (*q).pdeath_sig as u64,
            0,
            0,
        );
        (*q).securebits_ret = syscall4(SYS_PRCTL, PR_GET_SECUREBITS, 0, 0, 0);
        (&raw mut (*q).done).write_volatile(1);
        stop_with(u64::from((*q).stop_signal));
    }
    0
}

/// Ends a command run without syscall stops: unblocks `sig` and sends it to this thread, so
/// the tracer stops the thread on its delivery (a dead tracer's thread has it dropped, `sig`
/// being one the process ignores, and goes on to the rescue path). `sig` 0: nothing.
///
/// # Safety
/// Only raw syscalls on local values; `sig` must be 0 or a signal number (1..=64).
unsafe fn stop_with(sig: u64) {
    if sig == 0 {
        return;
    }
    // SAFETY: `set` lives across the call, the kernel reads 8 bytes of it.
    unsafe {
        let set: u64 = 1 << (sig - 1);
        syscall4(
            SYS_RT_SIGPROCMASK,
            SIG_UNBLOCK,
            &raw const set as u64,
            0,
            KERNEL_SIGSET_SIZE,
        );
        let tgid = syscall4(SYS_GETPID, 0, 0, 0, 0) as u64;
        let tid = syscall4(SYS_GETTID, 0, 0, 0, 0) as u64;
        syscall4(SYS_TGKILL, tgid, tid, sig, 0);
    }
}

/// Raw x86_64 `syscall` with up to four arguments (the fifth and sixth are 0); returns the
/// kernel's raw result.
///
/// # Safety
/// The syscall and its arguments must be valid for the current process (pointer arguments
/// must point at memory the kernel may read or write).
#[inline(always)]
unsafe fn syscall4(nr: u64, a1: u64, a2: u64, a3: u64, a4: u64) -> i64 {
    let ret: i64;
    // SAFETY: `syscall` clobbers only rax (result), rcx and r11, all declared; memory effects
    // are covered by the caller's contract (no `nomem`/`readonly`, so the compiler assumes the
    // kernel may access memory).
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") nr => ret,
            in("rdi") a1,
            in("rsi") a2,
            in("rdx") a3,
            in("r10") a4,
            // The fifth and sixth arguments: 0, as getters such as
            // PR_GET_THP_DISABLE require of every argument they do not use.
            in("r8") 0u64,
            in("r9") 0u64,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack)
        );
    }
    ret
}

/// Nothing in the blob can panic in practice; if it ever does, fault with SIGILL so the host
/// sees a non-SIGTRAP stop instead of running off into garbage.
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: `ud2` raises #UD and never returns.
    unsafe { asm!("ud2", options(noreturn, nomem, nostack)) }
}
