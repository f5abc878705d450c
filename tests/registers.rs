//! Registers: callee-saved GPRs, all vector registers, the x87 stack top and
//! the FPU/SSE control words must survive a dump taken while the victim
//! loops inside one asm block (victim: tests/c/regs.c).

use crate::common::*;

/// ymm0-15 when the CPU has AVX (the victim falls back to xmm otherwise).
#[test]
fn registers_restored_widest_vectors() {
    let env = TestEnv::new("regs-avx");
    let mut v = Victim::spawn(&env, "regs", &[]);
    let mode = v.wait_ready();
    eprintln!("regs victim uses {mode} registers");
    dump_kill_reap(&env, &mut v);
    restore_and_check(&env, &v);
}

/// xmm0-15 only: the legacy-SSE save area must be restored on its own too.
#[test]
fn registers_restored_sse_only() {
    let env = TestEnv::new("regs-sse");
    let mut v = Victim::spawn(&env, "regs", &["sse"]);
    assert_eq!(v.wait_ready(), "sse", "victim ignored the sse argument");
    dump_kill_reap(&env, &mut v);
    restore_and_check(&env, &v);
}

/// A dump that leaves the victim running must not disturb its registers
/// either (the parasite/ptrace path has to put everything back).
#[test]
fn registers_untouched_by_leave_running_dump() {
    let env = TestEnv::new("regs-leave");
    let mut v = Victim::spawn(&env, "regs", &[]);
    v.wait_ready();
    dump(&env, &v, &["--leave-running"]);
    assert_running_untouched(v.pid, "after --leave-running dump");
    v.go();
    let status = v.wait_original_exit(RESTORE_TIMEOUT);
    assert_eq!(status.code(), Some(0), "original failed: {}", v.diag());
    v.assert_pass();
}
