//! Getting the original pid: wait (bounded) while a zombie or an exiting
//! process holds it (`dump --kill` returns once its tree is exiting, while
//! the kernel still frees its memory), refuse when a live process does.

use std::time::{Duration, Instant};

use crate::error::{RestoreError, Result};

/// Who holds a pid right now.
enum Holder {
    Free,
    /// A zombie, or a process that has started to exit.
    Leaving,
    Live(String),
}

fn holder(pid: i32) -> Holder {
    let path = format!("/proc/{pid}/status");
    let Ok(status) = ckpt_parasite::proc_read::read_string(std::path::Path::new(&path)) else {
        return Holder::Free;
    };
    let field = |k: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(k).map(|v| v.trim().to_string()))
    };
    match field("State:") {
        Some(s) if s.starts_with('Z') || s.starts_with('X') => Holder::Leaving,
        _ if ckpt_parasite::proc_read::leaving(pid) => Holder::Leaving,
        _ => Holder::Live(field("Name:").unwrap_or_default()),
    }
}

/// Returns once `pid` is free, printing one line through `notice` if it has
/// to wait for a zombie or an exiting process. Fails at once for a live
/// holder, or after `wait`.
pub fn wait_free(pid: i32, wait: Duration, notice: &dyn Fn(&str)) -> Result<()> {
    let start = Instant::now();
    let mut told = false;
    loop {
        match holder(pid) {
            Holder::Free => return Ok(()),
            Holder::Live(comm) => return Err(RestoreError::PidInUse { pid, comm }),
            Holder::Leaving => {
                if start.elapsed() >= wait {
                    return Err(RestoreError::PidWaitTimeout {
                        pid,
                        secs: wait.as_secs_f64().ceil() as u64,
                    });
                }
                if !told {
                    notice(&format!(
                        "waiting for pid {pid} to be released (held by a zombie or an exiting process, up to {:.0} s)",
                        wait.saturating_sub(start.elapsed()).as_secs_f64().ceil()
                    ));
                    told = true;
                }
                // An exiting holder is gone within milliseconds.
                std::thread::sleep(Duration::from_millis(5));
            }
        }
    }
}

/// The pid host process (or thread) `host` has in its own PID namespace:
/// the last NSpid entry of its status (itself in ckpt's namespace).
pub fn inner(host: i32) -> Result<i32> {
    let path = format!("/proc/{host}/status");
    let status = ckpt_parasite::proc_read::read_string(std::path::Path::new(&path))
        .map_err(|e| RestoreError::os(host, "read status", e))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .and_then(|v| v.split_whitespace().last()?.parse().ok())
        .ok_or_else(|| RestoreError::Host {
            pid: host,
            what: format!("no NSpid in {path}"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::ptrace;
    use nix::sys::signal::Signal;
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    use nix::unistd::{ForkResult, fork};
    use std::io::Read;
    use std::os::fd::AsRawFd;

    /// A PID namespace's init killed while ckpt's test traces its child
    /// exits only once that child is reaped: meanwhile it holds its pid
    /// while exiting (as a killed tree does while its memory is freed),
    /// which is waited for, not refused as a live holder; once it is gone
    /// the pid is free.
    #[test]
    fn an_exiting_holder_is_waited_for() {
        let (r, w) = nix::unistd::pipe().unwrap();
        // SAFETY: the child makes only async-signal-safe calls (below).
        let helper = match unsafe { fork() }.expect("fork") {
            // SAFETY: unshare, fork, write, waitpid, pause and _exit, all
            // async-signal-safe, on a buffer and fd that stay valid.
            ForkResult::Child => unsafe {
                if libc::unshare(libc::CLONE_NEWPID) != 0 {
                    libc::_exit(1);
                }
                let init = libc::fork();
                if init == 0 {
                    // The namespace's init, with one child.
                    if libc::fork() == 0 {
                        loop {
                            libc::pause();
                        }
                    }
                    loop {
                        libc::pause();
                    }
                }
                let bytes = init.to_ne_bytes();
                libc::write(w.as_raw_fd(), bytes.as_ptr().cast(), bytes.len());
                libc::waitpid(init, std::ptr::null_mut(), 0);
                libc::_exit(0)
            },
            ForkResult::Parent { child } => child,
        };
        drop(w);
        let mut bytes = [0u8; 4];
        std::fs::File::from(r).read_exact(&mut bytes).unwrap();
        let init = i32::from_ne_bytes(bytes);
        let children = format!("/proc/{init}/task/{init}/children");
        let until = Instant::now() + Duration::from_secs(10);
        let grandchild = loop {
            let listed = std::fs::read_to_string(&children).unwrap_or_default();
            if let Some(c) = listed.split_whitespace().next() {
                break nix::unistd::Pid::from_raw(c.parse().unwrap());
            }
            assert!(Instant::now() < until, "the init never forked");
            std::thread::sleep(Duration::from_millis(1));
        };
        ptrace::seize(grandchild, ptrace::Options::empty()).unwrap();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(init), Signal::SIGKILL).unwrap();
        while !ckpt_parasite::proc_read::leaving(init) {
            assert!(Instant::now() < until, "the killed init never exited");
            std::thread::sleep(Duration::from_millis(1));
        }
        let waited = wait_free(init, Duration::from_millis(30), &|_| {});
        assert!(
            matches!(waited, Err(RestoreError::PidWaitTimeout { .. })),
            "{waited:?}"
        );
        // Reaping the traced child lets the init finish.
        assert!(matches!(
            waitpid(grandchild, Some(WaitPidFlag::__WALL)),
            Ok(WaitStatus::Signaled(_, Signal::SIGKILL, _))
        ));
        wait_free(init, Duration::from_secs(10), &|_| {}).unwrap();
        assert!(matches!(
            waitpid(helper, None),
            Ok(WaitStatus::Exited(_, 0))
        ));
    }

    /// A running process is no exiting one.
    #[test]
    fn a_live_holder_is_refused() {
        let me = std::process::id() as i32;
        assert!(matches!(
            wait_free(me, Duration::from_secs(1), &|_| {}),
            Err(RestoreError::PidInUse { .. })
        ));
    }
}
