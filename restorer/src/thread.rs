//! Recreating the process's other threads with their original tids: the
//! restored leader runs `clone3` (`set_tid`) from the scratch area with
//! clone tracing on, so each new thread is stopped before it runs any code;
//! it then gets its own registers (fs_base is its TLS), xstate, mask,
//! alternate stack, clear_child_tid, robust list, rseq, name and pending
//! signals, the last remote syscalls running in the thread itself.

use ckpt_image::task::Core;
use ckpt_parasite::Tracee;

use crate::error::{RestoreError, Result};
use crate::held::NewThreads;
use crate::{sched, task};
use ckpt_parasite::remote::Remote;

/// Flags of a pthread_create-style thread (the TLS comes with the registers).
const THREAD_FLAGS: u64 = (libc::CLONE_VM
    | libc::CLONE_FS
    | libc::CLONE_FILES
    | libc::CLONE_SIGHAND
    | libc::CLONE_THREAD
    | libc::CLONE_SYSVSEM) as u64;

/// Size of the `struct clone_args` prefix that ends with `set_tid_size`.
pub const CLONE_ARGS_SIZE: u64 = 80;

/// Creates every thread of `core.threads` inside the leader behind `r` and
/// sets its state and scheduling attributes (`notice`: what of them this
/// host cannot give), all signals still blocked; returns them stopped, to
/// be completed by [`finish`] (a failure on the way kills the process).
pub fn spawn(r: &Remote<'_>, core: &Core, notice: &dyn Fn(&str)) -> Result<NewThreads> {
    let tgid = r.t.pid();
    let mut out = NewThreads::new(tgid);
    if core.threads.is_empty() {
        return Ok(out);
    }
    r.t.trace_clones()?;
    for tc in &core.threads {
        let set_tid = r.put(1, &tc.tid.to_le_bytes())?;
        // flags, pidfd, child_tid, parent_tid, exit_signal, stack,
        // stack_size, tls, set_tid, set_tid_size. No stack: the thread never
        // runs on the leader's before its own registers are in place.
        let args = r.put_u64s(0, &[THREAD_FLAGS, 0, 0, 0, 0, 0, 0, 0, set_tid, 1])?;
        // Held at once: if a step below fails, the process dies before
        // this thread is let go.
        out.push(r.t.clone_at(
            r.base,
            args,
            CLONE_ARGS_SIZE,
            ckpt_parasite::NewTask::Thread,
        )?);
        let t = out.last().expect("just pushed");
        // In ckpt's own PID namespace the host tid is the one asked for
        // (clone3's set_tid gives it or fails); else its status says.
        if t.pid() != tc.tid && crate::pid::inner(t.pid())? != tc.tid {
            return Err(RestoreError::Host {
                pid: tgid,
                what: format!("thread {} came back as {}", tc.tid, t.pid()),
            });
        }
        let tr = Remote { t, base: r.base };
        // Its own state and its scheduling in one stop (2,000 threads).
        let mut calls = task::thread_state_calls(
            &tr,
            &task::ThreadOwn {
                altstack: tc.altstack.as_ref(),
                tid_address: tc.tid_address,
                robust_list: tc.robust_list.as_ref(),
                rseq: tc.rseq.as_ref(),
                comm: &tc.comm,
            },
        )?;
        match &tc.sched {
            Some(s) => {
                calls.extend(sched::thread_calls(&tr, tgid, tc.tid, s)?);
                sched::run_with(&tr, &calls, tgid, tc.tid, s, notice)?;
            }
            None => {
                tr.call_many(&calls)?;
            }
        }
        task::queue_pending(&tr, tgid, &tc.pending)?;
    }
    Ok(out)
}

/// Gives each thread from [`spawn`] its own blocked mask, registers and
/// xstate, once no remote syscall will run in it any more (its
/// credentials are set after `spawn`): with its mask in place a pending
/// signal (queued from the image, or a timer that fired) would stop a
/// remote syscall, and every remote syscall clobbers the registers.
/// Its pending SIGTRAPs are queued here, last (see [`task::queue_traps`]);
/// `leader` gives the scratch area the syscalls run from.
pub fn finish(leader: &Remote<'_>, threads: &[Tracee], core: &Core) -> Result<()> {
    let tgid = core.pid;
    for (t, tc) in threads.iter().zip(&core.threads) {
        task::queue_traps(
            &Remote {
                t,
                base: leader.base,
            },
            leader.t.pid(),
            &tc.pending,
        )?;
        let regs = tc.regs.as_ref().ok_or_else(|| {
            RestoreError::Image(ckpt_image::ImageError::Invalid {
                path: ckpt_image::core_name(tgid).into(),
                what: format!("thread {} has no registers", tc.tid),
            })
        })?;
        t.set_sigmask(tc.sigmask)?;
        t.set_regs(&ckpt_parasite::restart_regs(
            &task::regs_from_image(regs),
            false,
        ))?;
        t.set_xstate(&tc.xstate)?;
    }
    Ok(())
}
