//! A task under ptrace control: stopped, with its registers, memory and
//! signal state reachable, and able to run single syscalls at an address
//! that holds `syscall; int3`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::error::{ParasiteError, Result};
use crate::sys;

/// x86_64 general-purpose registers as ptrace sees them.
pub type Regs = libc::user_regs_struct;

/// The bytes of the trampoline: `syscall; int3`.
pub const SYSCALL_INT3: [u8; 3] = [0x0f, 0x05, 0xcc];

/// `orig_rax` value that tells the kernel the task is not in a syscall, so
/// nothing is restarted when it resumes.
const NO_SYSCALL: u64 = u64::MAX;

/// What a [`Tracee::clone_at`] creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NewTask {
    /// A thread of the task (`CLONE_THREAD`).
    Thread,
    /// Another process (a child, or with `CLONE_PARENT` a sibling).
    Process,
}

/// A stopped task that ckpt controls with ptrace.
///
/// Dropping it detaches (the task resumes with whatever registers it has),
/// so callers restore what they changed before dropping; [`crate::Infection`]
/// does that for the parasite.
pub struct Tracee {
    pid: Pid,
    /// `/proc/PID/mem`, opened on first use: a thread's memory is its
    /// process's, and a dump of 2,000 threads reads it through one.
    mem: std::sync::OnceLock<File>,
    attached: bool,
    /// The ptrace options in force (`PTRACE_SETOPTIONS` replaces them all,
    /// so each change starts from these).
    options: std::sync::atomic::AtomicI32,
    /// Whether the task has created other threads ckpt traces: its death
    /// is then not reported until ckpt has collected theirs, so its waits
    /// watch for it ([`Tracee::wait_any_by`]).
    traced_threads: std::sync::atomic::AtomicBool,
}

/// How many times a wait that polls only yields the CPU before it starts
/// to sleep: a remote syscall is over in some microseconds, less than a
/// sleep's own slack.
const POLL_SPINS: u32 = 64;

/// The first pause of a wait that polls; each further one doubles, up to
/// [`POLL_MAX`].
const POLL_FIRST: std::time::Duration = std::time::Duration::from_micros(10);

/// The longest pause of a wait that polls.
const POLL_MAX: std::time::Duration = std::time::Duration::from_micros(200);

/// `PTRACE_O_TRACESYSGOOD`, what a seized task starts with.
const SEIZED_OPTIONS: libc::c_int = libc::PTRACE_O_TRACESYSGOOD;

impl Tracee {
    /// Seizes `pid` with `PTRACE_SEIZE` and stops it with `PTRACE_INTERRUPT`,
    /// so the program never sees a SIGSTOP.
    pub fn seize(pid: i32) -> Result<Self> {
        Self::seize_begin(pid)?.wait()
    }

    /// Seizes `pid` and asks it to stop, without waiting for the stop:
    /// many threads are frozen faster by asking each first and then
    /// waiting for each ([`Stopping::wait`]), as their stops overlap.
    pub fn seize_begin(pid: i32) -> Result<Stopping> {
        let p = Pid::from_raw(pid);
        ptrace::seize(p, ptrace::Options::PTRACE_O_TRACESYSGOOD).map_err(|source| {
            if source == Errno::EPERM
                && let Some(tracer) = tracer_of(pid).filter(|t| *t != 0)
            {
                return ParasiteError::AlreadyTraced { pid, tracer };
            }
            ParasiteError::Ptrace {
                pid,
                op: "seize",
                source,
            }
        })?;
        // From here on the task is ours: any error below must detach.
        let t = Tracee {
            pid: p,
            mem: std::sync::OnceLock::new(),
            attached: true,
            options: std::sync::atomic::AtomicI32::new(SEIZED_OPTIONS),
            traced_threads: false.into(),
        };
        ptrace::interrupt(p).map_err(t.ptrace_err("interrupt"))?;
        Ok(Stopping(Some(t)))
    }

    /// Stops the task with `PTRACE_INTERRUPT`; a signal that arrived
    /// before the interrupt is delivered exactly as it would have been,
    /// then the stop is taken.
    fn interrupt_and_wait(&self) -> Result<()> {
        ptrace::interrupt(self.pid).map_err(self.ptrace_err("interrupt"))?;
        self.wait_interrupt_stop()
    }

    /// Waits for the stop `PTRACE_INTERRUPT` asked for, delivering a
    /// signal that came first as it would have been.
    fn wait_interrupt_stop(&self) -> Result<()> {
        let (p, pid) = (self.pid, self.pid());
        loop {
            let deliver = match self.wait_any("freezing")? {
                sys::Waited::Status(WaitStatus::PtraceEvent(_, _, libc::PTRACE_EVENT_STOP)) => {
                    return Ok(());
                }
                sys::Waited::Status(WaitStatus::Stopped(_, sig)) => sig as i32,
                sys::Waited::RtSignalStop(sig) => sig,
                sys::Waited::Status(other) => {
                    return Err(ParasiteError::UnexpectedStop {
                        pid,
                        what: "freezing",
                        status: format!("{other:?}"),
                    });
                }
            };
            sys::cont_with(p, deliver).map_err(|source| ParasiteError::Ptrace {
                pid,
                op: "cont",
                source,
            })?;
        }
    }

    /// Lets a frozen task run on (from its interrupt stop) until
    /// [`Tracee::stop_again`]; it stays traced.
    pub fn let_run(&self) -> Result<()> {
        ptrace::cont(self.pid, None).map_err(self.ptrace_err("cont"))
    }

    /// Freezes a task [`Tracee::let_run`] let go, as [`Tracee::seize`] does.
    pub fn stop_again(&self) -> Result<()> {
        self.interrupt_and_wait()
    }

    /// Takes control of a child that called `PTRACE_TRACEME` and stopped
    /// itself with SIGSTOP (the restorer's freshly cloned process).
    pub fn adopt_stopped_child(pid: i32) -> Result<Self> {
        let p = Pid::from_raw(pid);
        let t = Tracee {
            pid: p,
            mem: std::sync::OnceLock::new(),
            attached: true,
            options: std::sync::atomic::AtomicI32::new(0),
            traced_threads: false.into(),
        };
        t.set_options(libc::PTRACE_O_TRACESYSGOOD | libc::PTRACE_O_EXITKILL)?;
        Ok(t)
    }

    /// Makes threads and processes the task creates from now on traced too
    /// (stopped with SIGSTOP before they run any code), for recreating
    /// threads and children.
    pub fn trace_clones(&self) -> Result<()> {
        self.set_options(
            libc::PTRACE_O_TRACESYSGOOD
                | libc::PTRACE_O_EXITKILL
                | libc::PTRACE_O_TRACECLONE
                | libc::PTRACE_O_TRACEFORK
                | (self.options.load(std::sync::atomic::Ordering::Relaxed)
                    & libc::PTRACE_O_SUSPEND_SECCOMP),
        )
    }

    /// Makes the task's seccomp mode and filters ignore every syscall it
    /// makes until ckpt detaches (`PTRACE_O_SUSPEND_SECCOMP`, needs
    /// CAP_SYS_ADMIN): the parasite and the restorer's remote syscalls are
    /// ckpt's, not the program's, and must not be filtered or killed.
    /// Threads and children it creates while traced inherit it.
    pub fn suspend_seccomp(&self) -> Result<()> {
        self.set_options(
            self.options.load(std::sync::atomic::Ordering::Relaxed)
                | libc::PTRACE_O_SUSPEND_SECCOMP,
        )
    }

    fn set_options(&self, options: libc::c_int) -> Result<()> {
        sys::set_options(self.pid, options).map_err(self.ptrace_err("setoptions"))?;
        self.options
            .store(options, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// The task's seccomp filter `index` (0 is the oldest) as raw
    /// `struct sock_filter` bytes, or `None` past the oldest; a filter
    /// longer than `max_insns` is an `E2BIG` error.
    pub fn seccomp_filter(&self, index: u64, max_insns: usize) -> Result<Option<Vec<u8>>> {
        sys::seccomp_filter(self.pid, index, max_insns)
            .map_err(self.ptrace_err("seccomp_get_filter"))
    }

    /// The `SECCOMP_FILTER_FLAG_*` flags the kernel kept for filter `index`.
    pub fn seccomp_filter_flags(&self, index: u64) -> Result<u64> {
        sys::seccomp_filter_flags(self.pid, index).map_err(self.ptrace_err("seccomp_get_metadata"))
    }

    /// Runs `clone3(args, size)` inside the task at `site` (which must hold
    /// [`SYSCALL_INT3`]) to create a thread or a child process (`kind`
    /// says which `args` asks for), with [`Tracee::trace_clones`] in
    /// effect. Returns the new task, stopped before its first instruction.
    pub fn clone_at(&self, site: u64, args: u64, size: u64, kind: NewTask) -> Result<Tracee> {
        let mut r = self.regs()?;
        set_syscall_regs(&mut r, site, libc::SYS_clone3, [args, size, 0, 0, 0, 0]);
        self.set_regs(&r)?;
        ptrace::cont(self.pid, None).map_err(self.ptrace_err("cont"))?;
        let tid = match self.wait("creating a thread")? {
            WaitStatus::PtraceEvent(_, _, libc::PTRACE_EVENT_CLONE | libc::PTRACE_EVENT_FORK) => {
                // From here on a traced thread exists. Not after a fork,
                // even one the kernel reports as a clone event (any exit
                // signal but SIGCHLD, as `CLONE_PARENT` forks have): another
                // process's death does not hold this one's back, and taking
                // it for a thread would have this task's exit reported as a
                // death before ckpt collected it, leaving it traced and
                // unreapable by its parent.
                if kind == NewTask::Thread {
                    self.traced_threads
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                ptrace::getevent(self.pid).map_err(self.ptrace_err("geteventmsg"))? as i32
            }
            WaitStatus::Stopped(_, Signal::SIGTRAP) => {
                // clone3 failed: the task went straight on to the int3.
                let ret = self.regs()?.rax as i64;
                check_ret(self.pid(), "clone3 (thread)", ret)?;
                return Err(ParasiteError::UnexpectedStop {
                    pid: self.pid(),
                    what: "creating a thread",
                    status: format!("clone3 returned {ret} without a clone event"),
                });
            }
            other => {
                return Err(ParasiteError::UnexpectedStop {
                    pid: self.pid(),
                    what: "creating a thread",
                    status: format!("{other:?}"),
                });
            }
        };
        self.run_until_trap("creating a thread")?;
        let child = Pid::from_raw(tid);
        loop {
            match waitpid(child, Some(WaitPidFlag::__WALL)) {
                Ok(WaitStatus::Stopped(_, Signal::SIGSTOP))
                | Ok(WaitStatus::PtraceEvent(_, _, libc::PTRACE_EVENT_STOP)) => break,
                Err(Errno::EINTR) => continue,
                other => {
                    return Err(ParasiteError::UnexpectedStop {
                        pid: tid,
                        what: "starting a new thread",
                        status: format!("{other:?}"),
                    });
                }
            }
        }
        Ok(Tracee {
            pid: child,
            mem: std::sync::OnceLock::new(),
            attached: true,
            // The kernel copies the tracer's options to an auto-attached child.
            options: std::sync::atomic::AtomicI32::new(
                self.options.load(std::sync::atomic::Ordering::Relaxed),
            ),
            traced_threads: false.into(),
        })
    }

    /// The task's pid.
    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    /// The task's memory (`/proc/PID/mem`), usable with positional reads
    /// from many threads. It reaches PROT_NONE and read-only pages too.
    pub fn mem(&self) -> Result<&File> {
        if let Some(f) = self.mem.get() {
            return Ok(f);
        }
        let f = open_mem(self.pid())?;
        Ok(self.mem.get_or_init(|| f))
    }

    fn ptrace_err(&self, op: &'static str) -> impl FnOnce(Errno) -> ParasiteError {
        let pid = self.pid();
        move |source| ParasiteError::Ptrace { pid, op, source }
    }

    /// General-purpose registers.
    pub fn regs(&self) -> Result<Regs> {
        ptrace::getregs(self.pid).map_err(self.ptrace_err("getregs"))
    }

    /// Sets the general-purpose registers.
    pub fn set_regs(&self, regs: &Regs) -> Result<()> {
        ptrace::setregs(self.pid, *regs).map_err(self.ptrace_err("setregs"))
    }

    /// The full XSAVE area (FPU, SSE, AVX, ...).
    pub fn xstate(&self) -> Result<Vec<u8>> {
        sys::get_xstate(self.pid).map_err(self.ptrace_err("getregset NT_X86_XSTATE"))
    }

    /// Sets the full XSAVE area.
    pub fn set_xstate(&self, xstate: &[u8]) -> Result<()> {
        sys::set_xstate(self.pid, xstate).map_err(self.ptrace_err("setregset NT_X86_XSTATE"))
    }

    /// Blocked signal mask.
    pub fn sigmask(&self) -> Result<u64> {
        sys::get_sigmask(self.pid).map_err(self.ptrace_err("getsigmask"))
    }

    /// Sets the blocked signal mask.
    pub fn set_sigmask(&self, mask: u64) -> Result<()> {
        sys::set_sigmask(self.pid, mask).map_err(self.ptrace_err("setsigmask"))
    }

    /// Queued signals, per-thread (`shared == false`) or process-wide.
    pub fn pending_signals(&self, shared: bool) -> Result<Vec<[u8; sys::SIGINFO_SIZE]>> {
        sys::peek_siginfo(self.pid, shared).map_err(self.ptrace_err("peeksiginfo"))
    }

    /// The rseq registration.
    pub fn rseq(&self) -> Result<sys::RseqConfig> {
        sys::rseq_config(self.pid).map_err(self.ptrace_err("get_rseq_configuration"))
    }

    /// The robust futex list registration: (head, len).
    pub fn robust_list(&self) -> Result<(u64, u64)> {
        sys::get_robust_list(self.pid).map_err(self.ptrace_err("get_robust_list"))
    }

    /// Reads task memory (FOLL_FORCE: works on any mapped page).
    pub fn read_mem(&self, addr: u64, buf: &mut [u8]) -> Result<()> {
        self.mem()?
            .read_exact_at(buf, addr)
            .map_err(|source| ParasiteError::Mem {
                pid: self.pid(),
                op: "read",
                addr,
                len: buf.len(),
                source,
            })
    }

    /// Writes task memory (FOLL_FORCE: read-only private pages are COW-ed).
    pub fn write_mem(&self, addr: u64, buf: &[u8]) -> Result<()> {
        write_forced(self.pid(), self.mem()?, addr, buf)
    }

    /// Writes task memory with `process_vm_writev`: one copy, no bounce
    /// page, but only into mappings the task itself may write. Falls back to
    /// [`Tracee::write_mem`] for the rest (read-only, PROT_NONE).
    pub fn write_mem_fast(&self, addr: u64, buf: &[u8]) -> Result<()> {
        if write_direct(self.pid, addr, buf) {
            return Ok(());
        }
        self.write_mem(addr, buf)
    }

    /// The task's memory, to be written from any thread (a stopped
    /// process's pages copied beside the tracer's work on others).
    pub fn memory(&self) -> Result<TaskMemory> {
        Ok(TaskMemory {
            pid: self.pid,
            mem: open_mem(self.pid())?,
        })
    }

    /// Waits for the task's next stop; its death is an error.
    fn wait(&self, what: &'static str) -> Result<WaitStatus> {
        match self.wait_any(what)? {
            sys::Waited::Status(s) => Ok(s),
            sys::Waited::RtSignalStop(sig) => Err(ParasiteError::UnexpectedStop {
                pid: self.pid(),
                what,
                status: format!("signal-delivery stop of real-time signal {sig}"),
            }),
        }
    }

    /// [`Tracee::wait`], with the stops nix cannot describe.
    fn wait_any(&self, what: &'static str) -> Result<sys::Waited> {
        Ok(self
            .wait_any_by(what, None)?
            .expect("a wait without a deadline reports a change"))
    }

    /// [`Tracee::wait_any`] that gives up at `deadline` (`None`: never),
    /// polling: `Ok(None)` then. A task with traced threads is polled too,
    /// even without a deadline: killed, its own death is withheld until
    /// ckpt collects its threads' (a blocking wait would never end), so
    /// the wait watches for it instead and reports it.
    fn wait_any_by(
        &self,
        what: &'static str,
        deadline: Option<std::time::Instant>,
    ) -> Result<Option<sys::Waited>> {
        let threads = self
            .traced_threads
            .load(std::sync::atomic::Ordering::Relaxed);
        let mut pause = POLL_FIRST;
        let mut spins = 0;
        let status = loop {
            match sys::wait_traced_opt(self.pid, deadline.is_some() || threads) {
                Ok(Some(sys::Waited::Status(s))) => break s,
                Ok(Some(rt)) => return Ok(Some(rt)),
                Ok(None) => {
                    if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                        return Ok(None);
                    }
                    if threads && spins < POLL_SPINS {
                        spins += 1;
                        std::thread::yield_now();
                        continue;
                    }
                    if threads && crate::proc_read::leaving(self.pid()) {
                        // One last look: a report that came meanwhile wins.
                        match sys::wait_traced_opt(self.pid, true) {
                            Ok(Some(sys::Waited::Status(s))) => break s,
                            Ok(Some(rt)) => return Ok(Some(rt)),
                            _ => {
                                return Err(ParasiteError::Died {
                                    pid: self.pid(),
                                    how: format!("killed while {what}"),
                                });
                            }
                        }
                    }
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(POLL_MAX);
                }
                Err(Errno::EINTR) => continue,
                Err(source) => {
                    return Err(ParasiteError::Ptrace {
                        pid: self.pid(),
                        op: "waitpid",
                        source,
                    });
                }
            }
        };
        match status {
            WaitStatus::Exited(_, code) => Err(ParasiteError::Died {
                pid: self.pid(),
                how: format!("exit code {code}"),
            }),
            WaitStatus::Signaled(_, sig, _) => Err(ParasiteError::Died {
                pid: self.pid(),
                how: format!("killed by {sig}"),
            }),
            s => Ok(Some(sys::Waited::Status(s))),
        }
    }

    /// Resumes the task and waits until it executes an `int3`.
    pub fn run_until_trap(&self, what: &'static str) -> Result<()> {
        ptrace::cont(self.pid, None).map_err(self.ptrace_err("cont"))?;
        match self.wait(what)? {
            WaitStatus::Stopped(_, Signal::SIGTRAP) => Ok(()),
            other => Err(ParasiteError::UnexpectedStop {
                pid: self.pid(),
                what,
                status: format!("{other:?}"),
            }),
        }
    }

    /// Runs syscall `nr` with `args` inside the task, at `site`, which must
    /// hold [`SYSCALL_INT3`]. Registers are left modified: the caller saves
    /// and restores them around a batch of calls. Returns the raw result.
    pub fn syscall_at(&self, site: u64, nr: i64, args: [u64; 6]) -> Result<i64> {
        let mut r = self.regs()?;
        set_syscall_regs(&mut r, site, nr, args);
        self.set_regs(&r)?;
        self.run_until_trap("running a remote syscall")?;
        let after = self.regs()?;
        if after.rip != site + SYSCALL_INT3.len() as u64 {
            return Err(ParasiteError::UnexpectedStop {
                pid: self.pid(),
                what: "running a remote syscall",
                status: format!("trap at {:#x}, expected {:#x}", after.rip, site + 3),
            });
        }
        Ok(after.rax as i64)
    }

    /// Sets `r` up for a call of the function at `addr` with `args` (the
    /// SysV ABI's integer registers), on the stack whose top is
    /// `stack_top`, returning to `ret`: the return address is written at
    /// the aligned stack pointer.
    pub fn prepare_call(
        &self,
        r: &mut Regs,
        addr: u64,
        args: [u64; 6],
        stack_top: u64,
        ret: u64,
    ) -> Result<()> {
        // At entry rsp + 8 is 16-byte aligned, the return address at rsp.
        let sp = (stack_top & !15) - 8;
        self.write_mem(sp, &ret.to_le_bytes())?;
        r.rip = addr;
        r.rsp = sp;
        [r.rdi, r.rsi, r.rdx, r.rcx, r.r8, r.r9] = args;
        r.rax = 0;
        r.orig_rax = NO_SYSCALL;
        // The direction flag must be clear on entry to compiled code.
        r.eflags &= !(1 << 10);
        Ok(())
    }

    /// Calls the function at `addr` of the task's own code with up to six
    /// integer arguments, on the stack whose top is `stack_top`, returning
    /// to `trap`, an `int3` of ckpt's; the task runs until it gets there
    /// (its syscalls go through). Registers are left modified: the caller
    /// saves and restores them. Returns the function's `rax`.
    pub fn call_function_at(
        &self,
        what: &'static str,
        addr: u64,
        args: [u64; 6],
        stack_top: u64,
        trap: u64,
    ) -> Result<u64> {
        let mut r = self.regs()?;
        self.prepare_call(&mut r, addr, args, stack_top, trap)?;
        self.set_regs(&r)?;
        self.run_until_trap(what)?;
        let after = self.regs()?;
        if after.rip != trap + 1 {
            return Err(ParasiteError::UnexpectedStop {
                pid: self.pid(),
                what,
                status: format!("trap at {:#x}, expected {:#x}", after.rip, trap + 1),
            });
        }
        Ok(after.rax)
    }

    /// Like [`Tracee::syscall_at`], checking the result; `name` is for errors.
    pub fn syscall_ok(
        &self,
        site: u64,
        name: &'static str,
        nr: i64,
        args: [u64; 6],
    ) -> Result<u64> {
        let ret = self.syscall_at(site, nr, args)?;
        check_ret(self.pid(), name, ret)
    }

    /// Maps `len` bytes of private anonymous RWX memory (at `addr`, with
    /// `flags`) inside the task before it has any code of ckpt's: pokes
    /// `syscall; int3` over the task's own code at `site`, runs `mmap`
    /// there and puts the original bytes back before returning, even on
    /// error. The parasite and the restorer's scratch area both start so.
    pub fn bootstrap_mmap(
        &self,
        site: u64,
        name: &'static str,
        addr: u64,
        len: u64,
        flags: i32,
    ) -> Result<u64> {
        let mut orig = [0u8; SYSCALL_INT3.len()];
        self.read_mem(site, &mut orig)?;
        self.write_mem(site, &SYSCALL_INT3)?;
        let mapped = self.syscall_ok(
            site,
            name,
            libc::SYS_mmap,
            [
                addr,
                len,
                (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64,
                flags as u64,
                u64::MAX,
                0,
            ],
        );
        self.write_mem(site, &orig)?;
        mapped
    }

    /// Runs a syscall at `site` (which must hold a `syscall` instruction) and
    /// leaves the task stopped at the syscall's exit, so a syscall that
    /// unmaps its own code (the last step of a restore) can be followed by
    /// setting the final registers. Works from any stop, including a
    /// syscall-entry stop (whose skipped syscall still reports an exit).
    pub fn syscall_stop_at_exit(&self, site: u64, nr: i64, args: [u64; 6]) -> Result<i64> {
        self.syscall_from(&self.regs()?, site, nr, args)
    }

    /// [`Tracee::syscall_stop_at_exit`] starting from registers the caller
    /// already holds (only the syscall's are changed): one `getregs` less,
    /// which counts when every thread of a large process runs a few.
    pub fn syscall_from(&self, base: &Regs, site: u64, nr: i64, args: [u64; 6]) -> Result<i64> {
        let mut r = *base;
        set_syscall_regs(&mut r, site, nr, args);
        self.set_regs(&r)?;
        let after = site + 2;
        loop {
            ptrace::syscall(self.pid, None).map_err(self.ptrace_err("syscall"))?;
            match self.wait("running a remote syscall")? {
                WaitStatus::PtraceSyscall(_) => {
                    let info =
                        sys::syscall_info(self.pid).map_err(self.ptrace_err("get_syscall_info"))?;
                    // Only the syscall at `site` leaves from `after`.
                    if info.stop == sys::SyscallStop::Exit && info.ip == after {
                        return Ok(info.value);
                    }
                }
                other => {
                    return Err(ParasiteError::UnexpectedStop {
                        pid: self.pid(),
                        what: "running a remote syscall",
                        status: format!("{other:?}"),
                    });
                }
            }
        }
    }

    /// [`Tracee::run_until_syscall_entry`] that gives up at `deadline`
    /// (`None`: never): the task (blocked in a syscall, say a futex whose
    /// holder is frozen) is then interrupted and left stopped, and
    /// `Ok(false)` says it did not get there.
    pub fn run_until_syscall_entry_by(
        &self,
        at: u64,
        nr: i64,
        what: &'static str,
        deadline: Option<std::time::Instant>,
    ) -> Result<bool> {
        loop {
            ptrace::syscall(self.pid, None).map_err(self.ptrace_err("syscall"))?;
            let status = match self.wait_any_by(what, deadline)? {
                None => {
                    self.interrupt_running(what)?;
                    return Ok(false);
                }
                Some(sys::Waited::Status(s)) => s,
                Some(sys::Waited::RtSignalStop(sig)) => {
                    return Err(ParasiteError::UnexpectedStop {
                        pid: self.pid(),
                        what,
                        status: format!("signal-delivery stop of real-time signal {sig}"),
                    });
                }
            };
            match status {
                WaitStatus::PtraceSyscall(_) => {
                    let info =
                        sys::syscall_info(self.pid).map_err(self.ptrace_err("get_syscall_info"))?;
                    if info.stop == sys::SyscallStop::Entry && info.ip == at && info.value == nr {
                        return Ok(true);
                    }
                }
                other => {
                    return Err(ParasiteError::UnexpectedStop {
                        pid: self.pid(),
                        what,
                        status: format!("{other:?}"),
                    });
                }
            }
        }
    }

    /// Stops a task resumed under `PTRACE_SYSCALL` that is still running
    /// or blocked in a syscall. One blocked in a syscall stops at that
    /// syscall's exit (the kernel would restart it on a plain resume; the
    /// next remote syscall replaces its registers, and with them the
    /// restart); one running stops in an interrupt stop.
    fn interrupt_running(&self, what: &'static str) -> Result<()> {
        ptrace::interrupt(self.pid).map_err(self.ptrace_err("interrupt"))?;
        match self.wait(what)? {
            WaitStatus::PtraceEvent(_, _, libc::PTRACE_EVENT_STOP)
            | WaitStatus::PtraceSyscall(_) => Ok(()),
            other => Err(ParasiteError::UnexpectedStop {
                pid: self.pid(),
                what,
                status: format!("{other:?}"),
            }),
        }
    }

    /// Resumes the task without syscall stops until the delivery stop of
    /// signal `sig`, which the code it runs sends itself; the signal is not
    /// delivered (the next resume passes none).
    pub fn run_until_signal(&self, sig: i32, what: &'static str) -> Result<()> {
        ptrace::cont(self.pid, None).map_err(self.ptrace_err("cont"))?;
        match self.wait_any(what)? {
            sys::Waited::Status(WaitStatus::Stopped(_, s)) if s as i32 == sig => Ok(()),
            other => Err(ParasiteError::UnexpectedStop {
                pid: self.pid(),
                what,
                status: format!("{other:?}"),
            }),
        }
    }

    /// Resumes the task under PTRACE_SYSCALL until it enters syscall `nr`
    /// from the instruction ending at `at` (the parasite's "done" marker);
    /// the syscalls it makes on the way are let through.
    pub fn run_until_syscall_entry(&self, at: u64, nr: i64, what: &'static str) -> Result<()> {
        self.run_until_syscall_entry_by(at, nr, what, None)
            .map(|reached| debug_assert!(reached, "no deadline, no giving up"))
    }

    /// From a syscall-exit stop, moves a seized task into an interrupt stop
    /// with `regs` in place. Resuming from there passes through the kernel's
    /// signal-restart step, so registers of a task interrupted inside a
    /// syscall (`rax = -ERESTART*`) can be put back exactly as they were.
    pub fn park_with(&self, regs: &Regs) -> Result<()> {
        self.set_regs(regs)?;
        ptrace::interrupt(self.pid).map_err(self.ptrace_err("interrupt"))?;
        ptrace::cont(self.pid, None).map_err(self.ptrace_err("cont"))?;
        match self.wait("parking")? {
            WaitStatus::PtraceEvent(_, _, libc::PTRACE_EVENT_STOP) => Ok(()),
            other => Err(ParasiteError::UnexpectedStop {
                pid: self.pid(),
                what: "parking",
                status: format!("{other:?}"),
            }),
        }
    }

    /// From an interrupt stop, lets the kernel dequeue one signal the task
    /// does not block and discards it if it is SIGSTOP, which no mask can
    /// hold back: a job-stopped task may have one pending, and it would
    /// stop the first remote syscall. The caller blocks every other signal
    /// first and knows SIGSTOP is pending; if it is gone by then (a SIGCONT
    /// came), the task is interrupted again after `patience`. Returns
    /// whether a SIGSTOP was taken; the task is in an interrupt stop.
    pub fn take_pending_sigstop(&self, patience: std::time::Duration) -> Result<bool> {
        let what = "taking a pending SIGSTOP";
        let unexpected = |status: String| ParasiteError::UnexpectedStop {
            pid: self.pid(),
            what,
            status,
        };
        ptrace::cont(self.pid, None).map_err(self.ptrace_err("cont"))?;
        let deadline = std::time::Instant::now() + patience;
        match self.wait_any_by(what, Some(deadline))? {
            Some(sys::Waited::Status(WaitStatus::Stopped(_, Signal::SIGSTOP))) => {
                // Resumed without it, the task meets the interrupt next,
                // before any signal or code of its own.
                ptrace::interrupt(self.pid).map_err(self.ptrace_err("interrupt"))?;
                ptrace::cont(self.pid, None).map_err(self.ptrace_err("cont"))?;
                match self.wait(what)? {
                    WaitStatus::PtraceEvent(_, _, libc::PTRACE_EVENT_STOP) => Ok(true),
                    other => Err(unexpected(format!("{other:?}"))),
                }
            }
            None => {
                self.interrupt_and_wait()?;
                Ok(false)
            }
            Some(sys::Waited::Status(other)) => Err(unexpected(format!("{other:?}"))),
            Some(sys::Waited::RtSignalStop(sig)) => Err(unexpected(format!(
                "signal-delivery stop of real-time signal {sig}"
            ))),
        }
    }

    /// From a stop with stop signal `sig` pending and every other signal
    /// blocked, lets the task take `sig` and enter the group stop it
    /// starts; the task stays traced, in that stop.
    pub fn take_stop_signal(&self, sig: Signal) -> Result<()> {
        let what = "entering a job-control stop";
        ptrace::cont(self.pid, None).map_err(self.ptrace_err("cont"))?;
        match self.wait(what)? {
            WaitStatus::Stopped(_, s) if s == sig => {}
            other => {
                return Err(ParasiteError::UnexpectedStop {
                    pid: self.pid(),
                    what,
                    status: format!("{other:?}"),
                });
            }
        }
        ptrace::cont(self.pid, Some(sig)).map_err(self.ptrace_err("cont"))?;
        match self.wait(what)? {
            WaitStatus::Stopped(_, s) if s == sig => Ok(()),
            WaitStatus::PtraceEvent(_, _, libc::PTRACE_EVENT_STOP) => Ok(()),
            other => Err(ParasiteError::UnexpectedStop {
                pid: self.pid(),
                what,
                status: format!("{other:?}"),
            }),
        }
    }

    /// Makes the task die of signal `sig` with its default action (the mask
    /// is cleared first), as if it had received it; waits until it is gone.
    pub fn die_by(&self, sig: Signal) -> Result<()> {
        self.set_sigmask(0)?;
        nix::sys::signal::kill(self.pid, sig).map_err(self.ptrace_err("kill"))?;
        let mut deliver = 0;
        loop {
            match sys::cont_with(self.pid, deliver) {
                // SIGKILL needs no delivery: the task is already dying and
                // has left its stop; the wait below collects it.
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(e) => return Err(self.ptrace_err("cont")(e)),
            }
            deliver = match self.wait_any("delivering a fatal signal") {
                Err(ParasiteError::Died { .. }) => return Ok(()),
                Err(e) => return Err(e),
                Ok(sys::Waited::Status(WaitStatus::Stopped(_, s))) => s as i32,
                Ok(sys::Waited::RtSignalStop(s)) => s,
                Ok(sys::Waited::Status(_)) => 0,
            };
        }
    }

    /// After the task was sent SIGKILL: collects its death as its tracer
    /// (waiting at most until `until`), so its zombie goes to its real
    /// parent at once. A traced zombie waits for its tracer; a PID
    /// namespace's init cannot finish dying before every zombie of its
    /// namespace is reaped. Returns whether the death was collected.
    pub fn reap_killed(mut self, until: std::time::Instant) -> bool {
        self.attached = false;
        loop {
            match waitpid(self.pid, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) | Err(_) => return true,
                // An exit event stop on the way out: let it go on dying.
                Ok(WaitStatus::PtraceEvent(..) | WaitStatus::Stopped(..)) => {
                    let _ = ptrace::cont(self.pid, None);
                }
                Ok(_) => {}
            }
            if std::time::Instant::now() >= until {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Queues a SIGSTOP on this task alone (`tgkill`; `tgid` is its
    /// process) while it is in a ptrace stop, where nothing takes it until
    /// the task runs again. Should ckpt die now, the kernel detaches the
    /// task and it takes the signal before it returns to its own code: it
    /// waits in a job-control stop instead of running, until someone sends
    /// SIGCONT (which also discards a SIGSTOP still queued). Nothing may
    /// run code in the task afterwards (it would take the signal first);
    /// undone by [`Tracee::detach_held`].
    pub fn hold_stop(&self, tgid: i32) -> Result<()> {
        sys::tgkill(tgid, self.pid.as_raw(), libc::SIGSTOP)
            .map_err(self.ptrace_err("tgkill SIGSTOP"))
    }

    /// Detaches a task holding a SIGSTOP of [`Tracee::hold_stop`]: resumed
    /// under ptrace it takes that signal at once (signals it takes before
    /// it, lower-numbered ones, are passed on as they would have been: only
    /// their handlers' frames are set up before the SIGSTOP comes), and is
    /// detached from that signal-delivery stop with the signal dropped, so
    /// it runs on as if never stopped.
    pub fn detach_held(mut self) -> Result<()> {
        let mut pass_on = 0;
        for _ in 0..HELD_STOP_TRIES {
            sys::cont_with(self.pid, pass_on).map_err(self.ptrace_err("cont"))?;
            pass_on = match self.wait_any("taking back a held SIGSTOP")? {
                sys::Waited::Status(WaitStatus::Stopped(_, Signal::SIGSTOP)) => {
                    self.attached = false;
                    return ptrace::detach(self.pid, None).map_err(self.ptrace_err("detach"));
                }
                sys::Waited::Status(WaitStatus::Stopped(_, sig)) => sig as i32,
                sys::Waited::RtSignalStop(sig) => sig,
                other => {
                    return Err(ParasiteError::UnexpectedStop {
                        pid: self.pid(),
                        what: "taking back a held SIGSTOP",
                        status: format!("{other:?}"),
                    });
                }
            };
        }
        Err(ParasiteError::UnexpectedStop {
            pid: self.pid(),
            what: "taking back a held SIGSTOP",
            status: format!("{HELD_STOP_TRIES} other signals came first"),
        })
    }

    /// Detaches like [`Tracee::detach`]; a task found out of its stop
    /// (killed meanwhile: nothing else lets a stopped tracee go) has its
    /// death collected as its tracer instead, waiting at most until
    /// `until`, and is reported dead. Left uncollected, a killed thread
    /// would keep its process from ever being reaped.
    pub fn detach_or_collect(mut self, until: std::time::Instant) -> Result<()> {
        let pid = self.pid();
        match ptrace::detach(self.pid, None) {
            Ok(()) => {
                self.attached = false;
                Ok(())
            }
            Err(Errno::ESRCH) => {
                let collected = self.reap_killed(until);
                Err(ParasiteError::Died {
                    pid,
                    how: if collected {
                        "killed before it was let go".into()
                    } else {
                        "killed before it was let go, still exiting".into()
                    },
                })
            }
            Err(source) => Err(ParasiteError::Ptrace {
                pid,
                op: "detach",
                source,
            }),
        }
    }

    /// Detaches; the task continues from its current registers.
    pub fn detach(mut self) -> Result<()> {
        self.attached = false;
        ptrace::detach(self.pid, None).map_err(self.ptrace_err("detach"))
    }
}

/// A task seized and asked to stop ([`Tracee::seize_begin`]). Dropped
/// without [`Stopping::wait`], it is waited for and detached, so it runs
/// on as if never seized.
pub struct Stopping(Option<Tracee>);

impl Stopping {
    /// Waits for the stop: the task is frozen.
    pub fn wait(mut self) -> Result<Tracee> {
        let t = self.0.take().expect("waited once");
        t.wait_interrupt_stop()?;
        Ok(t)
    }
}

impl Drop for Stopping {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            // Detaching needs the stop; the tracee's own drop detaches.
            let _ = t.wait_interrupt_stop();
        }
    }
}

impl Drop for Tracee {
    fn drop(&mut self) {
        if self.attached {
            let _ = ptrace::detach(self.pid, None);
        }
    }
}

/// Signals a task held by [`Tracee::hold_stop`] may take before the
/// SIGSTOP (one of each standard and real-time signal at most).
const HELD_STOP_TRIES: usize = 70;

fn set_syscall_regs(r: &mut Regs, site: u64, nr: i64, args: [u64; 6]) {
    r.rax = nr as u64;
    r.rdi = args[0];
    r.rsi = args[1];
    r.rdx = args[2];
    r.r10 = args[3];
    r.r8 = args[4];
    r.r9 = args[5];
    r.orig_rax = NO_SYSCALL;
    r.rip = site;
}

/// Turns a raw syscall return into a value or a [`ParasiteError::RemoteSyscall`].
pub fn check_ret(pid: i32, name: &'static str, ret: i64) -> Result<u64> {
    if (-4095..0).contains(&ret) {
        Err(ParasiteError::RemoteSyscall {
            pid,
            name,
            errno: Errno::from_raw(-ret as i32),
        })
    } else {
        Ok(ret as u64)
    }
}

fn open_mem(pid: i32) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .map_err(|source| ParasiteError::Mem {
            pid,
            op: "open",
            addr: 0,
            len: 0,
            source,
        })
}

/// The TracerPid of `pid`, from /proc.
pub fn tracer_of(pid: i32) -> Option<i32> {
    let s =
        crate::proc_read::read_string(std::path::Path::new(&format!("/proc/{pid}/status"))).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// A task's memory, written as [`Tracee::write_mem_fast`] writes it, from
/// any thread: nothing here needs the tracer (`process_vm_writev` and
/// `/proc/PID/mem` are checked against the caller's credentials, not its
/// ptrace link).
pub struct TaskMemory {
    pid: Pid,
    mem: File,
}

impl TaskMemory {
    /// The task whose memory this is.
    pub fn pid(&self) -> i32 {
        self.pid.as_raw()
    }

    /// Writes `buf` at `addr`, as [`Tracee::write_mem_fast`].
    pub fn write(&self, addr: u64, buf: &[u8]) -> Result<()> {
        if write_direct(self.pid, addr, buf) {
            return Ok(());
        }
        write_forced(self.pid(), &self.mem, addr, buf)
    }
}

/// `process_vm_writev` of all of `buf` at `addr`: false when the mapping
/// refuses it (read-only, PROT_NONE) or the write comes out short.
fn write_direct(pid: Pid, addr: u64, buf: &[u8]) -> bool {
    let local = [std::io::IoSlice::new(buf)];
    let remote = [nix::sys::uio::RemoteIoVec {
        base: addr as usize,
        len: buf.len(),
    }];
    matches!(nix::sys::uio::process_vm_writev(pid, &local, &remote), Ok(n) if n == buf.len())
}

/// Writes through `/proc/PID/mem` (`mem`), which forces the write into
/// read-only private pages.
fn write_forced(pid: i32, mem: &File, addr: u64, buf: &[u8]) -> Result<()> {
    mem.write_all_at(buf, addr)
        .map_err(|source| ParasiteError::Mem {
            pid,
            op: "write",
            addr,
            len: buf.len(),
            source,
        })
}
