//! End-to-end proof that the embedded parasite blob works in a live process.
//!
//! Self-contained on purpose: it only uses `ckpt_parasite::{blob, proto}` and raw `libc`
//! ptrace, not the crate's injection API. A forked child sets up some state (blocked SIGUSR1,
//! a SA_RESTART SIGUSR2 handler, an armed ITIMER_REAL), reports its program break and sits in
//! `pause()`. The parent seizes it, runs `mmap` through a `syscall; int3` trampoline, loads
//! the relocated blob, runs `CMD_DUMP_MISC`, checks the results, removes every trace and
//! finally proves the child still works by signalling it after detaching.

use std::mem::{MaybeUninit, size_of};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use ckpt_parasite::blob::BLOB;
use ckpt_parasite::proto::{ARGS_MAGIC, Args, CMD_DUMP_MISC, NITIMERS, NSIG};
use libc::{c_int, c_long, c_uint, c_void, pid_t};

const PTRACE_EVENT_STOP: c_int = 128;
const SA_RESTORER: u64 = 0x0400_0000;
const ITIMER_SECS: i64 = 1000;

/// Write end of the report pipe, used by the child's SIGUSR2 handler.
static REPORT_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_sigusr2(_sig: c_int) {
    let b = b'!';
    // SAFETY: write(2) is async-signal-safe; the buffer is one valid byte.
    unsafe { libc::write(REPORT_FD.load(Ordering::Relaxed), (&raw const b).cast(), 1) };
}

/// Child body: only async-signal-safe libc calls (we forked from a multi-threaded process).
fn child_main(report_fd: c_int) -> ! {
    // SAFETY: plain libc calls on local, properly initialized arguments.
    unsafe {
        let mut set = MaybeUninit::<libc::sigset_t>::zeroed().assume_init();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR1);
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            libc::_exit(10);
        }

        let mut sa = MaybeUninit::<libc::sigaction>::zeroed().assume_init();
        sa.sa_sigaction = on_sigusr2 as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()) != 0 {
            libc::_exit(11);
        }

        let it = libc::itimerval {
            it_interval: libc::timeval {
                tv_sec: 0,
                tv_usec: 0,
            },
            it_value: libc::timeval {
                tv_sec: ITIMER_SECS,
                tv_usec: 0,
            },
        };
        if libc::setitimer(libc::ITIMER_REAL, &it, std::ptr::null_mut()) != 0 {
            libc::_exit(12);
        }

        // Report what the blob should find: program break and alternate signal stack (the
        // Rust runtime installs one on each of its threads; fork keeps it).
        let mut ss = MaybeUninit::<libc::stack_t>::zeroed().assume_init();
        if libc::sigaltstack(std::ptr::null(), &mut ss) != 0 {
            libc::_exit(13);
        }
        let report = [
            libc::sbrk(0) as u64,
            ss.ss_sp as u64,
            ss.ss_size as u64,
            ss.ss_flags as u64,
        ];
        if libc::write(report_fd, report.as_ptr().cast(), size_of_val(&report)) != 32 {
            libc::_exit(14);
        }
        loop {
            libc::pause();
        }
    }
}

/// Kills and reaps the child however the test ends.
struct ChildGuard(pid_t);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        // SAFETY: `self.0` is our own unreaped child, so the pid cannot have been reused.
        unsafe {
            libc::kill(self.0, libc::SIGKILL);
            libc::waitpid(self.0, std::ptr::null_mut(), libc::__WALL);
        }
    }
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// `ptrace` request without memory arguments (or with plain integer ones).
fn pt(req: c_uint, pid: pid_t, addr: u64, data: u64) -> c_long {
    // SAFETY: the requests used with this helper (SEIZE, INTERRUPT, CONT, DETACH, POKETEXT)
    // take integers in addr/data and do not touch our memory.
    unsafe { libc::ptrace(req, pid, addr as *mut c_void, data as *mut c_void) }
}

fn pt_ok(req: c_uint, pid: pid_t, addr: u64, data: u64) {
    assert_eq!(
        pt(req, pid, addr, data),
        0,
        "ptrace({req:#x}) failed: {}",
        errno()
    );
}

fn peek(pid: pid_t, addr: u64) -> u64 {
    // SAFETY: PEEKTEXT returns the word; errno is reset first so -1 data can be told apart.
    unsafe {
        *libc::__errno_location() = 0;
        let w = libc::ptrace(libc::PTRACE_PEEKTEXT, pid, addr as *mut c_void, 0usize);
        assert!(
            w != -1 || *libc::__errno_location() == 0,
            "PEEKTEXT: {}",
            errno()
        );
        w as u64
    }
}

fn getregs(pid: pid_t) -> libc::user_regs_struct {
    let mut regs = MaybeUninit::<libc::user_regs_struct>::zeroed();
    // SAFETY: GETREGS writes exactly one user_regs_struct to the pointer we pass.
    let r = unsafe { libc::ptrace(libc::PTRACE_GETREGS, pid, 0usize, regs.as_mut_ptr()) };
    assert_eq!(r, 0, "GETREGS: {}", errno());
    // SAFETY: zero-initialized and then filled by the kernel; all fields are integers.
    unsafe { regs.assume_init() }
}

fn setregs(pid: pid_t, regs: &libc::user_regs_struct) {
    // SAFETY: SETREGS only reads one user_regs_struct from the pointer we pass.
    let r = unsafe { libc::ptrace(libc::PTRACE_SETREGS, pid, 0usize, regs as *const _) };
    assert_eq!(r, 0, "SETREGS: {}", errno());
}

/// Waits (with a deadline) for the next stop of `pid` and returns the raw wait status.
fn wait_stop(pid: pid_t) -> c_int {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut status = 0;
        // SAFETY: `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL | libc::WNOHANG) };
        assert!(r >= 0, "waitpid: {}", errno());
        if r == pid {
            assert!(
                libc::WIFSTOPPED(status),
                "child did not stop: status {status:#x}"
            );
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for the child to stop"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Continues the tracee and expects the SIGTRAP of an `int3` (not a ptrace event).
fn cont_until_trap(pid: pid_t) -> libc::user_regs_struct {
    pt_ok(libc::PTRACE_CONT, pid, 0, 0);
    let status = wait_stop(pid);
    let regs = getregs(pid);
    assert!(
        libc::WSTOPSIG(status) == libc::SIGTRAP && status >> 16 == 0,
        "expected SIGTRAP from int3, got status {status:#x} (signal {}) at rip {:#x}",
        libc::WSTOPSIG(status),
        regs.rip
    );
    regs
}

/// Runs one syscall in the tracee through the `syscall; int3` trampoline at `tramp`.
fn remote_syscall(
    pid: pid_t,
    saved: &libc::user_regs_struct,
    tramp: u64,
    nr: c_long,
    a: [u64; 6],
) -> i64 {
    let mut r = *saved;
    r.rax = nr as u64;
    (r.rdi, r.rsi, r.rdx, r.r10, r.r8, r.r9) = (a[0], a[1], a[2], a[3], a[4], a[5]);
    r.orig_rax = u64::MAX; // not in a syscall: no restart of the interrupted pause()
    r.rip = tramp;
    setregs(pid, &r);
    let after = cont_until_trap(pid);
    assert_eq!(after.rip, tramp + 3, "trampoline trap at unexpected rip");
    after.rax as i64
}

fn remote_io(pid: pid_t, remote: u64, local: *mut c_void, len: usize, write: bool) {
    let liov = libc::iovec {
        iov_base: local,
        iov_len: len,
    };
    let riov = libc::iovec {
        iov_base: remote as *mut c_void,
        iov_len: len,
    };
    // SAFETY: `local` is valid for `len` bytes (reads for writev, writes for readv), as the
    // callers guarantee; the remote side is checked by the kernel.
    let n = unsafe {
        if write {
            libc::process_vm_writev(pid, &liov, 1, &riov, 1, 0)
        } else {
            libc::process_vm_readv(pid, &liov, 1, &riov, 1, 0)
        }
    };
    assert_eq!(
        n,
        len as isize,
        "process_vm_{}v: {}",
        if write { "write" } else { "read" },
        errno()
    );
}

/// Reads exactly `buf.len()` bytes from `fd` within 20 s.
fn read_with_timeout(fd: c_int, buf: &mut [u8]) {
    let mut got = 0;
    while got < buf.len() {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, 20_000) };
        assert!(
            r > 0,
            "timed out or failed reading from the child: {}",
            errno()
        );
        // SAFETY: the destination is the unfilled tail of `buf`.
        let n = unsafe { libc::read(fd, buf[got..].as_mut_ptr().cast(), buf.len() - got) };
        assert!(n > 0, "child pipe closed or failed: {}", errno());
        got += n as usize;
    }
}

fn proc_state(pid: pid_t) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    after.chars().next().expect("state")
}

/// Start of the first `r-xp` mapping of `pid`.
fn first_exec_mapping(pid: pid_t) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read maps");
    let line = maps
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("r-xp"))
        .expect("no r-xp mapping");
    u64::from_str_radix(line.split('-').next().unwrap(), 16).unwrap()
}

#[test]
fn dump_misc_in_live_child() {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid 2-element array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    REPORT_FD.store(fds[1], Ordering::Relaxed);

    // SAFETY: the child only runs async-signal-safe code (`child_main`) and never returns.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", errno());
    if pid == 0 {
        child_main(fds[1]);
    }
    let _guard = ChildGuard(pid);
    // SAFETY: closing our copy of the write end, which we own.
    unsafe { libc::close(fds[1]) };

    let mut report = [0u8; 32];
    read_with_timeout(fds[0], &mut report);
    let word = |i: usize| u64::from_ne_bytes(report[i * 8..i * 8 + 8].try_into().unwrap());
    let (child_brk, ss_sp, ss_size, ss_flags) = (word(0), word(1), word(2), word(3));
    let deadline = Instant::now() + Duration::from_secs(20);
    while proc_state(pid) != 'S' {
        assert!(
            Instant::now() < deadline,
            "child never went to sleep in pause()"
        );
        std::thread::sleep(Duration::from_millis(1));
    }

    // Seize and stop.
    pt_ok(libc::PTRACE_SEIZE, pid, 0, 0);
    pt_ok(libc::PTRACE_INTERRUPT, pid, 0, 0);
    let status = wait_stop(pid);
    assert_eq!(
        status >> 16,
        PTRACE_EVENT_STOP,
        "expected PTRACE_EVENT_STOP, status {status:#x}"
    );
    let saved = getregs(pid);
    assert_eq!(
        saved.orig_rax,
        libc::SYS_pause as u64,
        "child should be inside pause()"
    );

    // Plant `syscall; int3` at the start of the first executable mapping.
    let tramp = first_exec_mapping(pid);
    let orig_word = peek(pid, tramp);
    let tramp_word = (orig_word & !0xff_ffff) | 0xcc_050f;
    pt_ok(libc::PTRACE_POKETEXT, pid, tramp, tramp_word);

    // Remote mmap of the blob area, RWX.
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    let len = BLOB.mem_size.div_ceil(page) * page;
    let prot = (libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) as u64;
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    let base = remote_syscall(
        pid,
        &saved,
        tramp,
        libc::SYS_mmap,
        [0, len as u64, prot, flags, u64::MAX, 0],
    );
    assert!(
        base > 0 && base % page as i64 == 0,
        "remote mmap failed: {base}"
    );
    let base = base as u64;

    // Load the image and the argument block.
    let mut image = BLOB.relocated(base);
    remote_io(pid, base, image.as_mut_ptr().cast(), image.len(), true);
    let mut args = Args::new(CMD_DUMP_MISC);
    args.ret = 12345;
    let args_addr = base + BLOB.args_offset as u64;
    remote_io(
        pid,
        args_addr,
        (&raw mut args).cast(),
        size_of::<Args>(),
        true,
    );

    // Run the blob.
    let mut r = saved;
    r.rip = base + BLOB.entry as u64;
    r.orig_rax = u64::MAX;
    setregs(pid, &r);
    let after = cont_until_trap(pid);
    assert!(
        (base..base + BLOB.bytes.len() as u64).contains(&after.rip),
        "blob trapped outside its text: rip {:#x}, base {base:#x}",
        after.rip
    );
    assert_eq!(
        after.rsp,
        base + BLOB.stack_top as u64,
        "blob must run on its own stack"
    );

    let mut out = Args::zeroed();
    remote_io(
        pid,
        args_addr,
        (&raw mut out).cast(),
        size_of::<Args>(),
        false,
    );

    // Cure: unmap, restore the text word and the registers, detach.
    assert_eq!(
        remote_syscall(
            pid,
            &saved,
            tramp,
            libc::SYS_munmap,
            [base, len as u64, 0, 0, 0, 0]
        ),
        0
    );
    pt_ok(libc::PTRACE_POKETEXT, pid, tramp, orig_word);
    assert_eq!(peek(pid, tramp), orig_word);
    setregs(pid, &saved);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        !maps.contains(&format!("{base:x}-")),
        "blob mapping still present"
    );
    pt_ok(libc::PTRACE_DETACH, pid, 0, 0);

    // The child must be alive and working: its SIGUSR2 handler answers through the pipe.
    // SAFETY: signalling our own child.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGUSR2) }, 0);
    let mut bang = [0u8; 1];
    read_with_timeout(fds[0], &mut bang);
    assert_eq!(&bang, b"!");

    // Check what the blob reported.
    let m = &out.misc;
    assert_eq!(out.magic, ARGS_MAGIC);
    assert_eq!(out.cmd, CMD_DUMP_MISC);
    assert_eq!(out.ret, 0);
    assert_eq!(m.sigaction_ret, [0i64; NSIG]);
    let usr2 = m.sigactions[libc::SIGUSR2 as usize - 1];
    assert_eq!(usr2.handler, on_sigusr2 as *const () as usize as u64);
    let want = libc::SA_RESTART as u64 | SA_RESTORER;
    assert_eq!(usr2.flags & want, want, "SIGUSR2 flags {:#x}", usr2.flags);
    assert_ne!(usr2.restorer, 0);
    let usr1 = m.sigactions[libc::SIGUSR1 as usize - 1];
    assert_eq!(usr1.handler, libc::SIG_DFL as u64);
    assert_eq!(
        m.sigactions[libc::SIGKILL as usize - 1].handler,
        libc::SIG_DFL as u64
    );

    assert_eq!(m.itimer_ret, [0i64; NITIMERS]);
    let real = m.itimers[libc::ITIMER_REAL as usize];
    assert!(
        real.value.sec > 0 && real.value.sec <= ITIMER_SECS,
        "ITIMER_REAL {real:?}"
    );
    assert_eq!(real.interval.sec, 0);
    assert_eq!(m.itimers[libc::ITIMER_VIRTUAL as usize].value.sec, 0);

    assert_eq!(m.altstack_ret, 0);
    assert_eq!(m.altstack.sp, ss_sp);
    assert_eq!(m.altstack.size, ss_size);
    assert_eq!(m.altstack.flags as u64, ss_flags);
    assert_eq!(m.tid_address_ret, 0);
    assert_ne!(m.tid_address, 0);
    assert_eq!(m.brk, child_brk);

    // SAFETY: closing our read end.
    unsafe { libc::close(fds[0]) };
}
