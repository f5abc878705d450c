//! Getting the original pid: wait (bounded) while a zombie holds it, refuse
//! when a live process does.

use std::time::{Duration, Instant};

use crate::error::{RestoreError, Result};

/// Who holds a pid right now.
enum Holder {
    Free,
    Zombie,
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
        Some(s) if s.starts_with('Z') || s.starts_with('X') => Holder::Zombie,
        _ => Holder::Live(field("Name:").unwrap_or_default()),
    }
}

/// Returns once `pid` is free, printing one line through `notice` if it has
/// to wait for a zombie. Fails at once for a live holder, or after `wait`.
pub fn wait_free(pid: i32, wait: Duration, notice: &dyn Fn(&str)) -> Result<()> {
    let start = Instant::now();
    let mut told = false;
    loop {
        match holder(pid) {
            Holder::Free => return Ok(()),
            Holder::Live(comm) => return Err(RestoreError::PidInUse { pid, comm }),
            Holder::Zombie => {
                if start.elapsed() >= wait {
                    return Err(RestoreError::PidWaitTimeout {
                        pid,
                        secs: wait.as_secs_f64().ceil() as u64,
                    });
                }
                if !told {
                    notice(&format!(
                        "waiting for pid {pid} to be released (held by a zombie, up to {:.0} s)",
                        wait.saturating_sub(start.elapsed()).as_secs_f64().ceil()
                    ));
                    told = true;
                }
                std::thread::sleep(Duration::from_millis(50));
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
