//! SysV IPC objects of the job: shared memory segments, semaphore sets and
//! message queues, each saved once however many processes use it.
//!
//! Which objects belong to the job:
//! - a segment attached by any VMA of the tree (`VmaKind::SysvShm`);
//! - a semaphore set one of whose semaphores a process of the tree
//!   operated on last (`sempid`, `semctl(GETPID)`: set by `semop`,
//!   `SETVAL` and `SETALL`);
//! - a message queue a process of the tree sent to or received from last
//!   (`lspid`, `lrpid` of `/proc/sysvipc/msg`).
//!
//! SysV objects outlive their processes and belong to none; these pids are
//! the only links the kernel keeps between an object and a process. The
//! creator's uid is not enough: two jobs of one user (or everything root
//! ever created) would take each other's objects, and `--kill` would then
//! remove them. A set or queue created by one of the tree's users that no
//! process of the tree touched last is left out, with a line in the log,
//! when its last users are processes of the tree's users (another job of
//! theirs) or it was last used before the job started; when it was used
//! while the job ran by another user's process or one gone since, the
//! dump is refused by name instead (`unattributable`): another user could
//! touch a job's 0666 semaphore only to make the dump leave it out.
//!
//! `/proc/sysvipc` and the IPC syscalls see the caller's namespace: a tree
//! with an IPC namespace of its own is read from a thread entered into it
//! (`ns.rs`); a process in yet another IPC namespace is refused by name.
//!
//! Nothing may come back with more than the job's users had: an object
//! whose owner (uid, gid) is not a user or group of the tree's processes
//! is refused here, and checked again at restore.
//!
//! Nothing is consumed: segments are read through a read-only attach of
//! ckpt's own (so `shm_atime`, `shm_lpid` and `shm_nattch` move while it
//! is attached), semaphore values with `GETALL`, messages with
//! `msgrcv(MSG_COPY)`. SEM_UNDO adjustments of the processes are not
//! visible from outside and are not saved.

use ckpt_image::ipc::{
    Ipc, IpcPerm, MODE_BITS, MsgQueue, QueuedMessage, SemSet, ShmPages, ShmSegment,
};
use ckpt_image::mm::{Vma, VmaKind};
use ckpt_image::{ImageKind, ImageWriter, PAGE_SIZE};

use crate::error::{DumpError, Result};
use crate::procfile;
use crate::sys::{self, IpcKind};

/// `shm_perm.mode` bit: IPC_RMID was called, the segment goes with its
/// last detach.
const SHM_DEST: u32 = 0o1000;
/// `shm_perm.mode` bit: SHM_LOCK was applied.
const SHM_LOCKED: u32 = 0o2000;
/// Bytes copied per write from a segment to its image.
const COPY_CHUNK: usize = 4 << 20;

/// What the tree is, for choosing and checking its objects.
pub struct Tree<'a> {
    /// The root (named in errors about objects no single process holds).
    pub root: i32,
    /// Every live process with its VMAs.
    pub procs: Vec<(i32, &'a [Vma])>,
    /// Every uid of the tree's processes (real, effective, saved, fs).
    pub uids: Vec<u32>,
    /// Every gid of the tree's processes, supplementary groups included.
    pub gids: Vec<u32>,
}

impl Tree<'_> {
    fn has_pid(&self, pid: i32) -> bool {
        pid > 0 && self.procs.iter().any(|(p, _)| *p == pid)
    }
}

/// One attach of a segment by a process of the tree.
struct Attach<'a> {
    shmid: i32,
    pid: i32,
    vma: &'a Vma,
}

/// An object's id and key as listed in `/proc/sysvipc/*`.
#[derive(PartialEq, Eq)]
struct Listed {
    id: i32,
    key: i32,
}

/// One `/proc/sysvipc/*` table: column names and rows.
struct ProcTable {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl ProcTable {
    fn read(root: i32, name: &str) -> Result<Self> {
        let path = format!("/proc/sysvipc/{name}");
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            // A kernel without SysV IPC has no objects to save.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(procfile::proc_err(root, path.into(), e)),
        };
        let mut lines = text.lines();
        let header = lines
            .next()
            .unwrap_or("")
            .split_whitespace()
            .map(String::from)
            .collect();
        let rows = lines
            .map(|l| l.split_whitespace().map(String::from).collect())
            .collect();
        Ok(Self { header, rows })
    }

    /// Column `name` of `row` as a number (`perms` is octal).
    fn get(&self, root: i32, row: &[String], name: &str) -> Result<i64> {
        let bad = || DumpError::Parse {
            pid: root,
            path: "/proc/sysvipc".into(),
            what: format!("no number in column {name}"),
        };
        let i = self.header.iter().position(|h| h == name).ok_or_else(bad)?;
        let s = row.get(i).ok_or_else(bad)?;
        if name == "perms" {
            i64::from_str_radix(s, 8).map_err(|_| bad())
        } else {
            s.parse().map_err(|_| bad())
        }
    }

    fn perm(&self, root: i32, row: &[String], id_col: &str) -> Result<IpcPerm> {
        let g = |n| self.get(root, row, n);
        Ok(IpcPerm {
            key: g("key")? as i32,
            id: g(id_col)? as i32,
            uid: g("uid")? as u32,
            gid: g("gid")? as u32,
            cuid: g("cuid")? as u32,
            cgid: g("cgid")? as u32,
            mode: g("perms")? as u32,
        })
    }
}

/// Human name of an object, for errors and logs.
pub fn describe(kind: IpcKind, p: &IpcPerm) -> String {
    let what = match kind {
        IpcKind::Shm => "SysV shared memory segment",
        IpcKind::Sem => "SysV semaphore set",
        IpcKind::Msg => "SysV message queue",
    };
    format!("{what} id {} (key {:#x})", p.id, p.key as u32)
}

/// Collects every IPC object of the job (metadata and queued messages;
/// segment contents are read by [`write`]). Objects ckpt cannot save are
/// returned as "not supported" errors for the blocker list.
pub fn collect(tree: &Tree<'_>) -> Result<Ipc> {
    check_namespaces(tree)?;
    let mut ipc = Ipc::default();
    let mut refused = crate::blockers::Blockers::default();
    collect_shm(tree, &mut ipc, &mut refused)?;
    collect_sem(tree, &mut ipc, &mut refused)?;
    collect_msg(tree, &mut ipc, &mut refused)?;
    refused.into_result()?;
    for s in &ipc.shm {
        log::debug!(
            "ipc: {} ({} bytes)",
            describe(IpcKind::Shm, perm(&s.perm)),
            s.size
        );
    }
    for s in &ipc.sem {
        log::debug!(
            "ipc: {} ({} semaphores)",
            describe(IpcKind::Sem, perm(&s.perm)),
            s.values.len()
        );
    }
    for q in &ipc.msg {
        log::debug!(
            "ipc: {} ({} messages)",
            describe(IpcKind::Msg, perm(&q.perm)),
            q.messages.len()
        );
    }
    Ok(ipc)
}

fn perm(p: &Option<IpcPerm>) -> &IpcPerm {
    p.as_ref().expect("every collected object has its perm")
}

/// Every process must be in the IPC namespace this thread reads (ckpt's,
/// or the tree's own entered by `ns.rs`): others' objects cannot be seen
/// from here.
fn check_namespaces(tree: &Tree<'_>) -> Result<()> {
    let own = std::fs::read_link("/proc/thread-self/ns/ipc")
        .map_err(|e| procfile::proc_err(tree.root, "/proc/thread-self/ns/ipc".into(), e))?;
    let mut refused = crate::blockers::Blockers::default();
    for (pid, _) in &tree.procs {
        let ns = procfile::readlink(*pid, "ns/ipc")?;
        if std::path::Path::new(&ns) != own {
            refused.absorb::<()>(Err(DumpError::Unsupported {
                pid: *pid,
                what: format!("process in another IPC namespace ({ns}); IPC namespaces"),
            }))?;
        }
    }
    refused.into_result()
}

/// The object's owner must be a user and group of the tree.
fn check_owner(tree: &Tree<'_>, pid: i32, kind: IpcKind, p: &IpcPerm) -> Result<()> {
    if !tree.uids.contains(&p.uid) || !tree.gids.contains(&p.gid) {
        return Err(DumpError::Unsupported {
            pid,
            what: format!(
                "{} owned by uid {} gid {}, not a user and group of the tree",
                describe(kind, p),
                p.uid,
                p.gid
            ),
        });
    }
    Ok(())
}

/// Refuses an object of one of the tree's users that no process of the
/// tree used last, when it was used while the job ran (`used_at`, the
/// object's last operation time, not before the tree's root started) by a
/// process that is not provably another job of the same users: one of
/// another user (a 0666 object is open to anyone, who may touch it only to
/// make the dump leave it out) or one gone since (maybe the job's own,
/// exited). `last` are the pids the kernel recorded (0: never used).
/// Leaving such an object out would lose it silently, saving it might take
/// another job's: the dump is refused by name. Objects last used before
/// the job started (leftovers) are left out as before.
fn unattributable(
    tree: &Tree<'_>,
    kind: IpcKind,
    p: &IpcPerm,
    last: &[i32],
    used_at: i64,
) -> Option<DumpError> {
    if !tree.uids.contains(&p.cuid) && !tree.uids.contains(&p.uid) {
        return None;
    }
    if started_at(tree.root).is_none_or(|start| used_at < start) {
        return None;
    }
    let (pid, uid) = last
        .iter()
        .filter(|pid| **pid > 0)
        .map(|pid| (*pid, real_uid(*pid)))
        .find(|(_, uid)| !uid.is_some_and(|u| tree.uids.contains(&u)))?;
    let who = match uid {
        Some(uid) => format!("pid {pid} of uid {uid}, not a user of the tree"),
        None => format!("pid {pid}, gone since"),
    };
    Some(DumpError::Unsupported {
        pid: tree.root,
        what: format!(
            "{} of uid {}, used last while the job ran by {who}: whether the job uses it \
             cannot be told (remove it with ipcrm if it is not the job's; `ckpt run --ipcns` \
             gives a job objects of its own)",
            describe(kind, p),
            p.uid
        ),
    })
}

/// When process `pid` started, in seconds since the epoch (the unit of
/// the IPC tables' times), if it can be read.
fn started_at(pid: i32) -> Option<i64> {
    let stat = procfs::process::Process::new(pid).ok()?.stat().ok()?;
    let boot = procfs::boot_time_secs().ok()?;
    Some(boot as i64 + (stat.starttime / procfs::ticks_per_second()) as i64)
}

/// The real uid of process `pid`, if it still exists.
fn real_uid(pid: i32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn collect_shm(
    tree: &Tree<'_>,
    ipc: &mut Ipc,
    refused: &mut crate::blockers::Blockers,
) -> Result<()> {
    // Every attach of the tree, by segment id.
    let mut attached: Vec<Attach<'_>> = Vec::new();
    for (pid, vmas) in &tree.procs {
        for v in vmas.iter().filter(|v| v.kind == VmaKind::SysvShm as i32) {
            attached.push(Attach {
                shmid: v.sysv_shmid,
                pid: *pid,
                vma: v,
            });
        }
    }
    if attached.is_empty() {
        return Ok(());
    }
    let table = ProcTable::read(tree.root, "shm")?;
    for row in &table.rows {
        let p = table.perm(tree.root, row, "shmid")?;
        let Some(pid) = attached.iter().find(|a| a.shmid == p.id).map(|a| a.pid) else {
            continue;
        };
        let size = table.get(tree.root, row, "size")? as u64;
        let seg = ShmSegment {
            size,
            removed: p.mode & SHM_DEST != 0,
            locked: p.mode & SHM_LOCKED != 0,
            pages: Vec::new(),
            perm: Some(IpcPerm {
                mode: p.mode & MODE_BITS,
                ..p
            }),
        };
        refused.absorb(check_owner(tree, pid, IpcKind::Shm, &p))?;
        for a in attached.iter().filter(|a| a.shmid == p.id) {
            let v = a.vma;
            // An attach always maps the whole segment from offset 0; a
            // part of one (munmap or mprotect of a range) cannot be
            // recreated with shmat alone.
            if v.file_offset != 0 || v.len() != seg.mapped_len() {
                refused.absorb::<()>(Err(DumpError::Unsupported {
                    pid: a.pid,
                    what: format!(
                        "mapping {:#x}-{:#x}: part of {} (munmap or mprotect of a range of an attach)",
                        v.start,
                        v.end,
                        describe(IpcKind::Shm, &p)
                    ),
                }))?;
            }
        }
        ipc.shm.push(seg);
    }
    for Attach {
        shmid: id,
        pid,
        vma: v,
    } in &attached
    {
        if !ipc.shm.iter().any(|s| s.id() == *id) {
            refused.absorb::<()>(Err(DumpError::Unsupported {
                pid: *pid,
                what: format!(
                    "mapping {:#x}-{:#x}: SysV segment {id} not in /proc/sysvipc/shm",
                    v.start, v.end
                ),
            }))?;
        }
    }
    Ok(())
}

fn collect_sem(
    tree: &Tree<'_>,
    ipc: &mut Ipc,
    refused: &mut crate::blockers::Blockers,
) -> Result<()> {
    let table = ProcTable::read(tree.root, "sem")?;
    for row in &table.rows {
        let p = table.perm(tree.root, row, "semid")?;
        let nsems = table.get(tree.root, row, "nsems")? as usize;
        let os = |e| DumpError::Proc {
            pid: tree.root,
            path: format!("semctl of {}", describe(IpcKind::Sem, &p)).into(),
            source: e,
        };
        let sempids = (0..nsems as i32)
            .map(|n| sys::sem_getpid(p.id, n))
            .collect::<std::io::Result<Vec<_>>>()
            .map_err(os)?;
        if !sempids.iter().any(|pid| tree.has_pid(*pid)) {
            let otime = table.get(tree.root, row, "otime")?;
            if let Some(e) = unattributable(tree, IpcKind::Sem, &p, &sempids, otime) {
                refused.absorb::<()>(Err(e))?;
                continue;
            }
            if tree.uids.contains(&p.cuid) {
                log::info!(
                    "ipc: {} of uid {} not saved: no process of the tree operated on it last",
                    describe(IpcKind::Sem, &p),
                    p.cuid
                );
            }
            continue;
        }
        if refused
            .absorb(check_owner(tree, tree.root, IpcKind::Sem, &p))?
            .is_none()
        {
            continue;
        }
        let values = sys::sem_getall(p.id, nsems).map_err(os)?;
        ipc.sem.push(SemSet {
            values: values.into_iter().map(u32::from).collect(),
            sempids,
            perm: Some(IpcPerm {
                mode: p.mode & MODE_BITS,
                ..p
            }),
        });
    }
    Ok(())
}

fn collect_msg(
    tree: &Tree<'_>,
    ipc: &mut Ipc,
    refused: &mut crate::blockers::Blockers,
) -> Result<()> {
    let table = ProcTable::read(tree.root, "msg")?;
    let mut max_text = None;
    for row in &table.rows {
        let p = table.perm(tree.root, row, "msqid")?;
        let (lspid, lrpid) = (
            table.get(tree.root, row, "lspid")? as i32,
            table.get(tree.root, row, "lrpid")? as i32,
        );
        if !tree.has_pid(lspid) && !tree.has_pid(lrpid) {
            let used_at = table
                .get(tree.root, row, "stime")?
                .max(table.get(tree.root, row, "rtime")?);
            if let Some(e) = unattributable(tree, IpcKind::Msg, &p, &[lspid, lrpid], used_at) {
                refused.absorb::<()>(Err(e))?;
                continue;
            }
            if tree.uids.contains(&p.cuid) {
                log::info!(
                    "ipc: {} of uid {} not saved: no process of the tree used it last",
                    describe(IpcKind::Msg, &p),
                    p.cuid
                );
            }
            continue;
        }
        if refused
            .absorb(check_owner(tree, tree.root, IpcKind::Msg, &p))?
            .is_none()
        {
            continue;
        }
        let max_text = match max_text {
            Some(m) => m,
            None => *max_text.insert(kernel_limit(tree.root, "msgmax")? as usize),
        };
        let os = |e| DumpError::Proc {
            pid: tree.root,
            path: format!("msgctl of {}", describe(IpcKind::Msg, &p)).into(),
            source: e,
        };
        let qbytes = sys::msg_qbytes(p.id).map_err(os)?;
        let qnum = table.get(tree.root, row, "qnum")? as usize;
        let mut messages = Vec::with_capacity(qnum);
        for index in 0.. {
            let copied = sys::msg_copy(p.id, index, max_text).map_err(|e| {
                if e.raw_os_error() == Some(libc::ENOSYS) {
                    DumpError::Unsupported {
                        pid: tree.root,
                        what: format!(
                            "{}: reading messages without receiving them (kernel without CONFIG_CHECKPOINT_RESTORE)",
                            describe(IpcKind::Msg, &p)
                        ),
                    }
                } else {
                    os(e)
                }
            })?;
            let Some(m) = copied else { break };
            messages.push(QueuedMessage {
                mtype: m.mtype,
                text: m.text,
            });
        }
        ipc.msg.push(MsgQueue {
            qbytes,
            messages,
            perm: Some(IpcPerm {
                mode: p.mode & MODE_BITS,
                ..p
            }),
        });
    }
    Ok(())
}

/// A limit of `/proc/sys/kernel`.
fn kernel_limit(root: i32, name: &str) -> Result<u64> {
    let path = format!("/proc/sys/kernel/{name}");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| procfile::proc_err(root, path.clone().into(), e))?;
    text.trim().parse().map_err(|_| DumpError::Parse {
        pid: root,
        path,
        what: "not a number".into(),
    })
}

/// Writes each segment's pages (once, whoever attaches it) into
/// `ipc-shm-ID.img` and then `ipc.img`. Only pages the segment holds are
/// saved (see [`sys::ShmAttach::present_pages`]); holes come back as
/// holes. Returns the bytes of segment data written.
pub fn write(root: i32, w: &mut ImageWriter, ipc: &mut Ipc) -> Result<u64> {
    let mut total = 0;
    for seg in &mut ipc.shm {
        let id = seg.id();
        let os = |e| DumpError::Proc {
            pid: root,
            path: format!("attach of SysV segment {id}").into(),
            source: e,
        };
        let attach = sys::ShmAttach::new(id, seg.mapped_len() as usize).map_err(os)?;
        let present = attach.present_pages().map_err(os)?;
        let pw = w.pages(&ckpt_image::shm_data_name(id))?;
        let bytes = attach.bytes();
        let mut file_offset = 0u64;
        let mut page = 0usize;
        while page < present.len() {
            if !present[page] {
                page += 1;
                continue;
            }
            let run = present[page..].iter().take_while(|p| **p).count();
            let (from, len) = (page * PAGE_SIZE as usize, run * PAGE_SIZE as usize);
            for chunk in bytes[from..from + len].chunks(COPY_CHUNK) {
                pw.write_at(file_offset, chunk)?;
                file_offset += chunk.len() as u64;
            }
            seg.pages.push(ShmPages {
                offset: from as u64,
                nr_pages: run as u64,
            });
            page += run;
        }
        w.finish_pages(pw)?;
        log::info!(
            "write ipc: SysV segment {id}: {file_offset} of {} bytes saved",
            seg.size
        );
        total += file_offset;
    }
    w.write_meta(ckpt_image::IPC_NAME, ImageKind::Ipc, ipc)?;
    Ok(total)
}

/// Removes the saved objects once the job is killed: they are in the
/// checkpoint, and left behind they would collide with its restore. An
/// object whose id now has another key is left alone.
pub fn remove(root: i32, ipc: &Ipc) {
    let live = |name, col| -> Vec<Listed> {
        ProcTable::read(root, name)
            .map(|t| {
                t.rows
                    .iter()
                    .filter_map(|r| {
                        Some(Listed {
                            id: t.get(root, r, col).ok()? as i32,
                            key: t.get(root, r, "key").ok()? as i32,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let objects = [
        (
            IpcKind::Shm,
            live("shm", "shmid"),
            ipc.shm.iter().map(|s| perm(&s.perm)).collect::<Vec<_>>(),
        ),
        (
            IpcKind::Sem,
            live("sem", "semid"),
            ipc.sem.iter().map(|s| perm(&s.perm)).collect(),
        ),
        (
            IpcKind::Msg,
            live("msg", "msqid"),
            ipc.msg.iter().map(|s| perm(&s.perm)).collect(),
        ),
    ];
    for (kind, live, saved) in objects {
        for p in saved {
            if live.contains(&Listed {
                id: p.id,
                key: p.key,
            }) {
                match sys::ipc_rmid(kind, p.id) {
                    Ok(()) => log::info!("kill: removed {}", describe(kind, p)),
                    Err(e) => log::warn!("kill: cannot remove {}: {e}", describe(kind, p)),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A private segment of this test process, removed on drop.
    struct Segment(i32);

    impl Drop for Segment {
        fn drop(&mut self) {
            let _ = sys::ipc_rmid(IpcKind::Shm, self.0);
        }
    }

    #[test]
    fn attach_is_classified_and_only_written_pages_are_present() {
        const PAGES: usize = 16;
        let len = PAGES * PAGE_SIZE as usize;
        // SAFETY: integers only.
        let id = unsafe { libc::shmget(libc::IPC_PRIVATE, len, libc::IPC_CREAT | 0o600) };
        assert!(id >= 0, "shmget: {}", std::io::Error::last_os_error());
        let seg = Segment(id);
        // SAFETY: a new attach placed by the kernel.
        let at = unsafe { libc::shmat(seg.0, std::ptr::null(), 0) } as *mut u8;
        assert_ne!(at as isize, -1);
        for page in [1, 2, 9] {
            // SAFETY: inside the attach made above.
            unsafe { at.add(page * PAGE_SIZE as usize).write_volatile(page as u8) };
        }
        let vmas = crate::mm::collect_vmas(std::process::id() as i32).unwrap();
        let v = vmas
            .iter()
            .find(|v| v.start == at as u64)
            .expect("the attach is listed");
        assert_eq!(v.kind, VmaKind::SysvShm as i32);
        assert_eq!((v.sysv_shmid, v.file_offset, v.len()), (id, 0, len as u64));

        let mine = sys::ShmAttach::new(id, len).unwrap();
        let present = mine.present_pages().unwrap();
        let want: Vec<bool> = (0..PAGES).map(|p| [1, 2, 9].contains(&p)).collect();
        assert_eq!(present, want);
        assert_eq!(mine.bytes()[9 * PAGE_SIZE as usize], 9);
        drop(mine);

        let table = ProcTable::read(0, "shm").unwrap();
        let row = table
            .rows
            .iter()
            .find(|r| table.get(0, r, "shmid").ok() == Some(i64::from(id)))
            .expect("listed in /proc/sysvipc/shm");
        let p = table.perm(0, row, "shmid").unwrap();
        assert_eq!((p.key, p.mode & MODE_BITS), (0, 0o600));
        assert_eq!(table.get(0, row, "size").unwrap(), len as i64);
        // SAFETY: detaches the attach made above.
        unsafe { libc::shmdt(at.cast()) };
    }
}
