//! Many syscalls for one ptrace stop: a loop placed in the scratch area
//! (`remote::Remote`) runs a table of syscalls in the stopped task and
//! traps once at the end. A remote syscall otherwise costs a resume, a
//! wait and two register transfers, some 30 µs; rebuilding a process with
//! 65,000 VMAs needs one `mmap` each.
//!
//! Table entry (64 bytes): `nr`, six arguments, and the slot the loop
//! stores the result in. The loop stops at the first result in
//! `-4095..=-1` (an error), so nothing runs after a failed call; the
//! registers tell how many entries were left.

use std::arch::global_asm;

/// Bytes of one table entry.
pub const ENTRY_LEN: u64 = 64;
/// Offset of the result in an entry.
pub const RESULT_OFFSET: u64 = 56;

// The loop's machine code, assembled into the host only to be copied into
// a task (it is never run here): rdi = table, rsi = entries. Uses only
// registers and relative jumps, so it runs at any address. r12 walks the
// table, r13 counts the entries left (0 after a full run).
global_asm!(
    ".pushsection .rodata.ckpt_batch_loop, \"a\"",
    ".globl ckpt_batch_loop_start",
    "ckpt_batch_loop_start:",
    "mov r12, rdi",
    "mov r13, rsi",
    "2:",
    "test r13, r13",
    "jz 4f",
    "mov rax, qword ptr [r12]",
    "mov rdi, qword ptr [r12 + 8]",
    "mov rsi, qword ptr [r12 + 16]",
    "mov rdx, qword ptr [r12 + 24]",
    "mov r10, qword ptr [r12 + 32]",
    "mov r8, qword ptr [r12 + 40]",
    "mov r9, qword ptr [r12 + 48]",
    "syscall",
    "mov qword ptr [r12 + 56], rax",
    "cmp rax, -4095",
    "jae 4f",
    "add r12, 64",
    "dec r13",
    "jmp 2b",
    "4:",
    "int3",
    ".globl ckpt_batch_loop_end",
    "ckpt_batch_loop_end:",
    ".popsection",
);

unsafe extern "C" {
    static ckpt_batch_loop_start: u8;
    static ckpt_batch_loop_end: u8;
}

/// The loop's machine code, to be copied into a task.
pub fn loop_code() -> &'static [u8] {
    // SAFETY: both symbols are labels of the one `global_asm!` block above,
    // in the same section, start before end; the bytes between them are
    // the assembled loop, immutable read-only data for the program's life.
    unsafe {
        let start = &raw const ckpt_batch_loop_start;
        let end = &raw const ckpt_batch_loop_end;
        let len = end.offset_from(start) as usize;
        std::slice::from_raw_parts(start, len)
    }
}

/// One syscall of a batch.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// For errors: what the call was.
    pub name: &'static str,
    /// Syscall number.
    pub nr: i64,
    /// Its arguments.
    pub args: [u64; 6],
}

impl Call {
    /// `close(fd)`, named `name` in errors.
    pub fn close(name: &'static str, fd: i32) -> Call {
        Call {
            name,
            nr: libc::SYS_close,
            args: [fd as u64, 0, 0, 0, 0, 0],
        }
    }
}

/// The table of `calls` as the loop reads it.
pub fn table(calls: &[Call]) -> Vec<u8> {
    let mut t = Vec::with_capacity(calls.len() * ENTRY_LEN as usize);
    for c in calls {
        t.extend_from_slice(&(c.nr as u64).to_le_bytes());
        for a in c.args {
            t.extend_from_slice(&a.to_le_bytes());
        }
        t.extend_from_slice(&0u64.to_le_bytes());
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loop_is_assembled_and_ends_with_its_trap() {
        let code = loop_code();
        assert!(code.len() > 40 && code.len() < 128, "{} bytes", code.len());
        assert_eq!(code.last(), Some(&0xcc), "int3 last");
    }

    #[test]
    fn table_entries_are_nr_args_and_an_empty_result() {
        let t = table(&[Call {
            name: "x",
            nr: 9,
            args: [1, 2, 3, 4, 5, 6],
        }]);
        assert_eq!(t.len(), ENTRY_LEN as usize);
        let word = |i: usize| u64::from_le_bytes(t[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!((word(0), word(1), word(6), word(7)), (9, 1, 6, 0));
    }
}
