//! What /proc says about a process or its threads.

use super::*;

pub fn pid_exists(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

pub fn proc_status(pid: i32) -> Option<String> {
    fs::read_to_string(format!("/proc/{pid}/status")).ok()
}

/// Value of a `/proc/PID/status` field, e.g. `status_field(pid, "State")`.
pub fn status_field(pid: i32, field: &str) -> Option<String> {
    let status = proc_status(pid)?;
    status.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    })
}

/// Single-letter process state (R, S, D, T, t, Z, ...).
pub fn proc_state(pid: i32) -> Option<char> {
    status_field(pid, "State").and_then(|s| s.chars().next())
}

pub fn tracer_pid(pid: i32) -> Option<i32> {
    status_field(pid, "TracerPid").and_then(|s| s.parse().ok())
}

pub fn ppid_of(pid: i32) -> Option<i32> {
    status_field(pid, "PPid").and_then(|s| s.parse().ok())
}

/// Signal mask fields of /proc/PID/status (SigPnd, ShdPnd, SigBlk, ...).
pub fn sig_mask_field(pid: i32, field: &str) -> Option<u64> {
    status_field(pid, field).and_then(|s| u64::from_str_radix(&s, 16).ok())
}

pub fn exe_of(pid: i32) -> Option<PathBuf> {
    fs::read_link(format!("/proc/{pid}/exe")).ok()
}

pub fn cmdline_of(pid: i32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

/// Asserts the process exists, is neither stopped nor traced, and is not a
/// zombie: what "untouched" means after a failed dump.
pub fn assert_running_untouched(pid: i32, context: &str) {
    let state = proc_state(pid);
    assert!(
        matches!(state, Some('R' | 'S' | 'D')),
        "{context}: pid {pid} should be running, state is {state:?}"
    );
    assert_eq!(
        tracer_pid(pid),
        Some(0),
        "{context}: pid {pid} is still traced (TracerPid)"
    );
}

/// A pid that is not in use now (counting down from pid_max).
pub fn unused_pid() -> i32 {
    let max: i32 = fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(32768);
    (2..max)
        .rev()
        .find(|p| !pid_exists(*p))
        .expect("no free pid")
}

/// True once nothing runs as `pid` any more, or only a process that has
/// nothing to do with this test (pid reuse): a zombie or anything running
/// the victim binary or naming the work dir counts as still there.
pub fn victim_gone(pid: i32, bin: &Path, work: &Path) -> bool {
    if !pid_exists(pid) {
        return true;
    }
    let zombie = proc_state(pid) == Some('Z');
    !zombie && !is_our_victim(pid, bin, work)
}

pub(crate) fn is_our_victim(pid: i32, bin: &Path, work: &Path) -> bool {
    let work = work.to_string_lossy();
    cmdline_of(pid).contains(work.as_ref()) || exe_of(pid).as_deref() == Some(bin)
}

/// For every thread of `pid` (by tid, sorted): the lines of its
/// `/proc/PID/task/TID/status` that start with one of `fields`.
pub fn thread_status_lines(pid: i32, fields: &[&str]) -> Vec<(String, Vec<String>)> {
    let mut tids: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    tids.sort();
    tids.into_iter()
        .map(|tid| {
            let status = read_to_string_lossy(Path::new(&format!("/proc/{pid}/task/{tid}/status")));
            let lines = status
                .lines()
                .filter(|l| fields.iter().any(|f| l.starts_with(f)))
                .map(str::to_string)
                .collect();
            (tid, lines)
        })
        .collect()
}

/// Host pids of `host` and its descendants, parents first.
pub fn host_tree_of(host: i32) -> Vec<i32> {
    let mut out = vec![host];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        let kids =
            std::fs::read_to_string(format!("/proc/{p}/task/{p}/children")).unwrap_or_default();
        out.extend(kids.split_whitespace().map(|k| k.parse::<i32>().unwrap()));
        i += 1;
    }
    out
}
