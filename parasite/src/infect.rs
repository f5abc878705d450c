//! Mapping the parasite blob into a seized task, calling it, and removing
//! every trace of it again (CRIU's compel_infect / compel_cure).
//!
//! Sequence:
//! 1. save registers, xstate and the signal mask; block every signal so no
//!    handler runs on the parasite's stack;
//! 2. poke `syscall; mov $15, %eax; syscall` over the first bytes of the
//!    first executable mapping, write a signal frame of the task's own state
//!    below its stack pointer, and run `mmap` there with the stack pointer
//!    at that frame: a dumper killed now leaves a task that runs on into
//!    `rt_sigreturn` and is back where it was (with its alternate signal
//!    stack disabled, as it is not known yet; with no room below the stack
//!    pointer, the plain `syscall; int3` is used, unprotected);
//! 3. copy the relocated blob into the new area, and behind it an
//!    `rt_sigframe` holding the task's own state ([`crate::sigframe`]);
//! 4. commands and syscalls run under PTRACE_SYSCALL and always end with the
//!    task stopped *before* the blob's rescue path: at the entry of the
//!    "done" marker syscall, or at the exit of a trampoline syscall. If the
//!    dumper dies (even by SIGKILL), the kernel detaches and the task runs on
//!    into the rescue path: `rt_sigreturn` on that frame puts it back where
//!    it was (the 20 KiB area stays mapped). The bootstrap code of step 2
//!    is put back once the task is in the area (a dumper killed before
//!    leaves those few bytes of code, normally `_init`'s, changed);
//! 5. cure: `munmap` the area as the bootstrap ran its `mmap` (from the
//!    first executable mapping, the task's state in a frame on its stack,
//!    `rt_sigreturn` behind), stopping at the syscall's exit, then put back
//!    the original registers and move the task into an interrupt stop
//!    ([`Tracee::park_with`]) so the kernel's own syscall-restart step still
//!    runs when it resumes; then xstate, mask and the bytes of code.

use crate::blob::BLOB;
use crate::error::{ParasiteError, Result};
use crate::proto;
use crate::sigframe::{self, AltStack};
use crate::tracee::{Regs, Tracee};

const PAGE: u64 = 4096;
/// EFLAGS direction flag: must be clear on entry to compiled code.
const EFLAGS_DF: u64 = 1 << 10;
/// The blob's "done" marker is a getpid.
const MARKER_NR: i64 = libc::SYS_getpid;

/// A task with the parasite mapped into it. Dropping it cures the task
/// (best effort); call [`Infection::cure`] to see errors.
pub struct Infection<'t> {
    tracee: &'t Tracee,
    saved_regs: Regs,
    saved_xstate: Vec<u8>,
    saved_mask: u64,
    base: u64,
    len: u64,
    cured: bool,
    /// The task's alternate signal stack, read once the rescue path was
    /// armed (the leader's final rescue frame is rebuilt from it).
    altstack: std::cell::Cell<AltStack>,
    /// Whose state the rescue frame holds now.
    frame_owner: std::cell::Cell<FrameOwner>,
}

/// Which task the single rescue frame of the area belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FrameOwner {
    /// The infected task itself, which may be inside the area.
    Infected,
    /// Another thread of the process, inside the area for a
    /// [`Infection::thread_state`]; the infected task is parked on its own
    /// registers meanwhile.
    Thread,
}

/// What one other thread of an infected process was collected with
/// [`Infection::thread_state`].
#[derive(Debug, Clone)]
pub struct ThreadState {
    /// Its registers.
    pub regs: Regs,
    /// Its XSAVE area.
    pub xstate: Vec<u8>,
    /// Its blocked signal mask.
    pub sigmask: u64,
    /// `sigaltstack(NULL, &old)` and its return value.
    pub altstack: proto::StackT,
    /// Return value of `sigaltstack`.
    pub altstack_ret: i64,
    /// `prctl(PR_GET_TID_ADDRESS)`: its `clear_child_tid`.
    pub tid_address: u64,
    /// Return value of the `prctl`.
    pub tid_address_ret: i64,
    /// `prctl(PR_GET_SECUREBITS)`: its securebits, or a negative errno.
    pub securebits: i64,
    /// `prctl(PR_GET_TIMERSLACK)`: its timer slack in ns, or -errno.
    pub timer_slack_ret: i64,
    /// `prctl(PR_GET_PDEATHSIG)`: its parent-death signal.
    pub pdeath_sig: i32,
    /// Return value of that `prctl`.
    pub pdeath_sig_ret: i64,
}

/// What [`Infection::thread_state`] asked the thread itself.
struct ThreadAsked {
    alt: AltStack,
    altstack_ret: i64,
    tid_address: u64,
    tid_address_ret: i64,
    timer_slack_ret: i64,
    pdeath_sig: i32,
    pdeath_sig_ret: i64,
    securebits: i64,
}

impl Tracee {
    /// Maps the parasite into the task. On error the task is left as it was.
    pub fn infect(&self) -> Result<Infection<'_>> {
        let saved_regs = self.regs()?;
        let saved_xstate = self.xstate()?;
        let saved_mask = self.sigmask()?;
        self.set_sigmask(!0)?;
        let own = OwnState {
            regs: &saved_regs,
            xstate: &saved_xstate,
            mask: saved_mask,
        };
        let (base, len, poke) = match self.map_blob(&own) {
            Ok(area) => area,
            Err(e) => {
                let _ = self.set_regs(&saved_regs);
                let _ = self.set_xstate(&saved_xstate);
                let _ = self.set_sigmask(saved_mask);
                return Err(e);
            }
        };
        let inf = Infection {
            tracee: self,
            saved_regs,
            saved_xstate,
            saved_mask,
            base,
            len,
            cured: false,
            altstack: std::cell::Cell::new(AltStack {
                sp: 0,
                flags: libc::SS_DISABLE,
                size: 0,
            }),
            frame_owner: std::cell::Cell::new(FrameOwner::Infected),
        };
        // From here on, dropping `inf` cures the task. The bootstrap code
        // goes once the task is inside the area, whose rescue path then
        // stands in for the bootstrap's.
        let armed = inf.arm_rescue();
        let unpoked = poke.undo(self);
        armed?;
        unpoked?;
        Ok(inf)
    }

    /// Maps the area and copies the blob into it. Returns the area and the
    /// bootstrap code still poked into the task, to take out once the
    /// task is in the area ([`Poke::undo`]).
    fn map_blob(&self, own: &OwnState<'_>) -> Result<(u64, u64, Poke)> {
        let frame_off = (BLOB.mem_size as u64).next_multiple_of(64);
        let len = (frame_off + sigframe::frame_len(own.xstate.len()) as u64).next_multiple_of(PAGE);
        let site = first_exec_addr(self.pid())?;
        let args = [
            0,
            len,
            (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
            u64::MAX,
            0,
        ];
        // The alternate stack is not known yet: the frame disables it.
        let disabled = AltStack {
            sp: 0,
            flags: libc::SS_DISABLE,
            size: 0,
        };
        let Some((poke, ret)) = self.rescued_syscall(site, own, disabled, libc::SYS_mmap, args)?
        else {
            // No room for a frame below the stack pointer: the plain
            // bootstrap, unprotected for the one syscall.
            let base = self.bootstrap_mmap(
                site,
                "mmap (parasite)",
                0,
                len,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            )?;
            if let Err(e) = self.write_mem(base, &BLOB.relocated(base)) {
                let _ = self.syscall_at(site, libc::SYS_munmap, [base, len, 0, 0, 0, 0]);
                return Err(e);
            }
            return Ok((base, len, Poke::none(site)));
        };
        let mapped = crate::tracee::check_ret(self.pid(), "mmap (parasite)", ret)
            .and_then(|base| self.write_mem(base, &BLOB.relocated(base)).map(|()| base));
        match mapped {
            Ok(base) => Ok((base, len, poke)),
            Err(e) => {
                if ret >= 0 {
                    let munmap = [ret as u64, len, 0, 0, 0, 0];
                    let _ = self.syscall_from(&self.regs()?, site, libc::SYS_munmap, munmap);
                }
                let _ = poke.undo(self);
                Err(e)
            }
        }
    }

    /// Runs syscall `nr` at `site` (the first executable mapping) with the
    /// task's own state saved where the task itself can get it back: a
    /// signal frame below its stack pointer (past the red zone, where a
    /// signal would put one), and behind the `syscall` at `site` an
    /// `rt_sigreturn`. A dumper that dies at any moment then leaves a task
    /// that runs the syscall's `rt_sigreturn` and goes on where it was, with
    /// `alt` as its alternate signal stack. Returns the
    /// code poked (still there) and the raw result, the task stopped at
    /// the syscall's exit; `None` (nothing changed) when the stack has no
    /// room for the frame.
    fn rescued_syscall(
        &self,
        site: u64,
        own: &OwnState<'_>,
        alt: AltStack,
        nr: i64,
        args: [u64; 6],
    ) -> Result<Option<(Poke, i64)>> {
        let frame_len = sigframe::frame_len(own.xstate.len()) as u64;
        let Some(frame_at) = own
            .regs
            .rsp
            .checked_sub(RED_ZONE + frame_len)
            .map(|a| a & !63)
        else {
            return Ok(None);
        };
        let frame = sigframe::build(
            frame_at,
            &restart_regs(own.regs, true),
            own.xstate,
            own.mask,
            alt,
        );
        // What the frame covers goes back with the code: no trace is left
        // below the stack pointer either.
        let mut below_sp = vec![0u8; frame.len()];
        if self.read_mem(frame_at, &mut below_sp).is_err()
            || self.write_mem(frame_at, &frame).is_err()
        {
            return Ok(None);
        }
        let mut orig = vec![0u8; RESCUED_SYSCALL.len()];
        let poke = Poke {
            site,
            orig: Vec::new(),
            stack: Some((frame_at, below_sp)),
        };
        if let Err(e) = self.read_mem(site, &mut orig) {
            let _ = poke.undo(self);
            return Err(e);
        }
        let poke = Poke { orig, ..poke };
        self.write_mem(site, &RESCUED_SYSCALL)?;
        let mut base = *own.regs;
        base.rsp = frame_at + sigframe::RESCUE_SP_OFFSET;
        match self.syscall_from(&base, site, nr, args) {
            Ok(ret) => Ok(Some((poke, ret))),
            Err(e) => {
                let _ = poke.undo(self);
                Err(e)
            }
        }
    }
}

/// What the x86-64 ABI lets a function keep below its stack pointer.
const RED_ZONE: u64 = 128;

/// `syscall; mov $15, %eax; syscall`: a syscall followed by `rt_sigreturn`.
const RESCUED_SYSCALL: [u8; 9] = [0x0f, 0x05, 0xb8, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05];

/// The task's own state as the infection found it.
struct OwnState<'a> {
    regs: &'a Regs,
    xstate: &'a [u8],
    mask: u64,
}

/// Code poked over the task's first executable mapping and the frame
/// written below its stack pointer, with what was there.
struct Poke {
    site: u64,
    orig: Vec<u8>,
    /// Where the frame went, and the stack's bytes it covered.
    stack: Option<(u64, Vec<u8>)>,
}

impl Poke {
    /// Nothing poked (the plain bootstrap puts its bytes back itself).
    fn none(site: u64) -> Poke {
        Poke {
            site,
            orig: Vec::new(),
            stack: None,
        }
    }

    /// Puts the original bytes back.
    fn undo(&self, t: &Tracee) -> Result<()> {
        if !self.orig.is_empty() {
            t.write_mem(self.site, &self.orig)?;
        }
        if let Some((at, bytes)) = &self.stack {
            t.write_mem(*at, bytes)?;
        }
        Ok(())
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

    fn frame_addr(&self) -> u64 {
        self.base + (BLOB.mem_size as u64).next_multiple_of(64)
    }

    /// Writes the rescue frame and points the blob's rescue path at it. A
    /// first frame keeps the alternate stack disabled; once the real one is
    /// known (asked through the armed rescue path) the final frame replaces it.
    fn arm_rescue(&self) -> Result<()> {
        let t = self.tracee;
        self.write_own_rescue_frame()?;
        let alt = as_restored(self.query_altstack(t, None)?.0);
        self.altstack.set(alt);
        self.write_own_rescue_frame()
    }

    /// The infected task's own rescue frame (its saved state and the
    /// alternate stack known so far).
    fn write_own_rescue_frame(&self) -> Result<()> {
        self.write_rescue_frame(
            &self.saved_regs,
            &self.saved_xstate,
            self.saved_mask,
            self.altstack.get(),
        )
    }

    /// Writes the one rescue frame of the area for a task whose own state
    /// is `regs`/`xstate`/`mask`, and points the rescue path at it.
    fn write_rescue_frame(
        &self,
        regs: &Regs,
        xstate: &[u8],
        mask: u64,
        alt: AltStack,
    ) -> Result<()> {
        let t = self.tracee;
        let at = self.frame_addr();
        let f = sigframe::build(at, &restart_regs(regs, true), xstate, mask, alt);
        t.write_mem(at, &f)?;
        let sp = at + sigframe::RESCUE_SP_OFFSET;
        t.write_mem(self.base + BLOB.rescue_sp as u64, &sp.to_le_bytes())
    }

    /// `sigaltstack(NULL, &old)` run by `task` (the infected task or
    /// another thread of its process) at the area's trampoline: the
    /// alternate stack and the syscall's return value.
    fn query_altstack(&self, task: &Tracee, regs: Option<&Regs>) -> Result<(AltStack, i64)> {
        // The args block doubles as the output buffer of this one syscall.
        let buf = self.base + BLOB.args_offset as u64;
        let site = self.base + BLOB.trampoline as u64;
        let args = [0, buf, 0, 0, 0, 0];
        let ret = match regs {
            Some(r) => task.syscall_from(r, site, libc::SYS_sigaltstack, args)?,
            None => task.syscall_stop_at_exit(site, libc::SYS_sigaltstack, args)?,
        };
        crate::tracee::check_ret(task.pid(), "sigaltstack", ret)?;
        let mut ss = [0u8; 24];
        self.tracee.read_mem(buf, &mut ss)?;
        let word = |i: usize| u64::from_le_bytes(ss[i..i + 8].try_into().expect("8 bytes"));
        Ok((
            AltStack {
                sp: word(0),
                flags: word(8) as u32 as i32,
                size: word(16),
            },
            ret,
        ))
    }

    /// Puts the infected task back on its own state (registers, xstate,
    /// mask) while the area stays mapped, so that another thread may use
    /// the area's rescue frame. Undone by [`Infection::unpark`].
    fn park(&self) -> Result<()> {
        let t = self.tracee;
        // Parking starts from a syscall-exit stop.
        t.syscall_stop_at_exit(self.base + BLOB.trampoline as u64, libc::SYS_getpid, [0; 6])?;
        t.park_with(&self.saved_regs)?;
        t.set_xstate(&self.saved_xstate)?;
        t.set_sigmask(self.saved_mask)?;
        self.frame_owner.set(FrameOwner::Thread);
        Ok(())
    }

    /// Makes the area the infected task's again: its rescue frame, every
    /// signal blocked.
    fn unpark(&self) -> Result<()> {
        if self.frame_owner.get() == FrameOwner::Infected {
            return Ok(());
        }
        self.tracee.set_sigmask(!0)?;
        self.write_own_rescue_frame()?;
        self.frame_owner.set(FrameOwner::Infected);
        Ok(())
    }

    /// Collects another thread of the infected process through the area
    /// already mapped: its registers, xstate and mask, and what only the
    /// thread itself can ask the kernel for (alternate signal stack,
    /// `clear_child_tid`, timer slack, parent-death signal, securebits).
    /// Mapping the whole parasite into every thread instead costs a maps
    /// scan, an mmap, a blob copy and dozens of ptrace stops per thread.
    ///
    /// While the thread is in the area, the rescue frame is the thread's
    /// own (a dumper killed then leaves the thread exactly as it was) and
    /// the infected task waits parked on its own registers. The thread
    /// gets its registers, xstate and mask back before this returns, even
    /// on error.
    ///
    /// With `quiet_signal` (a signal this process ignores, see
    /// [`proto::ThreadQuery`]) the thread asks everything in one run of the
    /// blob, with no syscall stops, and stops on that signal; without, each
    /// question is a remote syscall with two stops.
    pub fn thread_state(&self, thread: &Tracee, quiet_signal: Option<i32>) -> Result<ThreadState> {
        if self.frame_owner.get() == FrameOwner::Infected {
            self.park()?;
        }
        let regs = thread.regs()?;
        let xstate = thread.xstate()?;
        let sigmask = thread.sigmask()?;
        thread.set_sigmask(!0)?;
        let asked = (|| {
            let disabled = AltStack {
                sp: 0,
                flags: libc::SS_DISABLE,
                size: 0,
            };
            self.write_rescue_frame(&regs, &xstate, sigmask, disabled)?;
            match quiet_signal {
                Some(sig) => self.ask_in_one_run(thread, &regs, sig),
                None => self.ask_by_syscalls(thread, &regs, &xstate, sigmask),
            }
        })();
        // Whatever happened, the thread gets its own state back, exactly.
        thread.park_with(&regs)?;
        thread.set_xstate(&xstate)?;
        thread.set_sigmask(sigmask)?;
        let a = asked?;
        Ok(ThreadState {
            regs,
            xstate,
            sigmask,
            altstack: proto::StackT {
                sp: a.alt.sp,
                flags: a.alt.flags,
                _pad: 0,
                size: a.alt.size,
            },
            altstack_ret: a.altstack_ret,
            tid_address: a.tid_address,
            tid_address_ret: a.tid_address_ret,
            timer_slack_ret: a.timer_slack_ret,
            pdeath_sig: a.pdeath_sig,
            pdeath_sig_ret: a.pdeath_sig_ret,
            securebits: a.securebits,
        })
    }

    /// The thread runs [`proto::CMD_THREAD_QUERY`] from the blob's entry
    /// under `PTRACE_CONT` and stops on `sig`, which it sends itself; the
    /// blob also puts the alternate stack it found into the rescue frame.
    fn ask_in_one_run(&self, thread: &Tracee, regs: &Regs, sig: i32) -> Result<ThreadAsked> {
        let args_addr = self.base + BLOB.args_offset as u64;
        let mut args = proto::Args::new(proto::CMD_THREAD_QUERY);
        args.thread.stop_signal = sig as u32;
        args.thread.frame_stack = self.frame_addr() + sigframe::UC_STACK_OFFSET;
        // SAFETY: Args is #[repr(C)] plain old data made of integers with
        // explicit padding (see proto.rs): its bytes are all initialized.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&raw const args).cast::<u8>(),
                std::mem::size_of::<proto::Args>(),
            )
        };
        // Through the leader's handle on the process's memory: opening the
        // thread's own would cost an open a thread.
        self.tracee.write_mem(args_addr, bytes)?;
        let mut r = *regs;
        r.rip = self.base + BLOB.entry as u64;
        r.orig_rax = u64::MAX;
        r.eflags &= !EFLAGS_DF;
        thread.set_regs(&r)?;
        crate::fault::inject(crate::fault::FaultPoint::ThreadInParasite);
        thread.run_until_signal(sig, "asking a thread for its state")?;
        // Only the thread's part comes back (the block is mostly the
        // leader's misc state, and this runs once a thread).
        let mut block = [0u8; std::mem::size_of::<proto::ThreadQuery>()];
        let at = args_addr + std::mem::offset_of!(proto::Args, thread) as u64;
        self.tracee.read_mem(at, &mut block)?;
        // SAFETY: ThreadQuery is #[repr(C)] plain old data made of
        // integers, so any byte pattern of its size is a valid value;
        // read_unaligned copes with the array's alignment.
        let q: proto::ThreadQuery = unsafe { std::ptr::read_unaligned(block.as_ptr().cast()) };
        if q.done != 1 {
            return Err(ParasiteError::UnexpectedStop {
                pid: thread.pid(),
                what: "asking a thread for its state",
                status: format!("signal {sig} before the blob was done"),
            });
        }
        Ok(ThreadAsked {
            alt: AltStack {
                sp: q.altstack.sp,
                flags: q.altstack.flags,
                size: q.altstack.size,
            },
            altstack_ret: q.altstack_ret,
            tid_address: q.tid_address,
            tid_address_ret: q.tid_address_ret,
            timer_slack_ret: q.timer_slack_ret,
            pdeath_sig: q.pdeath_sig,
            pdeath_sig_ret: q.pdeath_sig_ret,
            securebits: q.securebits_ret,
        })
    }

    /// Each question a remote syscall the thread runs at the trampoline
    /// (two syscall stops each), the rescue frame rewritten once the
    /// alternate stack is known.
    fn ask_by_syscalls(
        &self,
        thread: &Tracee,
        regs: &Regs,
        xstate: &[u8],
        sigmask: u64,
    ) -> Result<ThreadAsked> {
        let (alt, altstack_ret) = self.query_altstack(thread, Some(regs))?;
        crate::fault::inject(crate::fault::FaultPoint::ThreadInParasite);
        self.write_rescue_frame(regs, xstate, sigmask, as_restored(alt))?;
        let buf = self.base + BLOB.args_offset as u64;
        let site = self.base + BLOB.trampoline as u64;
        let tid_address_ret = thread.syscall_from(
            regs,
            site,
            libc::SYS_prctl,
            [libc::PR_GET_TID_ADDRESS as u64, buf, 0, 0, 0, 0],
        )?;
        let mut word = [0u8; 8];
        self.tracee.read_mem(buf, &mut word)?;
        let tid_address = u64::from_le_bytes(word);
        // Timer slack and the parent-death signal are per thread, and
        // only the thread itself can ask for them.
        let timer_slack_ret = thread.syscall_from(
            regs,
            site,
            libc::SYS_prctl,
            [libc::PR_GET_TIMERSLACK as u64, 0, 0, 0, 0, 0],
        )?;
        let pdeath_sig_ret = thread.syscall_from(
            regs,
            site,
            libc::SYS_prctl,
            [libc::PR_GET_PDEATHSIG as u64, buf, 0, 0, 0, 0],
        )?;
        // Securebits are per thread and only the thread can read them.
        let securebits = thread.syscall_from(
            regs,
            site,
            libc::SYS_prctl,
            [libc::PR_GET_SECUREBITS as u64, 0, 0, 0, 0, 0],
        )?;
        let mut int = [0u8; 4];
        self.tracee.read_mem(buf, &mut int)?;
        Ok(ThreadAsked {
            alt,
            altstack_ret,
            tid_address,
            tid_address_ret,
            timer_slack_ret,
            pdeath_sig: i32::from_le_bytes(int),
            pdeath_sig_ret,
            securebits,
        })
    }

    /// The task the parasite runs in.
    pub fn tracee(&self) -> &Tracee {
        self.tracee
    }

    /// Where a syscall run with [`Infection::syscall`] may write its output
    /// (the argument block, free between commands): address and size.
    pub fn syscall_buffer(&self) -> (u64, usize) {
        (
            self.base + BLOB.args_offset as u64,
            std::mem::size_of::<proto::Args>(),
        )
    }

    /// Runs one syscall inside the task and checks its result.
    pub fn syscall(&self, name: &'static str, nr: i64, args: [u64; 6]) -> Result<u64> {
        self.unpark()?;
        let t = self.tracee;
        let ret = t.syscall_stop_at_exit(self.base + BLOB.trampoline as u64, nr, args)?;
        crate::tracee::check_ret(t.pid(), name, ret)
    }

    /// Runs blob command `cmd` and returns the argument block it filled.
    pub fn call(&self, cmd: u32) -> Result<Box<proto::Args>> {
        self.run_blob(proto::Args::new(cmd), None)
    }

    /// Runs [`proto::CMD_DUMP_MISC`]. With `quiet_signal` (a signal the
    /// process ignores and has not pending, as for
    /// [`Infection::thread_state`]) the blob runs without syscall stops and
    /// ends on that signal: one stop instead of some 140.
    pub fn dump_misc(&self, quiet_signal: Option<i32>) -> Result<Box<proto::Args>> {
        let mut args = proto::Args::new(proto::CMD_DUMP_MISC);
        args.misc.stop_signal = quiet_signal.map_or(0, |s| s as u32);
        let out = self.run_blob(args, quiet_signal)?;
        if out.misc.done != 1 {
            return Err(ParasiteError::UnexpectedStop {
                pid: self.tracee.pid(),
                what: "running the parasite",
                status: "stopped before the blob was done".into(),
            });
        }
        Ok(out)
    }

    /// Runs the blob on `args` until its "done" marker, or with
    /// `stop_signal` until the delivery stop of that signal, and returns
    /// the argument block it filled.
    fn run_blob(&self, args: proto::Args, stop_signal: Option<i32>) -> Result<Box<proto::Args>> {
        self.unpark()?;
        let t = self.tracee;
        let args_addr = self.base + BLOB.args_offset as u64;
        // SAFETY: Args is #[repr(C)] plain old data made of integers with
        // explicit padding (see proto.rs): its bytes are all initialized.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                (&raw const args).cast::<u8>(),
                std::mem::size_of::<proto::Args>(),
            )
        };
        t.write_mem(args_addr, bytes)?;
        let mut r = self.saved_regs;
        r.rip = self.base + BLOB.entry as u64;
        r.orig_rax = u64::MAX;
        r.eflags &= !EFLAGS_DF;
        t.set_regs(&r)?;
        match stop_signal {
            Some(sig) => {
                crate::fault::inject(crate::fault::FaultPoint::LeaderInParasite);
                t.run_until_signal(sig, "running the parasite")?
            }
            None => t.run_until_syscall_entry(
                self.base + BLOB.done as u64,
                MARKER_NR,
                "running the parasite",
            )?,
        }
        let mut block = vec![0u8; std::mem::size_of::<proto::Args>()];
        t.read_mem(args_addr, &mut block)?;
        // SAFETY: Args is #[repr(C)] plain old data made of integers (see
        // proto.rs), so any byte pattern of the right length is a valid
        // value; read_unaligned copes with the Vec's alignment.
        let args: proto::Args = unsafe { std::ptr::read_unaligned(block.as_ptr().cast()) };
        if args.ret < 0 {
            return Err(ParasiteError::Command {
                pid: t.pid(),
                cmd: args.cmd,
                errno: nix::errno::Errno::from_raw(-args.ret as i32),
            });
        }
        Ok(Box::new(args))
    }

    /// Calls a function of the task's own code at `addr` with up to six
    /// integer arguments, on the task's thread (its TLS) with every signal
    /// blocked, on the stack whose top is `stack_top` (16-byte aligned,
    /// mapped by the caller: compiled code needs more than the blob's).
    /// It returns into the blob's call-return stub, so if ckpt dies
    /// meanwhile the function still finishes and the rescue path puts the
    /// task back where it was. Returns the function's `rax`.
    pub fn call_function(
        &self,
        what: &'static str,
        addr: u64,
        args: [u64; 6],
        stack_top: u64,
    ) -> Result<u64> {
        Ok(self
            .call_function_by(what, addr, args, stack_top, None)?
            .expect("no deadline, no giving up"))
    }

    /// [`Infection::call_function`] that gives up at `deadline` (`None`:
    /// never; a function that waits for a lock a frozen thread holds never
    /// returns): `None` then, the task interrupted where it waited and the
    /// infection usable again (the next call or the cure sets every
    /// register it needs).
    pub fn call_function_by(
        &self,
        what: &'static str,
        addr: u64,
        args: [u64; 6],
        stack_top: u64,
        deadline: Option<std::time::Instant>,
    ) -> Result<Option<u64>> {
        self.unpark()?;
        let t = self.tracee;
        let mut r = self.saved_regs;
        t.prepare_call(
            &mut r,
            addr,
            args,
            stack_top,
            self.base + BLOB.call_return as u64,
        )?;
        t.set_regs(&r)?;
        if t.run_until_syscall_entry_by(self.base + BLOB.done as u64, MARKER_NR, what, deadline)? {
            Ok(Some(t.regs()?.rdi))
        } else {
            Ok(None)
        }
    }

    /// Unmaps the parasite and puts registers, xstate and signal mask back.
    pub fn cure(mut self) -> Result<()> {
        self.cured = true;
        self.do_cure()
    }

    fn do_cure(&self) -> Result<()> {
        let t = self.tracee;
        // Parked for another thread, the task holds its own mask again: a
        // signal pending to it (one that came while it was stopped by job
        // control) would be delivered at the munmap below.
        t.set_sigmask(!0)?;
        let munmap = [self.base, self.len, 0, 0, 0, 0];
        let own = OwnState {
            regs: &self.saved_regs,
            xstate: &self.saved_xstate,
            mask: self.saved_mask,
        };
        // Run from the first executable mapping with the task's state in a
        // frame on its stack, as the bootstrap was: a dumper killed once
        // the area is gone leaves a task that returns through that frame.
        let rescued = first_exec_addr(t.pid()).and_then(|site| {
            t.rescued_syscall(site, &own, self.altstack.get(), libc::SYS_munmap, munmap)
        });
        let (ret, poke) = match rescued {
            Ok(Some((poke, ret))) => (Ok(ret), Some(poke)),
            // No room below the stack pointer: from the area's own
            // trampoline, unprotected for the one syscall.
            Ok(None) => (
                t.syscall_stop_at_exit(
                    self.base + BLOB.trampoline as u64,
                    libc::SYS_munmap,
                    munmap,
                ),
                None,
            ),
            Err(e) => (Err(e), None),
        };
        // Whatever happened, give the task its own state back, exactly,
        // and only then the bytes of code the munmap ran from.
        t.park_with(&self.saved_regs)?;
        t.set_xstate(&self.saved_xstate)?;
        t.set_sigmask(self.saved_mask)?;
        if let Some(p) = poke {
            p.undo(t)?;
        }
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

/// The alternate stack as a rescue frame gives it back: `SS_ONSTACK` is the
/// kernel's report of where the task runs, not a setting.
fn as_restored(alt: AltStack) -> AltStack {
    AltStack {
        flags: alt.flags & !libc::SS_ONSTACK,
        ..alt
    }
}

/// Registers to resume a task with when it will *not* pass through the
/// kernel's signal-restart step (a freshly restored process resumes from a
/// syscall-exit stop; the rescue path resumes through `rt_sigreturn`): a task stopped inside an interrupted
/// syscall has `rax = -ERESTART*` and `orig_rax = nr`; the kernel would
/// re-execute the syscall, so do what it does. `same_process` tells whether
/// the kernel's restart block still belongs to this task; a restored process
/// has none, so `restart_syscall` would return EINTR anyway and the
/// interrupted call returns EINTR, as under CRIU, with one exception: a
/// `poll` without a timeout (which the kernel also restarts through its
/// restart block) is simply made again with the same arguments, which is
/// exactly what the restart block would have done. Programs that wait
/// forever in `poll` often take EINTR as fatal (`tail -f`); a call with a
/// timeout returns EINTR, as its remaining time is lost with the block.
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
        // poll(fds, nfds, timeout): the arguments are still in rdi, rsi
        // and rdx (a syscall leaves them as they were).
        ERESTART_RESTARTBLOCK if r.orig_rax == libc::SYS_poll as u64 && (r.rdx as i32) < 0 => {
            r.rax = r.orig_rax;
            r.rip -= 2;
        }
        ERESTART_RESTARTBLOCK => r.rax = (-libc::EINTR) as i64 as u64,
        _ => {}
    }
    r.orig_rax = u64::MAX;
    r
}

/// Start of the first executable mapping other than the vsyscall page.
/// The start of the task's first executable mapping (where bootstrap
/// code is poked for a moment).
pub fn first_exec_addr(pid: i32) -> Result<u64> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A task stopped at the exit of syscall `nr`, which returned `ret`.
    fn stopped_in(nr: i64, ret: i64, timeout: i32) -> Regs {
        // SAFETY: user_regs_struct is plain integers; all-zero is valid.
        let mut r: Regs = unsafe { std::mem::zeroed() };
        r.orig_rax = nr as u64;
        r.rax = ret as u64;
        r.rip = 0x1002;
        r.rdx = timeout as i64 as u64;
        r
    }

    #[test]
    fn interrupted_syscalls_are_made_again_or_return_eintr() {
        const ERESTARTNOHAND: i64 = -514;
        const ERESTART_RESTARTBLOCK: i64 = -516;
        let again = |r: Regs, nr: i64| r.rip == 0x1000 && r.rax == nr as u64;
        let eintr = |r: Regs| r.rip == 0x1002 && r.rax as i64 == -(libc::EINTR as i64);
        let read = stopped_in(libc::SYS_read, ERESTARTNOHAND, 0);
        assert!(again(restart_regs(&read, false), libc::SYS_read));
        // poll waiting forever: made again; with a timeout: EINTR.
        let forever = stopped_in(libc::SYS_poll, ERESTART_RESTARTBLOCK, -1);
        assert!(again(restart_regs(&forever, false), libc::SYS_poll));
        let timed = stopped_in(libc::SYS_poll, ERESTART_RESTARTBLOCK, 500);
        assert!(eintr(restart_regs(&timed, false)));
        let sleep = stopped_in(libc::SYS_clock_nanosleep, ERESTART_RESTARTBLOCK, 0);
        assert!(eintr(restart_regs(&sleep, false)));
        // In the same process, the kernel's block is still there.
        let r = restart_regs(&timed, true);
        assert!(r.rip == 0x1000 && r.rax == libc::SYS_restart_syscall as u64);
    }
}
