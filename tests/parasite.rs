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

#[test]
fn infect_and_cure_leaves_no_trace() {
    let child = Command::new("sleep")
        .arg("1000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child = Victim(child);
    let pid = child.0.id() as i32;
    std::thread::sleep(Duration::from_millis(200));

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
