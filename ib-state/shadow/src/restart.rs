//! Checkpoint and restart of the verbs state, inside the process.
//!
//! - [`drain`] (at a checkpoint, every thread but the caller stopped):
//!   every CQ is polled into its drained queue until no send is
//!   outstanding or no completion came for a quiet window (the relaxed
//!   window of "Checkpoint-Restart for a Network of Virtual Machines"'
//!   InfiniBand follow-up on petascale jobs, instead of DMTCP's single
//!   sweep), but never ends with an RDMA write or atomic outstanding (it
//!   fences them, or fails). The state stays in the process's memory,
//!   which the dump saves.
//! - [`restart_local`] (in the restored process, before its threads run):
//!   the device is reopened and every object recreated with the creation
//!   parameters recorded, MRs at their addresses; the descriptors the
//!   application knows get their old numbers. Returns this process's
//!   [`Blob`]: where its ports and QPs are now, its new keys, and the
//!   counts that make delivery exactly-once.
//! - [`restart_connect`] (once every process's blob is known): the
//!   `modify_qp` history is replayed with the peers' new ids, sends the
//!   peer had already received are retired (their completions made up),
//!   and the rest is re-posted, receives first.

use std::collections::HashMap;
use std::ffi::{CStr, c_int};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ckpt_ib_state::sys::*;

use crate::datapath::{self, Owner, TranslatedRecvs, TranslatedSends, absorb};
use crate::objects::*;
use crate::real::real;
use crate::ring::{Ring, WorkRecord};
use crate::verbs::{attach_to_cqs, create_real_qp, destination, translate_av, translate_modify};
use crate::{IN_VERBS, errno};

/// Why a checkpoint or restart step failed: a negative errno for the C
/// caller and a line for its log.
#[derive(Debug)]
pub struct Failure {
    pub errno: c_int,
    pub what: String,
}

fn fail(errno: c_int, what: impl Into<String>) -> Failure {
    Failure {
        errno,
        what: what.into(),
    }
}

/// What a drain did.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct DrainReport {
    /// Completions moved from the devices into the drained queues.
    pub completions: u64,
    /// Requests still outstanding at the end: sends the peer had no
    /// receive for (or the quiet window passed first) and RDMA reads,
    /// never an RDMA write or atomic (see [`drain`]).
    pub outstanding_sends: u64,
    /// Time spent, in microseconds.
    pub elapsed_us: u64,
}

/// Completions polled from a device CQ at a time.
const POLL_BATCH: usize = 16;
/// Pause between sweeps while waiting for the quiet window.
const SWEEP_PAUSE: Duration = Duration::from_micros(200);

/// Environment variable of the tests only: for this many milliseconds
/// from its start, the drain does not poll the devices' CQs, as if every
/// completion came back late (what a slow peer or network does).
const TEST_BLIND_ENV: &CStr = c"CKPT_IB_TEST_DRAIN_BLIND_MS";

/// The drain's blind window of [`TEST_BLIND_ENV`] (zero when unset). Reads
/// the environment in place: the drain allocates nothing.
fn test_blind_window() -> Duration {
    // SAFETY: a nul-terminated name; getenv only reads the environment.
    let value = unsafe { libc::getenv(TEST_BLIND_ENV.as_ptr()) };
    if value.is_null() {
        return Duration::ZERO;
    }
    // SAFETY: a nul-terminated string of the environment.
    let digits = unsafe { CStr::from_ptr(value) }.to_bytes();
    let ms = digits
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0u64, |n, b| {
            n.saturating_mul(10).saturating_add(u64::from(b - b'0'))
        });
    Duration::from_millis(ms)
}

/// Drains every CQ (see the module doc). No allocation happens here but
/// for a failure's message: the process may be frozen with another thread
/// inside malloc.
///
/// Exactly once for what consumes no receive: a drain that ends leaves no
/// RDMA write or atomic outstanding (see [`datapath::unreplayable`]),
/// since nothing at the peer would tell a restart whether it executed.
/// Where no completion of the application's would prove them executed (no
/// signaled request after them), a fence is posted first
/// ([`post_fence`]). When one is still outstanding at `max_wait`, the
/// drain fails, naming it: the dump is refused rather than risk executing
/// it twice, and the job goes on.
pub fn drain(quiet: Duration, max_wait: Duration) -> Result<DrainReport, Failure> {
    if IN_VERBS.load(Ordering::SeqCst) != 0 {
        return Err(fail(libc::EBUSY, "a thread is inside a verbs call"));
    }
    let reg = registry();
    let start = Instant::now();
    let blind_until = start + test_blind_window();
    let mut last_progress = start;
    let mut report = DrainReport::default();
    for q in &reg.qps {
        // SAFETY: registered QPs are live.
        let qp = unsafe { &*q.0 };
        post_fence(qp, &mut lock(&qp.st));
    }
    loop {
        let mut got = 0u64;
        let cqs = if Instant::now() < blind_until {
            &[][..]
        } else {
            &reg.cqs[..]
        };
        for cq in cqs {
            // SAFETY: registered CQs are live.
            let c = unsafe { &*cq.0 };
            let mut st = lock(&c.st);
            loop {
                let mut wc = [ibv_wc::default(); POLL_BATCH];
                let real_cq = st.real;
                // SAFETY: the live real CQ; `wc` has room for the batch.
                let poll = unsafe { (*(*real_cq).context).ops.poll_cq };
                let Some(poll) = poll else { break };
                // SAFETY: as above.
                let n = unsafe { poll(real_cq, POLL_BATCH as c_int, wc.as_mut_ptr()) };
                if n < 0 {
                    return Err(fail(libc::EIO, format!("poll_cq failed ({n})")));
                }
                let n = n as usize;
                for w in wc.iter_mut().take(n) {
                    if Kick::owns(&st.kicks, w.qp_num) || absorb(&st, w) == Owner::Layer {
                        continue;
                    }
                    if st.drained.push(*w).is_err() {
                        return Err(fail(
                            libc::ENOSPC,
                            "more completions than the CQ can hold (overrun)",
                        ));
                    }
                }
                got += n as u64;
                if n < POLL_BATCH {
                    break;
                }
            }
            drop(st);
        }
        report.completions += got;
        let now = Instant::now();
        if got > 0 {
            last_progress = now;
        }
        let (outstanding, unproven) = outstanding_work(&reg);
        report.outstanding_sends = outstanding;
        let waited = now.duration_since(start);
        match unproven {
            None if outstanding == 0
                || now.duration_since(last_progress) >= quiet
                || waited >= max_wait =>
            {
                break;
            }
            Some(u) if waited >= max_wait => return Err(u.refusal(waited)),
            _ => {}
        }
        std::thread::sleep(SWEEP_PAUSE);
    }
    report.elapsed_us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
    Ok(report)
}

/// An application's RDMA write or atomic outstanding: the responder may
/// have executed it or not.
struct Unproven {
    qp_num: u32,
    wr_id: u64,
    opcode: u32,
}

impl Unproven {
    fn refusal(&self, waited: Duration) -> Failure {
        fail(
            libc::ETIMEDOUT,
            format!(
                "qp {}: its {} with wr_id {} is not known to have executed after {} ms (no completion came for it or a request after it): a restart would execute it again, so this dump is refused; the job goes on",
                self.qp_num,
                datapath::opcode_name(self.opcode),
                self.wr_id,
                waited.as_millis()
            ),
        )
    }
}

/// How many requests are outstanding on every QP, and the first of the
/// application's RDMA writes and atomics among them.
fn outstanding_work(reg: &Registry) -> (u64, Option<Unproven>) {
    let mut count = 0u64;
    let mut first = None;
    for q in &reg.qps {
        // SAFETY: registered QPs are live.
        let qp = unsafe { &*q.0 };
        let st = lock(&qp.st);
        let ring = &st.sends.ring;
        count += ring.len() as u64;
        if first.is_none() {
            first = (0..ring.len())
                .filter_map(|i| ring.get(i))
                .find(|r| !r.internal && datapath::unreplayable(r.opcode))
                .map(|r| Unproven {
                    qp_num: qp.abi.qp_num,
                    wr_id: r.wr_id,
                    opcode: r.opcode,
                });
        }
    }
    (count, first)
}

/// `wr_id` of the layer's fences (never seen by the application).
const FENCE_WR_ID: u64 = 0x636b_7074_6665_6e63;

/// Whether the application's RDMA writes or atomics are outstanding in
/// `ring` and neither the last of them nor a request after it is
/// signaled (no completion would come to prove them executed).
fn fence_needed(ring: &Ring<WorkRecord>) -> bool {
    let Some(last) = (0..ring.len()).rev().find(|&i| {
        ring.get(i)
            .is_some_and(|r| !r.internal && datapath::unreplayable(r.opcode))
    }) else {
        return false;
    };
    !(last..ring.len()).any(|i| ring.get(i).is_some_and(|r| r.signaled))
}

/// Posts the layer's fence on `qp` if it needs one: the application's
/// RDMA writes or atomics are outstanding and neither the last of them nor
/// a request after it is signaled, so no completion would ever say whether
/// they executed. The fence is a signaled zero-length RDMA write (with
/// `IBV_SEND_FENCE` on RC: after the reads and atomics before it): RC
/// executes a send queue in order and completes it in order, so its
/// completion proves every request before it executed; on UC it proves
/// them sent. Its completion retires them (their own, if signaled, go to
/// the application) and is hidden ([`Owner::Layer`]).
///
/// It goes where the application's last RDMA write on the QP went (the
/// peer grants remote writes there; zero bytes touch nothing). A QP that
/// never wrote gets none (its peer may grant atomics only), nor does one
/// whose send queue is full: the drain then waits for the application's
/// own completions. Allocates nothing.
fn post_fence(qp: &Qp, st: &mut QpState) {
    if qp.abi.qp_type != IBV_QPT_RC && qp.abi.qp_type != IBV_QPT_UC {
        return;
    }
    if !fence_needed(&st.sends.ring) {
        return;
    }
    let Some(target) = st.last_write else {
        return;
    };
    let fence_flag = if qp.abi.qp_type == IBV_QPT_RC {
        IBV_SEND_FENCE
    } else {
        0
    };
    let rec = WorkRecord {
        wr_id: FENCE_WR_ID,
        opcode: IBV_WR_RDMA_WRITE,
        send_flags: IBV_SEND_SIGNALED | fence_flag,
        wr: [target.addr, u64::from(target.rkey), 0, 0],
        signaled: true,
        internal: true,
        ..Default::default()
    };
    if st.sends.record(rec, &[], &[]).is_none() {
        return;
    }
    let rkey = st
        .peer
        .as_ref()
        .and_then(|p| p.rkeys.get(&target.rkey).copied())
        .unwrap_or(target.rkey);
    let mut wr = ibv_send_wr {
        wr_id: rec.wr_id,
        next: std::ptr::null_mut(),
        sg_list: std::ptr::null_mut(),
        num_sge: 0,
        opcode: rec.opcode,
        send_flags: rec.send_flags,
        imm_data: 0,
        // The `rdma` union: remote address, rkey.
        wr: [target.addr, u64::from(rkey), 0, 0],
        qp_type: 0,
        bind_mw_or_tso: [0; 6],
    };
    let mut bad = std::ptr::null_mut();
    // SAFETY: the live real QP of this shadow.
    let post = unsafe { (*(*st.real).context).ops.post_send };
    // SAFETY: a valid one-request chain without a gather list on the
    // live real QP.
    let rc = post.map_or(libc::EOPNOTSUPP, |f| unsafe {
        f(st.real, &mut wr, &mut bad)
    });
    if rc != 0 {
        st.sends.ring.pop_back();
    }
}

/// One port of this process, as the application knew it and as it is now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PortMove {
    pub ctx: u32,
    pub virt: NodeAddr,
    pub now: NodeAddr,
}

/// One QP of this process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QpMove {
    pub ctx: u32,
    pub virt_qpn: u32,
    pub real_qpn: u32,
    /// Receives it consumed since creation.
    pub recvs_consumed: u64,
}

/// What one process tells the others at a restart.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Blob {
    pub ports: Vec<PortMove>,
    pub qps: Vec<QpMove>,
    /// Virtual → new rkeys.
    pub rkeys: Vec<(u32, u32)>,
}

const MAGIC: &[u8; 4] = b"CKIB";
const VERSION: u32 = 1;
/// Header: magic, version, total length.
const HEADER: usize = 4 + 4 + 8;
const PORT_BYTES: usize = 4 + 16 + 2 + 16 + 2;
const QP_BYTES: usize = 4 + 4 + 4 + 8;
const KEY_BYTES: usize = 8;
/// No process has more than this much to say (16 MiB: a million QPs).
pub const MAX_BLOB: usize = 16 << 20;

impl Blob {
    /// The self-delimiting encoding (little-endian).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
        for n in [self.ports.len(), self.qps.len(), self.rkeys.len()] {
            b.extend_from_slice(&(n as u32).to_le_bytes());
        }
        for p in &self.ports {
            b.extend_from_slice(&p.ctx.to_le_bytes());
            b.extend_from_slice(&p.virt.gid);
            b.extend_from_slice(&p.virt.lid.to_le_bytes());
            b.extend_from_slice(&p.now.gid);
            b.extend_from_slice(&p.now.lid.to_le_bytes());
        }
        for q in &self.qps {
            b.extend_from_slice(&q.ctx.to_le_bytes());
            b.extend_from_slice(&q.virt_qpn.to_le_bytes());
            b.extend_from_slice(&q.real_qpn.to_le_bytes());
            b.extend_from_slice(&q.recvs_consumed.to_le_bytes());
        }
        for (v, r) in &self.rkeys {
            b.extend_from_slice(&v.to_le_bytes());
            b.extend_from_slice(&r.to_le_bytes());
        }
        let len = b.len() as u64;
        b[8..16].copy_from_slice(&len.to_le_bytes());
        b
    }

    /// Decodes the blobs concatenated in `all`, every count checked
    /// against the bytes there are.
    pub fn decode_all(mut all: &[u8]) -> Result<Vec<Blob>, Failure> {
        let bad = |what: &str| fail(libc::EINVAL, format!("restart blob: {what}"));
        let mut out = Vec::new();
        while !all.is_empty() {
            if all.len() < HEADER + 12 || &all[..4] != MAGIC {
                return Err(bad("bad magic or truncated header"));
            }
            let version = u32::from_le_bytes(all[4..8].try_into().expect("4 bytes"));
            if version != VERSION {
                return Err(bad(&format!(
                    "version {version}, this library reads {VERSION}"
                )));
            }
            let len = u64::from_le_bytes(all[8..16].try_into().expect("8 bytes"));
            let len = usize::try_from(len).map_err(|_| bad("length"))?;
            if len > MAX_BLOB || len > all.len() || len < HEADER + 12 {
                return Err(bad(&format!("length {len} out of bounds")));
            }
            let (one, rest) = all.split_at(len);
            all = rest;
            let mut r = Reader { b: &one[HEADER..] };
            let n_ports = r.u32()? as usize;
            let n_qps = r.u32()? as usize;
            let n_keys = r.u32()? as usize;
            let need = n_ports
                .checked_mul(PORT_BYTES)
                .and_then(|x| x.checked_add(n_qps.checked_mul(QP_BYTES)?))
                .and_then(|x| x.checked_add(n_keys.checked_mul(KEY_BYTES)?));
            if need != Some(r.b.len()) {
                return Err(bad("counts do not match its length"));
            }
            let mut blob = Blob::default();
            for _ in 0..n_ports {
                let ctx = r.u32()?;
                let virt = NodeAddr {
                    gid: r.gid()?,
                    lid: r.u16()?,
                };
                let now = NodeAddr {
                    gid: r.gid()?,
                    lid: r.u16()?,
                };
                blob.ports.push(PortMove { ctx, virt, now });
            }
            for _ in 0..n_qps {
                blob.qps.push(QpMove {
                    ctx: r.u32()?,
                    virt_qpn: r.u32()?,
                    real_qpn: r.u32()?,
                    recvs_consumed: r.u64()?,
                });
            }
            for _ in 0..n_keys {
                blob.rkeys.push((r.u32()?, r.u32()?));
            }
            out.push(blob);
        }
        Ok(out)
    }
}

struct Reader<'a> {
    b: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], Failure> {
        if self.b.len() < N {
            return Err(fail(libc::EINVAL, "restart blob: truncated"));
        }
        let (head, rest) = self.b.split_at(N);
        self.b = rest;
        Ok(head.try_into().expect("N bytes"))
    }
    fn u16(&mut self) -> Result<u16, Failure> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, Failure> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, Failure> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn gid(&mut self) -> Result<[u8; 16], Failure> {
        self.take()
    }
}

/// Where to open the device of a context: the same name if this node has
/// it, else the first device.
fn open_device(name: &CStr) -> Result<*mut ibv_context, Failure> {
    let mut n: c_int = 0;
    // SAFETY: the real device list; freed below.
    let list = unsafe { (real().ibv_get_device_list)(&mut n) };
    if list.is_null() || n <= 0 {
        return Err(fail(
            libc::ENODEV,
            format!("no RDMA device here to reopen {}", name.to_string_lossy()),
        ));
    }
    // SAFETY: `list` holds `n` devices.
    let devices = unsafe { std::slice::from_raw_parts(list, n as usize) };
    let pick = devices
        .iter()
        // SAFETY: each device has a nul-terminated name.
        .find(|d| unsafe { CStr::from_ptr((real().ibv_get_device_name)(**d)) } == name)
        .unwrap_or(&devices[0]);
    // SAFETY: a device of the list, opened before the list is freed.
    let ctx = unsafe { (real().ibv_open_device)(*pick) };
    let e = errno();
    // SAFETY: the list from ibv_get_device_list.
    unsafe { (real().ibv_free_device_list)(list) };
    if ctx.is_null() {
        return Err(fail(
            -e.abs().max(1),
            format!("ibv_open_device for {}", name.to_string_lossy()),
        ));
    }
    Ok(ctx)
}

/// A descriptor a restart must put on the number the application knows.
struct FdMove {
    field: *mut c_int,
    want: c_int,
}

/// Puts every new descriptor on its old number: first all out of the way
/// (above every number in use), then each onto its number, so one move
/// never closes another's descriptor.
fn place_fds(moves: &[FdMove]) -> Result<(), Failure> {
    // Above every number involved (a fixed high one could be beyond
    // RLIMIT_NOFILE).
    // SAFETY: `field` points into a live real object of this restart.
    let out_of_the_way = moves
        .iter()
        .map(|m| m.want.max(unsafe { *m.field }))
        .max()
        .unwrap_or(0)
        + 1;
    let mut parked = Vec::new();
    for m in moves {
        // SAFETY: `field` points into a live real object of this restart.
        let cur = unsafe { *m.field };
        if cur == m.want {
            continue;
        }
        // SAFETY: plain descriptor calls on descriptors we own.
        let t = unsafe { libc::fcntl(cur, libc::F_DUPFD_CLOEXEC, out_of_the_way) };
        if t < 0 {
            return Err(fail(-errno(), format!("fd {cur}: F_DUPFD")));
        }
        // SAFETY: as above.
        unsafe { libc::close(cur) };
        parked.push((m, t));
    }
    for (m, t) in parked {
        // SAFETY: as above; `want` is the application's number for it
        // (a placeholder of ckpt's there is replaced).
        if unsafe { libc::dup3(t, m.want, libc::O_CLOEXEC) } < 0 {
            return Err(fail(-errno(), format!("fd {}: dup3", m.want)));
        }
        // SAFETY: as above.
        unsafe {
            libc::close(t);
            *m.field = m.want;
        }
    }
    Ok(())
}

/// Destroys the real objects, newest first, ignoring failures (used when
/// they are still alive: a restart in place).
fn teardown(reg: &Registry) {
    let r = real();
    // SAFETY: each pointer is the current real object of a live shadow;
    // nothing uses it after this (the restart replaces them all).
    unsafe {
        for a in reg.ahs.iter().rev() {
            (r.ibv_destroy_ah)(lock(&(*a.0).real).0);
        }
        for q in reg.qps.iter().rev() {
            (r.ibv_destroy_qp)(lock(&(*q.0).st).real);
        }
        for s in reg.srqs.iter().rev() {
            (r.ibv_destroy_srq)(lock(&(*s.0).st).real);
        }
        for c in reg.cqs.iter().rev() {
            let mut st = lock(&(*c.0).st);
            if st.unacked_events > 0 {
                (r.ibv_ack_cq_events)(st.real, st.unacked_events);
            }
            for k in &mut st.kicks {
                k.destroy();
            }
            (r.ibv_destroy_cq)(st.real);
        }
        for c in reg.channels.iter().rev() {
            (r.ibv_destroy_comp_channel)(lock(&(*c.0).real).0);
        }
        for m in reg.mrs.iter().rev() {
            (r.ibv_dereg_mr)(lock(&(*m.0).real).0);
        }
        for p in reg.pds.iter().rev() {
            (r.ibv_dealloc_pd)((*p.0).real.read().unwrap_or_else(|e| e.into_inner()).0);
        }
        for c in reg.contexts.iter().rev() {
            (r.ibv_close_device)(lock(&(*c.0).st).real);
        }
    }
}

fn null_check<T>(p: *mut T, what: impl Fn() -> String) -> Result<*mut T, Failure> {
    if p.is_null() {
        Err(fail(-errno().abs().max(1), what()))
    } else {
        Ok(p)
    }
}

/// Recreates every object (see the module doc). `retire_old`: the old
/// real objects still exist (a restart in place, e.g. onto another
/// device) and are destroyed first; after a restore they do not, and
/// nothing touches them.
pub fn restart_local(retire_old: bool) -> Result<Blob, Failure> {
    if IN_VERBS.load(Ordering::SeqCst) != 0 {
        return Err(fail(libc::EBUSY, "a thread is inside a verbs call"));
    }
    let reg = registry();
    // A process the layer is preloaded into without a verbs object of its
    // own (the batch shell, `mpirun`, a launcher's daemons) may not even
    // have libibverbs loaded: it has nothing to recreate, and resolving
    // the real verbs would abort it.
    if reg.is_empty() {
        return Ok(Blob::default());
    }
    if retire_old {
        teardown(&reg);
    }
    let r = real();
    let mut fds = Vec::new();
    let mut blob = Blob::default();
    // SAFETY (for the blocks below): every pointer comes from the registry
    // (live shadows) or was just returned by a real verb and checked.
    for c in &reg.contexts {
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let ctx = unsafe { &*c.0 };
        let mut st = lock(&ctx.st);
        let rctx = open_device(&st.device_name)?;
        st.real = rctx;
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        unsafe {
            fds.push(FdMove {
                field: &mut (*rctx).cmd_fd,
                want: ctx.abi.cmd_fd,
            });
            fds.push(FdMove {
                field: &mut (*rctx).async_fd,
                want: ctx.abi.async_fd,
            });
        }
    }
    for p in &reg.pds {
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let pd = unsafe { &*p.0 };
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let rctx = lock(&unsafe { &*pd.abi.context.cast::<Context>() }.st).real;
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let rpd = null_check(unsafe { (r.ibv_alloc_pd)(rctx) }, || "ibv_alloc_pd".into())?;
        *pd.real.write().unwrap_or_else(|e| e.into_inner()) = Ptr(rpd);
        pd.lkeys.write().unwrap_or_else(|e| e.into_inner()).clear();
    }
    for m in &reg.mrs {
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let mr = unsafe { &*m.0 };
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let pd = unsafe { &*mr.abi.pd.cast::<Pd>() };
        let rpd = pd.real.read().unwrap_or_else(|e| e.into_inner()).0;
        let rmr = null_check(
            // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
            unsafe { (r.ibv_reg_mr_iova2)(rpd, mr.abi.addr, mr.abi.length, mr.iova, mr.access) },
            || format!("ibv_reg_mr of {:p}+{:#x}", mr.abi.addr, mr.abi.length),
        )?;
        *lock(&mr.real) = Ptr(rmr);
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let (lkey, rkey) = unsafe { ((*rmr).lkey, (*rmr).rkey) };
        pd.lkeys
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(mr.abi.lkey, lkey);
        blob.rkeys.push((mr.abi.rkey, rkey));
    }
    for c in &reg.channels {
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let ch = unsafe { &*c.0 };
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let rctx = lock(&unsafe { &*ch.abi.context.cast::<Context>() }.st).real;
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let rch = null_check(unsafe { (r.ibv_create_comp_channel)(rctx) }, || {
            "ibv_create_comp_channel".into()
        })?;
        *lock(&ch.real) = Ptr(rch);
        fds.push(FdMove {
            // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
            field: unsafe { &mut (*rch).fd },
            want: ch.abi.fd,
        });
    }
    for c in &reg.cqs {
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let cq = unsafe { &*c.0 };
        let mut st = lock(&cq.st);
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let rctx = lock(&unsafe { &*cq.abi.context.cast::<Context>() }.st).real;
        let rch = if st.channel.is_null() {
            std::ptr::null_mut()
        } else {
            // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
            lock(&unsafe { &*st.channel }.real).0
        };
        let rcq = null_check(
            // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
            unsafe { (r.ibv_create_cq)(rctx, cq.abi.cqe, c.0.cast(), rch, st.comp_vector) },
            || format!("ibv_create_cq of {} entries", cq.abi.cqe),
        )?;
        st.real = rcq;
        st.qps.clear();
        st.unacked_events = 0;
        // The old kicks went with the old context.
        st.kicks.clear();
    }
    for s in &reg.srqs {
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let srq = unsafe { &*s.0 };
        let mut st = lock(&srq.st);
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let pd = unsafe { &*srq.abi.pd.cast::<Pd>() };
        let rpd = pd.real.read().unwrap_or_else(|e| e.into_inner()).0;
        let mut init = ibv_srq_init_attr {
            srq_context: s.0.cast(),
            attr: st.attr,
        };
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let rsrq = null_check(unsafe { (r.ibv_create_srq)(rpd, &mut init) }, || {
            "ibv_create_srq".into()
        })?;
        st.real = rsrq;
    }
    for q in &reg.qps {
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let qp = unsafe { &*q.0 };
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let pd = unsafe { &*qp.abi.pd.cast::<Pd>() };
        let rpd = pd.real.read().unwrap_or_else(|e| e.into_inner()).0;
        let init = lock(&qp.st).init;
        let rqp = null_check(create_real_qp(rpd, q.0, &init), || {
            format!("ibv_create_qp for qp {}", qp.abi.qp_num)
        })?;
        lock(&qp.st).real = rqp;
        attach_to_cqs(q.0, &init, 0);
    }
    place_fds(&fds)?;
    TRANSLATING.store(true, Ordering::Release);

    for (i, c) in reg.contexts.iter().enumerate() {
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let ctx = unsafe { &*c.0 };
        let st = lock(&ctx.st);
        for (&port, &vlid) in &st.lids {
            let mut attr = ibv_port_attr::default();
            // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
            if unsafe { (r.ibv_query_port)(st.real, port, &mut attr) } != 0 {
                return Err(fail(
                    -errno().abs().max(1),
                    format!("ibv_query_port {port}"),
                ));
            }
            if vlid != 0 {
                blob.ports.push(PortMove {
                    ctx: i as u32,
                    virt: NodeAddr::by_lid(vlid),
                    now: NodeAddr::by_lid(attr.lid),
                });
            }
        }
        for (&(port, index), vgid) in &st.gids {
            let mut gid = ibv_gid::default();
            // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
            if unsafe { (r.ibv_query_gid)(st.real, port, index, &mut gid) } != 0 {
                return Err(fail(
                    -errno().abs().max(1),
                    format!("ibv_query_gid {port}/{index}"),
                ));
            }
            blob.ports.push(PortMove {
                ctx: i as u32,
                virt: NodeAddr::by_gid(vgid.raw),
                now: NodeAddr::by_gid(gid.raw),
            });
        }
    }
    for q in &reg.qps {
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let qp = unsafe { &*q.0 };
        let st = lock(&qp.st);
        let ctx = reg
            .contexts
            .iter()
            .position(|c| c.0.cast() == qp.abi.context)
            .unwrap_or(0);
        blob.qps.push(QpMove {
            ctx: ctx as u32,
            virt_qpn: qp.abi.qp_num,
            // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
            real_qpn: unsafe { (*st.real).qp_num },
            recvs_consumed: st.recvs_consumed,
        });
    }
    Ok(blob)
}

/// The completion opcode of a send's work request opcode.
fn wc_opcode(wr_opcode: u32) -> u32 {
    match wr_opcode {
        IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM => IBV_WC_RDMA_WRITE,
        IBV_WR_RDMA_READ => IBV_WC_RDMA_READ,
        IBV_WR_ATOMIC_CMP_AND_SWP => IBV_WC_COMP_SWAP,
        IBV_WR_ATOMIC_FETCH_AND_ADD => IBV_WC_FETCH_ADD,
        _ => IBV_WC_SEND,
    }
}

/// What a restart learnt about one remote QP.
struct RemoteQp {
    recvs_consumed: u64,
    rkeys: Arc<HashMap<u32, u32>>,
}

/// Connects every QP again (see the module doc); `blobs` are every
/// process's, this one's included, concatenated.
pub fn restart_connect(all: &[u8]) -> Result<(), Failure> {
    let blobs = Blob::decode_all(all)?;
    let mut remote: HashMap<(NodeAddr, u32), RemoteQp> = HashMap::new();
    {
        let mut ids = ids().write().unwrap_or_else(|e| e.into_inner());
        ids.nodes.clear();
        ids.remote_qpns.clear();
        ids.remote_qpn_virtual.clear();
        for b in &blobs {
            let rkeys: Arc<HashMap<u32, u32>> = Arc::new(b.rkeys.iter().copied().collect());
            for p in &b.ports {
                ids.nodes.insert(p.virt, p.now);
            }
            for q in &b.qps {
                for p in b.ports.iter().filter(|p| p.ctx == q.ctx) {
                    ids.remote_qpns.insert((p.virt, q.virt_qpn), q.real_qpn);
                    ids.remote_qpn_virtual
                        .insert((p.now.lid, q.real_qpn), q.virt_qpn);
                    remote.insert(
                        (p.virt, q.virt_qpn),
                        RemoteQp {
                            recvs_consumed: q.recvs_consumed,
                            rkeys: rkeys.clone(),
                        },
                    );
                }
            }
        }
    }
    let reg = registry();
    // Nothing of this process's to reconnect (see `restart_local`); the
    // peers' ids above are kept for objects it creates later.
    if reg.is_empty() {
        return Ok(());
    }
    let r = real();
    let ids_now = ids().read().unwrap_or_else(|e| e.into_inner());
    // SAFETY (for the blocks below): registry pointers are live shadows;
    // their real objects were made by restart_local.
    for a in &reg.ahs {
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let ah = unsafe { &*a.0 };
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let pd = unsafe { &*ah.abi.pd.cast::<Pd>() };
        let rpd = pd.real.read().unwrap_or_else(|e| e.into_inner()).0;
        let mut attr = ah.attr;
        translate_av(&mut attr, &ids_now);
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let rah = null_check(unsafe { (r.ibv_create_ah)(rpd, &mut attr) }, || {
            "ibv_create_ah".into()
        })?;
        *lock(&ah.real) = Ptr(rah);
    }
    for s in &reg.srqs {
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let srq = unsafe { &*s.0 };
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let pd = unsafe { &*srq.abi.pd.cast::<Pd>() };
        let st = lock(&srq.st);
        let n = st.recvs.ring.len();
        if n > 0 {
            let mut copy = TranslatedRecvs::build(pd, &st.recvs, 0, n);
            // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
            let post = unsafe { (*(*st.real).context).ops.post_srq_recv };
            let mut bad = std::ptr::null_mut();
            // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
            let rc = post.map_or(libc::EOPNOTSUPP, |f| unsafe {
                f(st.real.cast(), copy.as_mut_ptr(), &mut bad)
            });
            if rc != 0 {
                return Err(fail(-rc.abs(), "re-posting SRQ receives"));
            }
        }
    }
    drop(ids_now);
    let mut made_up: Vec<(*mut Cq, ibv_wc)> = Vec::new();
    for q in &reg.qps {
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let qp = unsafe { &*q.0 };
        let mut st = lock(&qp.st);
        let ids_now = ids().read().unwrap_or_else(|e| e.into_inner());
        for i in 0..st.history.len() {
            let m = st.history[i];
            let mut a = m.attr;
            translate_modify(&mut a, m.mask, &st.history[..i], &ids_now);
            // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
            let rc = unsafe { (r.ibv_modify_qp)(st.real, &mut a, m.mask) };
            if rc != 0 {
                return Err(fail(
                    -rc.abs(),
                    format!(
                        "qp {}: replaying modify_qp to state {}",
                        qp.abi.qp_num, m.attr.qp_state
                    ),
                ));
            }
        }
        drop(ids_now);
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        unsafe { (*q.0).abi.state = (*st.real).state };
        let (node, dest) = destination(&st.history);
        if qp.abi.qp_type != IBV_QPT_UD
            && let (Some(node), Some(dest)) = (node, dest)
        {
            let Some(peer) = remote.get(&(node, dest)) else {
                return Err(fail(
                    libc::ENOENT,
                    format!(
                        "qp {}: its peer (qp {dest}) is in no process's restart blob",
                        qp.abi.qp_num
                    ),
                ));
            };
            st.peer = Some(Peer {
                rkeys: peer.rkeys.clone(),
            });
            // Exactly once: the peer consumed `recvs_consumed` of our
            // receive-consuming sends; those we saw complete are gone from
            // the queue, the rest of them were delivered unacknowledged.
            let Some(mut delivered) = peer.recvs_consumed.checked_sub(st.consuming_sends_done)
            else {
                return Err(fail(
                    libc::EPROTO,
                    format!(
                        "qp {}: {} sends completed but the peer received only {}: the checkpoint is not consistent",
                        qp.abi.qp_num, st.consuming_sends_done, peer.recvs_consumed
                    ),
                ));
            };
            while delivered > 0 {
                let Some(rec) = st.sends.ring.pop_front() else {
                    return Err(fail(
                        libc::EPROTO,
                        format!(
                            "qp {}: the peer received {delivered} more sends than were posted",
                            qp.abi.qp_num
                        ),
                    ));
                };
                if datapath::consumes_receive(rec.opcode) {
                    delivered -= 1;
                    st.consuming_sends_done += 1;
                }
                if rec.signaled && !rec.internal {
                    made_up.push((
                        st.init.send_cq,
                        ibv_wc {
                            wr_id: rec.wr_id,
                            status: IBV_WC_SUCCESS,
                            opcode: wc_opcode(rec.opcode),
                            qp_num: qp.abi.qp_num,
                            ..Default::default()
                        },
                    ));
                }
            }
        }
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let pd = unsafe { &*qp.abi.pd.cast::<Pd>() };
        let n = st.recvs.ring.len();
        if n > 0 {
            let mut copy = TranslatedRecvs::build(pd, &st.recvs, 0, n);
            // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
            let post = unsafe { (*(*st.real).context).ops.post_recv };
            let mut bad = std::ptr::null_mut();
            // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
            let rc = post.map_or(libc::EOPNOTSUPP, |f| unsafe {
                f(st.real, copy.as_mut_ptr(), &mut bad)
            });
            if rc != 0 {
                return Err(fail(
                    -rc.abs(),
                    format!("qp {}: re-posting {n} receives", qp.abi.qp_num),
                ));
            }
        }
        let n = st.sends.ring.len();
        if n > 0 {
            let mut chain = TranslatedSends::build(qp, &st, 0, n).chain();
            // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
            let post = unsafe { (*(*st.real).context).ops.post_send };
            let mut bad = std::ptr::null_mut();
            // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
            let rc = post.map_or(libc::EOPNOTSUPP, |f| unsafe {
                f(st.real, chain.as_mut_ptr(), &mut bad)
            });
            if rc != 0 {
                return Err(fail(
                    -rc.abs(),
                    format!("qp {}: re-posting {n} sends", qp.abi.qp_num),
                ));
            }
        }
    }
    for (cq, wc) in made_up {
        // SAFETY: registry pointers are live shadows; real objects were made by this restart and checked.
        let c = unsafe { &*cq };
        if lock(&c.st).drained.push(wc).is_err() {
            return Err(fail(libc::ENOSPC, "no room for a made-up completion"));
        }
    }
    for c in &reg.cqs {
        // SAFETY: registry pointers are live shadows.
        let cq = unsafe { &*c.0 };
        let mut st = lock(&cq.st);
        let Some(solicited) = st.armed else {
            continue;
        };
        // SAFETY: the CQ's real object was made by this restart.
        let arm = unsafe { (*(*st.real).context).ops.req_notify_cq };
        if let Some(f) = arm {
            // SAFETY: as above.
            unsafe { f(st.real, solicited) };
        }
        // The application armed the CQ and waits for its event, but the
        // completions it waits for were drained: the event they raised
        // went with the old channel.
        if !st.channel.is_null() && !st.drained.is_empty() {
            // SAFETY: a CQ's context outlives it.
            let ctx = unsafe { &*cq.abi.context.cast::<Context>() };
            let k = kick(ctx, st.real)?;
            st.kicks.push(k);
        }
    }
    Ok(())
}

/// The QKey of the layer's own kick QPs.
const KICK_QKEY: u32 = 0x0c4b_1b00;
/// `enum ibv_qp_attr_mask` bits a UD QP's bring-up needs.
const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
const IBV_QP_QKEY: c_int = 1 << 6;
const IBV_QP_SQ_PSN: c_int = 1 << 16;

/// Makes the device raise a completion event for `rcq`: a UD QP of the
/// layer's own, whose send queue completes on `rcq`, sends one empty
/// datagram to itself. `poll_cq` hides its completion (`Kick::owns`); the
/// application's event leads it to the drained completions. What a failed
/// kick made is destroyed again.
fn kick(ctx: &Context, rcq: *mut ibv_cq) -> Result<Kick, Failure> {
    let mut k = Kick {
        qpn: 0,
        qp: std::ptr::null_mut(),
        ah: std::ptr::null_mut(),
        recv_cq: std::ptr::null_mut(),
        pd: std::ptr::null_mut(),
    };
    match build_kick(ctx, rcq, &mut k) {
        Ok(()) => Ok(k),
        Err(e) => {
            k.destroy();
            Err(e)
        }
    }
}

/// The steps of `kick`, filling `k` as objects are made.
fn build_kick(ctx: &Context, rcq: *mut ibv_cq, k: &mut Kick) -> Result<(), Failure> {
    let r = real();
    let (rctx, port, index) = {
        let st = lock(&ctx.st);
        let (port, index) = st
            .gids
            .keys()
            .next()
            .copied()
            .or_else(|| st.lids.keys().next().map(|p| (*p, -1)))
            .unwrap_or((1, 0));
        (st.real, port, index)
    };
    // SAFETY: the live new context.
    k.pd = null_check(unsafe { (r.ibv_alloc_pd)(rctx) }, || {
        "kick: ibv_alloc_pd".into()
    })?;
    k.recv_cq = null_check(
        // SAFETY: as above; no channel, no context pointer.
        unsafe { (r.ibv_create_cq)(rctx, 1, std::ptr::null_mut(), std::ptr::null_mut(), 0) },
        || "kick: ibv_create_cq".into(),
    )?;
    let mut init = ibv_qp_init_attr {
        qp_context: std::ptr::null_mut(),
        send_cq: rcq,
        recv_cq: k.recv_cq,
        srq: std::ptr::null_mut(),
        cap: ibv_qp_cap {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
        },
        qp_type: IBV_QPT_UD,
        sq_sig_all: 1,
    };
    // SAFETY: live real PD and CQs, local attributes.
    k.qp = null_check(unsafe { (r.ibv_create_qp)(k.pd, &mut init) }, || {
        "kick: ibv_create_qp".into()
    })?;
    let qp = k.qp;
    // SAFETY: the QP just made.
    k.qpn = unsafe { (*qp).qp_num };
    let mut a = ibv_qp_attr {
        port_num: port,
        qkey: KICK_QKEY,
        ..Default::default()
    };
    let steps = [
        (
            IBV_QPS_INIT,
            IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY,
        ),
        (IBV_QPS_RTR, IBV_QP_STATE),
        (IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_SQ_PSN),
    ];
    for (state, mask) in steps {
        a.qp_state = state;
        // SAFETY: the QP just made, local attributes.
        let rc = unsafe { (r.ibv_modify_qp)(qp, &mut a, mask) };
        if rc != 0 {
            return Err(fail(-rc.abs(), format!("kick: modify_qp to state {state}")));
        }
    }
    let mut av = ibv_ah_attr {
        port_num: port,
        ..Default::default()
    };
    if index >= 0 {
        let mut gid = ibv_gid::default();
        // SAFETY: the live context, a local out value.
        if unsafe { (r.ibv_query_gid)(rctx, port, index, &mut gid) } != 0 {
            return Err(fail(-errno().abs().max(1), "kick: ibv_query_gid"));
        }
        av.is_global = 1;
        av.grh.dgid = gid;
        av.grh.sgid_index = u8::try_from(index).unwrap_or(0);
        av.grh.hop_limit = 1;
    } else {
        let mut pa = ibv_port_attr::default();
        // SAFETY: as above.
        if unsafe { (r.ibv_query_port)(rctx, port, &mut pa) } != 0 {
            return Err(fail(-errno().abs().max(1), "kick: ibv_query_port"));
        }
        av.dlid = pa.lid;
    }
    // SAFETY: the PD just made, a local address vector.
    k.ah = null_check(unsafe { (r.ibv_create_ah)(k.pd, &mut av) }, || {
        "kick: ibv_create_ah".into()
    })?;
    let mut wr = ibv_send_wr {
        wr_id: 0,
        next: std::ptr::null_mut(),
        sg_list: std::ptr::null_mut(),
        num_sge: 0,
        opcode: IBV_WR_SEND,
        send_flags: IBV_SEND_SIGNALED,
        imm_data: 0,
        // The `ud` union: address handle, remote QPN, remote QKey.
        wr: [
            k.ah as u64,
            u64::from(k.qpn) | (u64::from(KICK_QKEY) << 32),
            0,
            0,
        ],
        qp_type: 0,
        bind_mw_or_tso: [0; 6],
    };
    let mut bad = std::ptr::null_mut();
    // SAFETY: the QP's live context.
    let post = unsafe { (*(*qp).context).ops.post_send };
    // SAFETY: a valid one-request chain on the QP just made.
    let rc = post.map_or(libc::EOPNOTSUPP, |f| unsafe { f(qp, &mut wr, &mut bad) });
    if rc != 0 {
        return Err(fail(-rc.abs(), "kick: post_send"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Blob {
        Blob {
            ports: vec![PortMove {
                ctx: 0,
                virt: NodeAddr::by_gid([1; 16]),
                now: NodeAddr::by_gid([2; 16]),
            }],
            qps: vec![QpMove {
                ctx: 0,
                virt_qpn: 17,
                real_qpn: 19,
                recvs_consumed: 5,
            }],
            rkeys: vec![(0x100, 0x200), (0x300, 0x400)],
        }
    }

    fn request(opcode: u32, signaled: bool, internal: bool) -> WorkRecord {
        WorkRecord {
            opcode,
            signaled,
            internal,
            ..Default::default()
        }
    }

    fn ring_of(requests: &[WorkRecord]) -> Ring<WorkRecord> {
        let mut r = Ring::new(8);
        for q in requests {
            assert!(r.push(*q).is_ok(), "room");
        }
        r
    }

    #[test]
    fn a_fence_follows_writes_and_atomics_nothing_would_complete() {
        let faa = |signaled| request(IBV_WR_ATOMIC_FETCH_AND_ADD, signaled, false);
        let write = |signaled| request(IBV_WR_RDMA_WRITE, signaled, false);
        let send = |signaled| request(IBV_WR_SEND, signaled, false);
        let read = |signaled| request(IBV_WR_RDMA_READ, signaled, false);
        let fence = request(IBV_WR_RDMA_WRITE, true, true);
        assert!(fence_needed(&ring_of(&[faa(false), write(false)])));
        assert!(fence_needed(&ring_of(&[send(true), faa(false)])));
        assert!(fence_needed(&ring_of(&[faa(false), send(false)])));
        // A signaled request after them proves them executed when it completes.
        assert!(!fence_needed(&ring_of(&[faa(false), send(true)])));
        assert!(!fence_needed(&ring_of(&[faa(true)])));
        // Nothing a replay would repeat, or a fence already behind it.
        assert!(!fence_needed(&ring_of(&[send(false), read(false)])));
        assert!(!fence_needed(&ring_of(&[write(false), fence])));
        assert!(!fence_needed(&ring_of(&[])));
    }

    #[test]
    fn blobs_round_trip_concatenated() {
        let (a, b) = (sample(), Blob::default());
        let mut all = a.encode();
        all.extend(b.encode());
        assert_eq!(Blob::decode_all(&all).unwrap(), vec![a, b]);
    }

    #[test]
    fn damaged_blobs_are_refused() {
        let good = sample().encode();
        for cut in [1, 10, good.len() - 1] {
            assert!(Blob::decode_all(&good[..cut]).is_err(), "cut at {cut}");
        }
        let mut count = good.clone();
        count[HEADER..HEADER + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Blob::decode_all(&count).is_err());
        let mut len = good.clone();
        len[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(Blob::decode_all(&len).is_err());
    }
}
