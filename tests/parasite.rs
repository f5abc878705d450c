//! The parasite leaves a task byte-for-byte and register-for-register as it
//! was: infect a sleeping process, run blob commands and remote syscalls,
//! cure, and compare everything observable from outside.

use std::process::{Command, Stdio};
use std::time::Duration;

use ckpt_parasite::{Tracee, proto};

/// Readable, non-special mappings and their contents. The registered rseq
/// area is blanked: the kernel itself rewrites its cpu id fields whenever
/// the task returns to user space on another CPU.
fn snapshot_memory(t: &Tracee) -> Vec<(String, Vec<u8>)> {
    let rseq = t.rseq().unwrap();
    let (rs, re) = (
        rseq.rseq_abi_pointer,
        rseq.rseq_abi_pointer + u64::from(rseq.rseq_abi_size),
    );
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", t.pid())).unwrap();
    let mut out = Vec::new();
    for line in maps.lines() {
        if line.contains("[vvar") || line.contains("[vsyscall]") {
            continue;
        }
        let range = line.split_whitespace().next().unwrap();
        let (a, b) = range.split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let mut buf = vec![0u8; (b - a) as usize];
        t.read_mem(a, &mut buf).unwrap();
        if rs >= a && re <= b {
            buf[(rs - a) as usize..(re - a) as usize].fill(0);
        }
        out.push((line.to_string(), buf));
    }
    out
}

fn regs_tuple(r: &ckpt_parasite::Regs) -> Vec<u64> {
    vec![
        r.r15, r.r14, r.r13, r.r12, r.rbp, r.rbx, r.r11, r.r10, r.r9, r.r8, r.rax, r.rcx, r.rdx,
        r.rsi, r.rdi, r.orig_rax, r.rip, r.cs, r.eflags, r.rsp, r.ss, r.fs_base, r.gs_base,
    ]
}

/// Kills the victim even when an assertion fails.
struct Victim(std::process::Child);

impl Drop for Victim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A `sleep 1000` child, settled in its sleep.
fn sleeper() -> Victim {
    let child = Command::new("sleep")
        .arg("1000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    Victim(child)
}

#[test]
fn infect_and_cure_leaves_no_trace() {
    let child = sleeper();
    let pid = child.0.id() as i32;

    let t = Tracee::seize(pid).unwrap();
    let regs = t.regs().unwrap();
    let xstate = t.xstate().unwrap();
    let mask = t.sigmask().unwrap();
    let mem = snapshot_memory(&t);
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();

    {
        let inf = t.infect().unwrap();
        let (start, _) = inf.area();
        let during = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        assert!(
            during.contains(&format!("{start:x}-")),
            "parasite area not mapped"
        );
        // A remote syscall runs in the target's context.
        assert_eq!(
            inf.syscall("getpid", libc::SYS_getpid, [0; 6]).unwrap(),
            pid as u64
        );
        inf.call(proto::CMD_NONE).unwrap();
        let a = inf.call(proto::CMD_DUMP_MISC).unwrap();
        // sleep(1) has default dispositions except what the shell gave it;
        // SIGKILL is always SIG_DFL, and brk is inside the address space.
        assert_eq!(a.misc.sigactions[libc::SIGKILL as usize - 1].handler, 0);
        assert!(a.misc.brk > 0);
        inf.cure().unwrap();
    }

    assert_eq!(
        regs_tuple(&t.regs().unwrap()),
        regs_tuple(&regs),
        "registers changed"
    );
    assert_eq!(t.xstate().unwrap(), xstate, "xstate changed");
    assert_eq!(t.sigmask().unwrap(), mask, "signal mask changed");
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap(),
        maps,
        "memory map changed"
    );
    let after = snapshot_memory(&t);
    assert_eq!(mem.len(), after.len());
    for ((l1, m1), (_, m2)) in mem.iter().zip(&after) {
        assert!(m1 == m2, "memory of {l1} changed");
    }
    t.detach().unwrap();

    // Still alive and sleeping, not stopped or traced.
    std::thread::sleep(Duration::from_millis(100));
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.contains("State:\tS"), "{status}");
    assert!(status.contains("TracerPid:\t0"), "{status}");
    drop(child);
}

#[test]
fn seize_of_missing_pid_fails_cleanly() {
    let e = Tracee::seize(4_194_000).err().expect("must fail");
    assert!(e.to_string().contains("4194000"), "{e}");
}

/// Start of the task's first executable mapping (where a scratch area is
/// bootstrapped from).
fn first_code(pid: i32) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .find(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('x')))
        .and_then(|l| u64::from_str_radix(l.split('-').next()?, 16).ok())
        .unwrap()
}

#[test]
fn batched_remote_syscalls_run_in_order_and_stop_at_the_first_failure() {
    use ckpt_parasite::batch::Call;
    use ckpt_parasite::remote::Remote;

    let child = sleeper();
    let pid = child.0.id() as i32;
    let t = Tracee::seize(pid).unwrap();
    // Far from where a small PIE and its libraries live.
    let r = Remote::map(&t, first_code(pid), 0x1000_0000_0000).unwrap();

    // More calls than one table holds: every result, in order.
    let getpid = Call {
        name: "getpid",
        nr: libc::SYS_getpid,
        args: [0; 6],
    };
    let many = vec![getpid; 500];
    let got = r.call_many(&many).unwrap();
    assert_eq!(got.len(), 500);
    assert!(got.iter().all(|&p| p == pid as u64), "{got:?}");

    // A failure stops the batch: it is named, and what follows never runs.
    let probe: u64 = 0x2000_0000_0000;
    let after_failure = Call {
        name: "mmap",
        nr: libc::SYS_mmap,
        args: [
            probe,
            4096,
            libc::PROT_READ as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64,
            u64::MAX,
            0,
        ],
    };
    let failing = Call {
        name: "close(-1)",
        nr: libc::SYS_close,
        args: [u64::MAX, 0, 0, 0, 0, 0],
    };
    let e = r
        .call_many(&[getpid, failing, after_failure])
        .expect_err("close(-1) fails");
    assert!(e.to_string().contains("close(-1)"), "{e}");
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    assert!(
        !maps.contains(&format!("{probe:x}-")),
        "a call after the failed one ran:\n{maps}"
    );
    // The same mapping alone does run (the probe above was a fair one).
    assert_eq!(r.call_many(&[after_failure]).unwrap(), vec![probe]);
    drop(child);
}
