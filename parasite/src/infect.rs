//! Mapping the parasite blob into a seized task, calling it, and removing
//! every trace of it again (CRIU's compel_infect / compel_cure).
//!
//! Sequence:
//! 1. save registers, xstate and the signal mask; block every signal so no
//!    handler runs on the parasite's stack;
//! 2. poke `syscall; int3` over the first 3 bytes of the first executable
//!    mapping, run `mmap` there, and put the original bytes back at once;
//! 3. copy the relocated blob plus a private `syscall; int3` trampoline into
//!    the new area: every later syscall runs from the blob's own trampoline;
//! 4. commands: write [`proto::Args`], jump to the blob's entry, wait for its
//!    final `int3`, read the args back;
//! 5. cure: `munmap` the area from its own trampoline, stopping at the
//!    syscall's exit (the next instruction no longer exists), then put back
//!    the original registers and move the task into an interrupt stop
//!    ([`Tracee::park_with`]) so the kernel's own syscall-restart step still
//!    runs when it resumes; then xstate and mask.

use crate::blob::BLOB;
use crate::error::{ParasiteError, Result};
use crate::proto;
use crate::tracee::{Regs, SYSCALL_INT3, Tracee};

const PAGE: u64 = 4096;
/// EFLAGS direction flag: must be clear on entry to compiled code.
const EFLAGS_DF: u64 = 1 << 10;

/// A task with the parasite mapped into it. Dropping it cures the task
/// (best effort); call [`Infection::cure`] to see errors.
pub struct Infection<'t> {
    tracee: &'t Tracee,
    saved_regs: Regs,
    saved_xstate: Vec<u8>,
    saved_mask: u64,
    base: u64,
    len: u64,
    trampoline: u64,
    cured: bool,
}

impl Tracee {
    /// Maps the parasite into the task. On error the task is left as it was.
    pub fn infect(&self) -> Result<Infection<'_>> {
        let saved_regs = self.regs()?;
        let saved_xstate = self.xstate()?;
        let saved_mask = self.sigmask()?;
        self.set_sigmask(!0)?;
        let restore = |t: &Tracee| {
            let _ = t.set_regs(&saved_regs);
            let _ = t.set_xstate(&saved_xstate);
            let _ = t.set_sigmask(saved_mask);
        };
        match self.map_blob() {
            Ok((base, len, trampoline)) => {
                restore(self);
                Ok(Infection {
                    tracee: self,
                    saved_regs,
                    saved_xstate,
                    saved_mask,
                    base,
                    len,
                    trampoline,
                    cured: false,
                })
            }
            Err(e) => {
                restore(self);
                Err(e)
            }
        }
    }

    fn map_blob(&self) -> Result<(u64, u64, u64)> {
        let blob_end = (BLOB.mem_size as u64).next_multiple_of(16);
        let len = (blob_end + 16).next_multiple_of(PAGE);
        let site = first_exec_addr(self.pid())?;
        let mut orig = [0u8; SYSCALL_INT3.len()];
        self.read_mem(site, &mut orig)?;
        self.write_mem(site, &SYSCALL_INT3)?;
        let mapped = self.syscall_ok(
            site,
            "mmap (parasite)",
            libc::SYS_mmap,
            [
                0,
                len,
                (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
                u64::MAX,
                0,
            ],
        );
        // Put the program's code back before anything else can fail.
        self.write_mem(site, &orig)?;
        let base = mapped?;
        let trampoline = base + blob_end;
        let setup = self
            .write_mem(base, &BLOB.relocated(base))
            .and_then(|()| self.write_mem(trampoline, &SYSCALL_INT3));
        if let Err(e) = setup {
            let _ = self.syscall_at(site, libc::SYS_munmap, [base, len, 0, 0, 0, 0]);
            return Err(e);
        }
        Ok((base, len, trampoline))
    }
}

impl Infection<'_> {
    /// The task's registers as they were before infection.
    pub fn saved_regs(&self) -> &Regs {
        &self.saved_regs
    }

    /// The task's XSAVE area as it was before infection.
    pub fn saved_xstate(&self) -> &[u8] {
        &self.saved_xstate
    }

    /// The task's blocked signal mask as it was before infection.
    pub fn saved_sigmask(&self) -> u64 {
        self.saved_mask
    }

    /// Address range of the parasite area (it must not be dumped).
    pub fn area(&self) -> (u64, u64) {
        (self.base, self.base + self.len)
    }

    /// Runs one syscall inside the task and checks its result.
    pub fn syscall(&self, name: &'static str, nr: i64, args: [u64; 6]) -> Result<u64> {
        self.tracee.syscall_ok(self.trampoline, name, nr, args)
    }

    /// Runs blob command `cmd` and returns the argument block it filled.
    pub fn call(&self, cmd: u32) -> Result<Box<proto::Args>> {
        let t = self.tracee;
        let args_addr = self.base + BLOB.args_offset as u64;
        let mut block = vec![0u8; std::mem::size_of::<proto::Args>()];
        block[..8].copy_from_slice(&proto::ARGS_MAGIC.to_le_bytes());
        block[8..12].copy_from_slice(&cmd.to_le_bytes());
        t.write_mem(args_addr, &block)?;
        let mut r = self.saved_regs;
        r.rip = self.base + BLOB.entry as u64;
        r.rsp = self.base + BLOB.stack_top as u64;
        r.orig_rax = u64::MAX;
        r.eflags &= !EFLAGS_DF;
        t.set_regs(&r)?;
        t.run_until_trap("running the parasite")?;
        t.read_mem(args_addr, &mut block)?;
        // SAFETY: Args is #[repr(C)] plain old data made of integers (see
        // proto.rs), so any byte pattern of the right length is a valid
        // value; read_unaligned copes with the Vec's alignment.
        let args: proto::Args = unsafe { std::ptr::read_unaligned(block.as_ptr().cast()) };
        if args.ret < 0 {
            return Err(ParasiteError::Command {
                pid: t.pid(),
                cmd,
                errno: nix::errno::Errno::from_raw(-args.ret as i32),
            });
        }
        Ok(Box::new(args))
    }

    /// Unmaps the parasite and puts registers, xstate and signal mask back.
    pub fn cure(mut self) -> Result<()> {
        self.cured = true;
        self.do_cure()
    }

    fn do_cure(&self) -> Result<()> {
        let t = self.tracee;
        let ret = t.syscall_stop_at_exit(
            self.trampoline,
            libc::SYS_munmap,
            [self.base, self.len, 0, 0, 0, 0],
        );
        // Whatever happened, give the task its own state back, exactly.
        t.park_with(&self.saved_regs)?;
        t.set_xstate(&self.saved_xstate)?;
        t.set_sigmask(self.saved_mask)?;
        crate::tracee::check_ret(t.pid(), "munmap (parasite)", ret?)?;
        Ok(())
    }
}

impl Drop for Infection<'_> {
    fn drop(&mut self) {
        if !self.cured {
            let _ = self.do_cure();
        }
    }
}

/// Registers to resume a task with when it will *not* pass through the
/// kernel's signal-restart step (a freshly restored process resumes from a
/// syscall-exit stop): a task stopped inside an interrupted
/// syscall has `rax = -ERESTART*` and `orig_rax = nr`; the kernel would
/// re-execute the syscall, so do what it does. `same_process` tells whether
/// the kernel's restart block still belongs to this task; a restored process
/// has none, so `restart_syscall` would return EINTR anyway and the
/// interrupted call returns EINTR, as under CRIU.
pub fn restart_regs(regs: &Regs, same_process: bool) -> Regs {
    const ERESTARTSYS: i64 = -512;
    const ERESTARTNOINTR: i64 = -513;
    const ERESTARTNOHAND: i64 = -514;
    const ERESTART_RESTARTBLOCK: i64 = -516;
    let mut r = *regs;
    if (r.orig_rax as i64) < 0 {
        return r;
    }
    match r.rax as i64 {
        ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND => {
            r.rax = r.orig_rax;
            r.rip -= 2;
        }
        ERESTART_RESTARTBLOCK if same_process => {
            r.rax = libc::SYS_restart_syscall as u64;
            r.rip -= 2;
        }
        ERESTART_RESTARTBLOCK => r.rax = (-libc::EINTR) as i64 as u64,
        _ => {}
    }
    r.orig_rax = u64::MAX;
    r
}

/// Start of the first executable mapping other than the vsyscall page.
fn first_exec_addr(pid: i32) -> Result<u64> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).map_err(|source| {
        ParasiteError::Mem {
            pid,
            op: "read /proc/PID/maps",
            addr: 0,
            len: 0,
            source,
        }
    })?;
    maps.lines()
        .filter(|l| !l.ends_with("[vsyscall]"))
        .find_map(|l| {
            let mut f = l.split_whitespace();
            let range = f.next()?;
            let perms = f.next()?;
            (perms.as_bytes().get(2) == Some(&b'x'))
                .then(|| u64::from_str_radix(range.split('-').next()?, 16).ok())
                .flatten()
        })
        .ok_or_else(|| ParasiteError::Layout {
            pid,
            what: "no executable mapping to run the first remote syscall from".into(),
        })
}
