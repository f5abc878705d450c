//! The x86_64 `rt_sigframe` the parasite's rescue path returns through: if
//! the dumper dies while the parasite is loaded, the task executes
//! `rt_sigreturn` on this frame and is back in its own code with its own
//! registers, xstate, signal mask and alternate stack.
//!
//! Layout (arch/x86/include/asm/sigframe.h, uapi/asm/sigcontext.h):
//!
//! ```text
//! frame+0    pretcode            8   (rsp points just past it)
//! frame+8    struct ucontext     304
//!              uc_flags 8, uc_link 8, uc_stack 24,
//!              uc_mcontext (struct sigcontext) 256, uc_sigmask 8
//! frame+312  struct siginfo      128 (unused)
//! ...        fpstate (XSAVE area, 64-byte aligned) + FP_XSTATE_MAGIC2
//! ```

use crate::tracee::Regs;

const UCONTEXT: usize = 8;
const MCONTEXT: usize = UCONTEXT + 8 + 8 + 24;
const SIGMASK: usize = MCONTEXT + 256;
const FRAME_HEADER: usize = SIGMASK + 8 + 128;

const UC_FP_XSTATE: u64 = 1;
const UC_SIGCONTEXT_SS: u64 = 2;
const UC_STRICT_RESTORE_SS: u64 = 4;
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;
/// `struct _fpx_sw_bytes` lives in the XSAVE area's software-reserved bytes.
const SW_BYTES: usize = 464;

/// Bytes needed for a frame holding `xstate_len` bytes of XSAVE state.
pub fn frame_len(xstate_len: usize) -> usize {
    FRAME_HEADER.next_multiple_of(64) + xstate_len + 4
}

/// The task's alternate signal stack as `stack_t` fields.
#[derive(Debug, Clone, Copy)]
pub struct AltStack {
    /// ss_sp.
    pub sp: u64,
    /// ss_flags.
    pub flags: i32,
    /// ss_size.
    pub size: u64,
}

/// Builds a frame to be placed at remote address `at` (64-byte aligned).
/// `regs` must already have the syscall-restart step applied: rt_sigreturn
/// sets `orig_rax = -1`, so the kernel restarts nothing itself.
pub fn build(at: u64, regs: &Regs, xstate: &[u8], mask: u64, alt: AltStack) -> Vec<u8> {
    assert_eq!(at % 64, 0, "sigframe must be 64-byte aligned");
    let mut f = vec![0u8; frame_len(xstate.len())];
    let mut put = |off: usize, v: u64| f[off..off + 8].copy_from_slice(&v.to_le_bytes());
    put(
        UCONTEXT,
        UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS,
    );
    put(UCONTEXT + 16, alt.sp);
    put(UCONTEXT + 24, alt.flags as u32 as u64);
    put(UCONTEXT + 32, alt.size);
    let gp = [
        regs.r8,
        regs.r9,
        regs.r10,
        regs.r11,
        regs.r12,
        regs.r13,
        regs.r14,
        regs.r15,
        regs.rdi,
        regs.rsi,
        regs.rbp,
        regs.rbx,
        regs.rdx,
        regs.rax,
        regs.rcx,
        regs.rsp,
        regs.rip,
        regs.eflags,
    ];
    for (i, v) in gp.iter().enumerate() {
        put(MCONTEXT + i * 8, *v);
    }
    // cs, gs, fs, ss as four u16.
    let segs = (regs.cs & 0xffff)
        | (regs.gs & 0xffff) << 16
        | (regs.fs & 0xffff) << 32
        | (regs.ss & 0xffff) << 48;
    put(MCONTEXT + 18 * 8, segs);
    let fp_off = FRAME_HEADER.next_multiple_of(64);
    // err, trapno, oldmask, cr2 stay zero; then the fpstate pointer.
    put(MCONTEXT + 18 * 8 + 8 + 4 * 8, at + fp_off as u64);
    put(SIGMASK, mask);

    let fp = &mut f[fp_off..fp_off + xstate.len()];
    fp.copy_from_slice(xstate);
    let xfeatures = crate::sys::xcr0();
    let sw = &mut fp[SW_BYTES..SW_BYTES + 24];
    sw[0..4].copy_from_slice(&FP_XSTATE_MAGIC1.to_le_bytes());
    sw[4..8].copy_from_slice(&((xstate.len() + 4) as u32).to_le_bytes());
    sw[8..16].copy_from_slice(&xfeatures.to_le_bytes());
    sw[16..20].copy_from_slice(&(xstate.len() as u32).to_le_bytes());
    let end = fp_off + xstate.len();
    f[end..end + 4].copy_from_slice(&FP_XSTATE_MAGIC2.to_le_bytes());
    f
}

/// Offset of `uc_stack` in a frame: the alternate stack `rt_sigreturn`
/// sets again.
pub const UC_STACK_OFFSET: u64 = (UCONTEXT + 16) as u64;

/// Offset of the stack pointer the rescue code must load: just past
/// `pretcode`, where the kernel expects it on `rt_sigreturn`.
pub const RESCUE_SP_OFFSET: u64 = UCONTEXT as u64;
