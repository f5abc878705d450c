//! Freezing a process tree: the root and every descendant, each with all
//! its threads. A process is frozen before its children are listed, so
//! the list cannot grow behind ckpt's back.

use ckpt_parasite::{ParasiteError, Tracee};

use crate::blockers::Blockers;
use crate::error::{DumpError, Result};
use crate::procfile;
use crate::stopped;
use crate::thread;

/// One frozen process of the tree.
pub struct FrozenProcess {
    /// Its pid.
    pub pid: i32,
    /// Its parent's pid (the root's parent is outside the tree).
    pub ppid: i32,
    /// All its threads, the leader first (none for a zombie).
    pub tasks: Vec<Tracee>,
    /// For a zombie: its wait status (it cannot be traced, only recorded).
    pub zombie_status: Option<i32>,
    /// The job-control stop it was in when frozen (see [`stopped`]).
    pub job_stop: Option<ckpt_image::task::JobStop>,
    /// What it shares with its parent without being its thread (see
    /// [`crate::shared_tables`]).
    pub shared_with_parent: Option<ckpt_image::task::SharedWithParent>,
}

/// A live process, frozen: its threads and the stop it was in.
fn frozen(pid: i32, ppid: i32, tasks: Vec<Tracee>) -> Result<FrozenProcess> {
    let job_stop = stopped::collect(&tasks[0])?;
    if job_stop.is_some() {
        stopped::settle(&tasks)?;
    }
    Ok(FrozenProcess {
        pid,
        ppid,
        tasks,
        zombie_status: None,
        job_stop,
        shared_with_parent: None,
    })
}

/// `pid` still runs (or is stopped): not gone, not a zombie, not dying.
pub fn is_alive(pid: i32) -> bool {
    procfile::read(pid, "status").is_ok_and(|s| {
        procfile::status_field(&s, "State").is_some_and(|st| !st.starts_with(['Z', 'X']))
    })
}

/// The wait status of `pid` if it is a zombie.
fn zombie_status(pid: i32) -> Result<Option<i32>> {
    let status = procfile::read(pid, "status")?;
    if !procfile::status_field(&status, "State").is_some_and(|s| s.starts_with('Z')) {
        return Ok(None);
    }
    // Field 52 of stat: the exit code in waitpid() form.
    let f = procfile::stat_fields(pid)?;
    Ok(Some(
        f.get(procfile::stat_index(52)).copied().unwrap_or(0) as i32
    ))
}

/// Children of `pid`, as listed per thread in /proc.
fn children(pid: i32) -> Result<Vec<i32>> {
    let dir = procfile::path(pid, "task");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).map_err(|e| procfile::proc_err(pid, dir.clone(), e))? {
        let Some(tid) = e
            .ok()
            .and_then(|e| e.file_name().to_str().map(String::from))
        else {
            continue;
        };
        // A thread that exited meanwhile has no children to report.
        let list = procfile::read(pid, &format!("task/{tid}/children")).unwrap_or_default();
        out.extend(
            list.split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok()),
        );
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Freezes `root` and its descendants, parents before children. `check`
/// refuses a process this version cannot dump (called before seizing it):
/// for the root that ends the dump, a descendant it refuses is left alone
/// (with its own descendants) and recorded in `blockers`. `seize_err` maps
/// seize failures.
pub fn freeze(
    root: i32,
    check: impl Fn(i32) -> Result<()>,
    seize_err: impl Fn(i32, ParasiteError) -> DumpError,
    blockers: &mut Blockers,
) -> Result<Vec<FrozenProcess>> {
    check(root)?;
    let ppid = procfile::stat_fields(root)?
        .get(procfile::stat_index(4))
        .copied()
        .unwrap_or(0) as i32;
    let mut procs = vec![frozen(
        root,
        ppid,
        thread::freeze(root, |e| seize_err(root, e))?,
    )?];
    let mut i = 0;
    while i < procs.len() {
        let parent = procs[i].pid;
        for child in children(parent)? {
            if procs.iter().any(|p| p.pid == child) {
                continue;
            }
            // A zombie stays a zombie while its (frozen) parent cannot reap it.
            if let Some(status) = zombie_status(child)? {
                procs.push(FrozenProcess {
                    pid: child,
                    ppid: parent,
                    tasks: Vec::new(),
                    zombie_status: Some(status),
                    job_stop: None,
                    shared_with_parent: None,
                });
                continue;
            }
            if blockers.absorb(check(child))?.is_none() {
                continue;
            }
            procs.push(frozen(
                child,
                parent,
                thread::freeze(child, |e| seize_err(child, e))?,
            )?);
        }
        i += 1;
    }
    Ok(procs)
}
