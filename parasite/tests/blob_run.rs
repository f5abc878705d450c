//! End-to-end proof that the embedded parasite blob works in a live process.
//!
//! A forked child sets up some state (blocked SIGUSR1,
//! a SA_RESTART SIGUSR2 handler, an armed ITIMER_REAL), reports its program break and sits in
//! `pause()`. The parent seizes it, infects it, runs `CMD_DUMP_MISC`, checks the
//! results, cures it and finally proves the child still works by signalling it after detaching.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use ckpt_parasite::Tracee;
use ckpt_parasite::proto::{ARGS_MAGIC, CMD_DUMP_MISC, NITIMERS, NSIG};
use libc::{c_int, pid_t};

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

    // Seize, load the parasite, run the command, cure, detach.
    let t = Tracee::seize(pid).expect("seize");
    let saved = t.regs().unwrap();
    assert_eq!(
        saved.orig_rax,
        libc::SYS_pause as u64,
        "child should be inside pause()"
    );
    let out;
    let base;
    {
        let inf = t.infect().expect("infect");
        base = inf.area().0;
        out = inf.call(CMD_DUMP_MISC).expect("CMD_DUMP_MISC");
        inf.cure().expect("cure");
    }
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        !maps.contains(&format!("{base:x}-")),
        "blob mapping still present"
    );
    t.detach().unwrap();

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
