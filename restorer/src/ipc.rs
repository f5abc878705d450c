//! Recreating the job's SysV IPC objects (see `dumper/src/ipc.rs` for
//! which objects those are) with their original ids and keys, before any
//! process is created, and attaching segments in the restored processes.
//!
//! Every object is checked before anything is created: its owner must be a
//! user and group of the dumped processes (from the sealed manifest and
//! core images), sizes and counts within this kernel's limits, and neither
//! its id nor its key may be in use here. Objects are created by the
//! restorer (root) with mode 0600, filled, and given their owner and mode
//! last (`IPC_SET`). The id comes back by writing it to
//! `/proc/sys/kernel/{shm,sem,msg}_next_id` right before the `*get`, and is
//! checked. If the restore fails, or the stopped tree is dropped, every
//! object created is removed again; if the restorer is killed before the
//! tree runs, a keeper process it forked removes them (`sys::IpcKeeper`).

use std::os::unix::fs::FileExt;

use ckpt_image::ipc::{Ipc, IpcPerm, MODE_BITS, ShmSegment};
use ckpt_image::mm::{Vma, prot};
use ckpt_image::{ImageDir, ImageError, ImageKind, PAGE_SIZE};
use ckpt_parasite::remote::Remote;

use crate::error::{RestoreError, Result};
use crate::sys::{self, IpcKind, IpcOwner};

/// The largest semaphore value (SEMVMX).
const SEM_VALUE_MAX: u32 = 32767;
/// `shmat` flag: attach read-only.
const SHM_RDONLY: u64 = 0o10000;
/// `shmat` flag: attach executable.
const SHM_EXEC: u64 = 0o100000;

/// Human name of an object, for errors and logs.
fn describe(kind: IpcKind, p: &IpcPerm) -> String {
    let what = match kind {
        IpcKind::Shm => "SysV shared memory segment",
        IpcKind::Sem => "SysV semaphore set",
        IpcKind::Msg => "SysV message queue",
    };
    format!("{what} id {} (key {:#x})", p.id, p.key as u32)
}

fn refuse(kind: IpcKind, p: &IpcPerm, what: impl Into<String>) -> RestoreError {
    RestoreError::Ipc {
        object: describe(kind, p),
        what: what.into(),
    }
}

/// Who the dumped processes were: an object may only be owned by them.
pub struct Owners {
    /// Every uid of the dumped processes.
    pub uids: Vec<u32>,
    /// Every gid, supplementary groups included.
    pub gids: Vec<u32>,
}

/// Reads `ipc.img` if the checkpoint has one, and checks it: owners,
/// limits, unique ids, segment images, and that every attach of `vmas`
/// names a segment of it with the segment's size.
pub fn load(images: &ImageDir, owners: &Owners, vmas: &[(i32, &[Vma])]) -> Result<Ipc> {
    let ipc: Ipc = match images.digest(ckpt_image::IPC_NAME) {
        Ok(_) => images.read_meta(ckpt_image::IPC_NAME, ImageKind::Ipc)?,
        Err(ImageError::NotListed { .. }) => Ipc::default(),
        Err(e) => return Err(e.into()),
    };
    let check = Check { images };
    check.perms(&ipc, owners)?;
    if !ipc.shm.is_empty() {
        let shmmax = kernel_limit("shmmax")?;
        for s in &ipc.shm {
            check_segment(images, s, shmmax)?;
        }
    }
    check.semaphores(&ipc)?;
    check.queues(&ipc)?;
    check_attaches(&ipc, vmas)?;
    Ok(ipc)
}

/// The checks of `ipc.img` of one checkpoint.
struct Check<'i> {
    images: &'i ImageDir,
}

impl Check<'_> {
    /// An error naming `ipc.img`.
    fn invalid(&self, what: String) -> RestoreError {
        RestoreError::Image(ImageError::Invalid {
            path: self.images.path().join(ckpt_image::IPC_NAME),
            what,
        })
    }

    /// An object's key, id and owner, which every object must have.
    fn perm(&self, p: &Option<IpcPerm>) -> Result<IpcPerm> {
        p.ok_or_else(|| self.invalid("an object without key, id and owner".into()))
    }

    /// Per kind, ids and keys unique, modes valid, owners among the
    /// dumped processes' ids.
    fn perms(&self, ipc: &Ipc, owners: &Owners) -> Result<()> {
        let kinds = [
            (
                IpcKind::Shm,
                ipc.shm
                    .iter()
                    .map(|s| self.perm(&s.perm))
                    .collect::<Result<Vec<_>>>()?,
            ),
            (
                IpcKind::Sem,
                ipc.sem
                    .iter()
                    .map(|s| self.perm(&s.perm))
                    .collect::<Result<Vec<_>>>()?,
            ),
            (
                IpcKind::Msg,
                ipc.msg
                    .iter()
                    .map(|s| self.perm(&s.perm))
                    .collect::<Result<Vec<_>>>()?,
            ),
        ];
        for (kind, perms) in &kinds {
            for (i, p) in perms.iter().enumerate() {
                if perms[..i]
                    .iter()
                    .any(|q| q.id == p.id || (p.key != 0 && q.key == p.key))
                {
                    return Err(self.invalid(format!("{} listed twice", describe(*kind, p))));
                }
                if p.id < 0 || p.mode & !MODE_BITS != 0 {
                    return Err(self.invalid(format!("{}: bad id or mode", describe(*kind, p))));
                }
                if !owners.uids.contains(&p.uid) || !owners.gids.contains(&p.gid) {
                    return Err(refuse(
                        *kind,
                        p,
                        format!(
                            "owned by uid {} gid {}, which none of the dumped processes had; refused",
                            p.uid, p.gid
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Semaphore sets within this kernel's SEMMSL, values within range.
    fn semaphores(&self, ipc: &Ipc) -> Result<()> {
        if ipc.sem.is_empty() {
            return Ok(());
        }
        // SEMMSL is the first of the four numbers of /proc/sys/kernel/sem.
        let semmsl = kernel_limit("sem")?;
        for s in &ipc.sem {
            let p = self.perm(&s.perm)?;
            if s.values.is_empty() || s.values.len() as u64 > semmsl {
                return Err(refuse(
                    IpcKind::Sem,
                    &p,
                    format!(
                        "{} semaphores; this kernel allows 1 to {semmsl}",
                        s.values.len()
                    ),
                ));
            }
            if s.values.iter().any(|v| *v > SEM_VALUE_MAX) {
                return Err(self.invalid(format!(
                    "{}: value above {SEM_VALUE_MAX}",
                    describe(IpcKind::Sem, &p)
                )));
            }
        }
        Ok(())
    }

    /// Message queues within this kernel's limits and their own.
    fn queues(&self, ipc: &Ipc) -> Result<()> {
        if ipc.msg.is_empty() {
            return Ok(());
        }
        let (msgmax, msgmnb) = (kernel_limit("msgmax")?, kernel_limit("msgmnb")?);
        for q in &ipc.msg {
            let p = self.perm(&q.perm)?;
            // Only CAP_SYS_RESOURCE raises a queue above msgmnb: an owner
            // other than root cannot have had more.
            if q.qbytes > msgmnb && p.uid != 0 {
                return Err(refuse(
                    IpcKind::Msg,
                    &p,
                    format!(
                        "limit {} bytes above this kernel's msgmnb {msgmnb}",
                        q.qbytes
                    ),
                ));
            }
            let mut total = 0u64;
            for m in &q.messages {
                if m.mtype <= 0 || m.text.len() as u64 > msgmax {
                    return Err(refuse(
                        IpcKind::Msg,
                        &p,
                        format!(
                            "a message of type {} and {} bytes (msgmax {msgmax})",
                            m.mtype,
                            m.text.len()
                        ),
                    ));
                }
                total += m.text.len() as u64;
            }
            if total > q.qbytes {
                return Err(self.invalid(format!(
                    "{}: more bytes queued than its limit",
                    describe(IpcKind::Msg, &p)
                )));
            }
        }
        Ok(())
    }
}

/// Every attach of `vmas` names a segment of `ipc` with the segment's size.
fn check_attaches(ipc: &Ipc, vmas: &[(i32, &[Vma])]) -> Result<()> {
    for (pid, vmas) in vmas {
        for v in vmas
            .iter()
            .filter(|v| v.kind == ckpt_image::mm::VmaKind::SysvShm as i32)
        {
            let seg = ipc.shm.iter().find(|s| s.id() == v.sysv_shmid);
            if seg.is_none_or(|s| s.mapped_len() != v.len() || v.file_offset != 0) {
                return Err(RestoreError::vma(
                    *pid,
                    v,
                    &format!(
                        "attach of SysV segment {} that ipc.img does not hold whole",
                        v.sysv_shmid
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A segment's size is within shmmax and its saved pages within the
/// segment, back to back in an image of exactly their size.
fn check_segment(images: &ImageDir, s: &ShmSegment, shmmax: u64) -> Result<()> {
    let p = s.perm.expect("checked by load");
    if s.size == 0 || s.size > shmmax {
        return Err(refuse(
            IpcKind::Shm,
            &p,
            format!(
                "{} bytes; this kernel allows 1 to {shmmax} (shmmax)",
                s.size
            ),
        ));
    }
    let name = ckpt_image::shm_data_name(p.id);
    let bad = |what: &str| {
        RestoreError::Image(ImageError::Invalid {
            path: images.path().join(&name),
            what: what.into(),
        })
    };
    let mut end = 0u64;
    for r in &s.pages {
        let len = r
            .nr_pages
            .checked_mul(PAGE_SIZE)
            .ok_or_else(|| bad("run too long"))?;
        if r.offset % PAGE_SIZE != 0
            || r.offset < end
            || r.offset.saturating_add(len) > s.mapped_len()
        {
            return Err(bad("saved pages out of order or outside the segment"));
        }
        end = r.offset + len;
    }
    if images.digest(&name)?.size != s.saved_bytes() {
        return Err(bad("size is not that of the saved pages"));
    }
    Ok(())
}

/// A number of `/proc/sys/kernel/NAME` (the first, for `sem`).
fn kernel_limit(name: &str) -> Result<u64> {
    let path = format!("/proc/sys/kernel/{name}");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| RestoreError::os(0, format!("read {path}"), e))?;
    text.split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .ok_or_else(|| {
            RestoreError::os(
                0,
                format!("read {path}"),
                std::io::Error::other("not a number"),
            )
        })
}

/// An object of this IPC namespace.
struct InUse {
    id: i32,
    key: i32,
}

/// Ids and keys in use in this IPC namespace, from `/proc/sysvipc/NAME`.
fn in_use(name: &str) -> Result<Vec<InUse>> {
    let path = format!("/proc/sysvipc/{name}");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| RestoreError::os(0, format!("read {path}"), e))?;
    Ok(text
        .lines()
        .skip(1)
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let key = f.next()?.parse().ok()?;
            let id = f.next()?.parse().ok()?;
            Some(InUse { id, key })
        })
        .collect())
}

/// Every object must get its id and key back: none may be in use here.
pub fn check_free(ipc: &Ipc) -> Result<()> {
    let kinds = [
        (
            IpcKind::Shm,
            "shm",
            ipc.shm.iter().filter_map(|s| s.perm).collect::<Vec<_>>(),
            "-m",
        ),
        (
            IpcKind::Sem,
            "sem",
            ipc.sem.iter().filter_map(|s| s.perm).collect(),
            "-s",
        ),
        (
            IpcKind::Msg,
            "msg",
            ipc.msg.iter().filter_map(|s| s.perm).collect(),
            "-q",
        ),
    ];
    for (kind, name, perms, flag) in kinds {
        if perms.is_empty() {
            continue;
        }
        let used = in_use(name)?;
        for p in perms {
            if let Some(InUse { id, key }) = used
                .iter()
                .find(|u| u.id == p.id || (p.key != 0 && u.key == p.key))
            {
                return Err(refuse(
                    kind,
                    &p,
                    format!(
                        "already taken here by id {id} (key {:#x}); remove it (ipcrm {flag} {id}) or restore in another IPC namespace",
                        *key as u32
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// One object this restore created.
struct CreatedObject {
    kind: IpcKind,
    id: i32,
}

/// The objects this restore created; removed on drop unless disarmed,
/// and by a keeper process if the restorer dies first.
#[derive(Default)]
pub struct Created {
    objects: Vec<CreatedObject>,
    armed: bool,
    keeper: Option<sys::IpcKeeper>,
}

/// Who removes the objects if the restore fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cleanup {
    /// The restorer, and a keeper process should the restorer be killed
    /// (objects in the host's, or another long-lived, IPC namespace).
    Restorer,
    /// Nobody: they live in an IPC namespace of the tree's own, which ends
    /// with its last process.
    Namespace,
}

impl Created {
    /// The tree runs: the objects are its own now.
    pub fn disarm(&mut self) {
        self.armed = false;
        if let Some(k) = self.keeper.take() {
            k.release();
        }
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        if self.armed {
            for o in self.objects.drain(..).rev() {
                let _ = sys::ipc_rmid(o.kind, o.id);
            }
        }
        if let Some(k) = self.keeper.take() {
            k.release();
        }
    }
}

/// Creates object `p` of `kind` with its own id and key: writes the id to
/// the kernel's next-id knob, creates, and checks what came back.
fn create_with_id(
    kind: IpcKind,
    p: &IpcPerm,
    created: &mut Created,
    get: impl FnOnce() -> std::io::Result<i32>,
) -> Result<i32> {
    let knob = match kind {
        IpcKind::Shm => "/proc/sys/kernel/shm_next_id",
        IpcKind::Sem => "/proc/sys/kernel/sem_next_id",
        IpcKind::Msg => "/proc/sys/kernel/msg_next_id",
    };
    let os = |op: &str, e: std::io::Error| refuse(kind, p, format!("{op}: {e}"));
    std::fs::write(knob, p.id.to_string()).map_err(|e| os(&format!("write {knob}"), e))?;
    let got = get();
    // The kernel clears the knob when it allocates an id (and refuses -1
    // from us); a create that failed before that leaves it set, and the
    // next object anyone creates would get the id: a throwaway private
    // object takes it instead.
    let id = got.map_err(|e| {
        if std::fs::read_to_string(knob).is_ok_and(|v| v.trim() != "-1") {
            consume_next_id(kind);
        }
        match e.raw_os_error() {
            Some(libc::EEXIST) => refuse(kind, p, "its key was taken here meanwhile"),
            _ => os("create", e),
        }
    })?;
    created.objects.push(CreatedObject { kind, id });
    if let Some(k) = &created.keeper {
        k.record(kind, id)
            .map_err(|e| os("tell the keeper process about it", e))?;
    }
    if id != p.id {
        return Err(refuse(
            kind,
            p,
            format!("created with id {id} instead (id taken meanwhile)"),
        ));
    }
    Ok(id)
}

/// Creates and removes a private object of `kind`, which takes the id the
/// next-id knob holds.
fn consume_next_id(kind: IpcKind) {
    let id = match kind {
        IpcKind::Shm => sys::shm_create(libc::IPC_PRIVATE, PAGE_SIZE),
        IpcKind::Sem => sys::sem_create(libc::IPC_PRIVATE, 1),
        IpcKind::Msg => sys::msg_create(libc::IPC_PRIVATE),
    };
    if let Ok(id) = id {
        let _ = sys::ipc_rmid(kind, id);
    }
}

fn owner(p: &IpcPerm) -> IpcOwner {
    IpcOwner {
        uid: p.uid,
        gid: p.gid,
        mode: p.mode,
    }
}

/// Creates, fills and hands over every object of `ipc` (already checked by
/// [`load`] and [`check_free`]).
pub fn create(images: &ImageDir, ipc: &Ipc, cleanup: Cleanup) -> Result<Created> {
    let count = ipc.shm.len() + ipc.sem.len() + ipc.msg.len();
    let keeper = if cleanup == Cleanup::Restorer && count > 0 {
        Some(
            sys::IpcKeeper::spawn(count).map_err(|e| RestoreError::Host {
                pid: std::process::id() as i32,
                what: format!("cannot start the SysV objects' keeper process: {e}"),
            })?,
        )
    } else {
        None
    };
    let mut created = Created {
        objects: Vec::new(),
        armed: true,
        keeper,
    };
    for s in &ipc.shm {
        let p = s.perm.expect("checked by load");
        let id = create_with_id(IpcKind::Shm, &p, &mut created, || {
            sys::shm_create(p.key, s.size)
        })?;
        fill_segment_as_leader(images, s)?;
        if s.locked {
            sys::shm_lock(id).map_err(|e| refuse(IpcKind::Shm, &p, format!("SHM_LOCK: {e}")))?;
        }
        sys::shm_set(id, owner(&p))
            .map_err(|e| refuse(IpcKind::Shm, &p, format!("IPC_SET: {e}")))?;
        log::info!(
            "ipc: created {} ({} bytes, {} saved)",
            describe(IpcKind::Shm, &p),
            s.size,
            s.saved_bytes()
        );
    }
    for s in &ipc.sem {
        let p = s.perm.expect("checked by load");
        let id = create_with_id(IpcKind::Sem, &p, &mut created, || {
            sys::sem_create(p.key, s.values.len() as i32)
        })?;
        let values: Vec<u16> = s.values.iter().map(|v| *v as u16).collect();
        sys::sem_setall(id, &values)
            .map_err(|e| refuse(IpcKind::Sem, &p, format!("SETALL: {e}")))?;
        sys::sem_set(id, owner(&p))
            .map_err(|e| refuse(IpcKind::Sem, &p, format!("IPC_SET: {e}")))?;
        log::info!(
            "ipc: created {} ({} semaphores)",
            describe(IpcKind::Sem, &p),
            s.values.len()
        );
    }
    for q in &ipc.msg {
        let p = q.perm.expect("checked by load");
        let id = create_with_id(IpcKind::Msg, &p, &mut created, || sys::msg_create(p.key))?;
        // The limit first, so the messages fit; the mode last.
        sys::msg_set(
            id,
            IpcOwner {
                mode: sys::NEW_OBJECT_MODE as u32,
                ..owner(&p)
            },
            q.qbytes,
        )
        .map_err(|e| refuse(IpcKind::Msg, &p, format!("IPC_SET: {e}")))?;
        for m in &q.messages {
            sys::msg_send(id, m.mtype, &m.text)
                .map_err(|e| refuse(IpcKind::Msg, &p, format!("msgsnd: {e}")))?;
        }
        sys::msg_set(id, owner(&p), q.qbytes)
            .map_err(|e| refuse(IpcKind::Msg, &p, format!("IPC_SET: {e}")))?;
        log::info!(
            "ipc: created {} ({} messages)",
            describe(IpcKind::Msg, &p),
            q.messages.len()
        );
    }
    Ok(created)
}

/// Fills segment `s` from its image, as the one process of this node that
/// does: the restorer attaches the new segment, reads each saved run of
/// pages straight from the image file into it (`pread` into the attach:
/// one copy of the data in the segment, nothing in any process's private
/// memory), and detaches. The restored processes attach it afterwards
/// ([`attach`]) and find the data in place.
///
/// This is the "leader fill" of the multi-node design: when a job's
/// processes on several nodes share segments that way, every attacher
/// maps the segment without touching it, one leader per node runs this
/// function, and a node-wide barrier of the coordinator (to come) slots in
/// right after it, before any attacher runs. On one node the restorer is
/// the leader and the barrier is the order of the calls.
fn fill_segment_as_leader(images: &ImageDir, s: &ShmSegment) -> Result<()> {
    let p = s.perm.expect("checked by load");
    let name = ckpt_image::shm_data_name(p.id);
    let file = images.open_pages(&name)?;
    let mut attach = sys::ShmAttach::new(p.id, s.mapped_len() as usize)
        .map_err(|e| refuse(IpcKind::Shm, &p, format!("attach to fill: {e}")))?;
    let bytes = attach.bytes_mut();
    let mut file_offset = 0u64;
    for r in &s.pages {
        let len = (r.nr_pages * PAGE_SIZE) as usize;
        let at = r.offset as usize;
        file.read_exact_at(&mut bytes[at..at + len], file_offset)
            .map_err(|e| {
                RestoreError::from(ImageError::io(images.path().join(&name), "read", e))
            })?;
        file_offset += len as u64;
    }
    Ok(())
}

/// Segments marked for removal at dump time are marked again, now that
/// every restored process attached them.
pub fn remove_marked(ipc: &Ipc) -> Result<()> {
    for s in ipc.shm.iter().filter(|s| s.removed) {
        let p = s.perm.expect("checked by load");
        sys::ipc_rmid(IpcKind::Shm, p.id)
            .map_err(|e| refuse(IpcKind::Shm, &p, format!("IPC_RMID: {e}")))?;
    }
    Ok(())
}

/// Attaches the recreated segment of `v` in the process at `v`'s address,
/// read-only and executable as it was: its pages stay the segment's, none
/// is copied into the process.
pub fn attach(r: &Remote<'_>, v: &Vma) -> Result<()> {
    let mut flags = 0;
    let mut got_prot = prot::READ | prot::WRITE;
    if v.prot & prot::WRITE == 0 {
        flags |= SHM_RDONLY;
        got_prot &= !prot::WRITE;
    }
    if v.prot & prot::EXEC != 0 {
        flags |= SHM_EXEC;
        got_prot |= prot::EXEC;
    }
    let at = r.call(
        "shmat",
        libc::SYS_shmat,
        [v.sysv_shmid as u64, v.start, flags, 0, 0, 0],
    )?;
    if at != v.start {
        return Err(RestoreError::vma(
            r.t.pid(),
            v,
            "SysV segment attached at a different address",
        ));
    }
    if got_prot != v.prot {
        r.call(
            "mprotect (shm)",
            libc::SYS_mprotect,
            [v.start, v.len(), v.prot as u64, 0, 0, 0],
        )?;
    }
    for (flag, advice) in crate::mm::ADVICE {
        if v.flags & flag != 0 {
            r.call(
                "madvise (shm)",
                libc::SYS_madvise,
                [v.start, v.len(), advice as u64, 0, 0, 0],
            )?;
        }
    }
    Ok(())
}
