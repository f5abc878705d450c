//! The data path: the entries of the shadow context's ops table, which the
//! inline verbs of verbs.h (`ibv_post_send`, `ibv_post_recv`,
//! `ibv_post_srq_recv`, `ibv_poll_cq`, `ibv_req_notify_cq`) jump to.
//!
//! Every post is recorded before it reaches the device and every
//! completion retires what it completes, so a checkpoint knows exactly
//! which work requests are outstanding. Until the first restart the
//! application's requests go to the device as they are (RC and UC: no
//! copy); after it, and always for UD (whose address handle is a shadow),
//! a translated copy does.

use std::ffi::{c_int, c_void};

use ckpt_ib_state::sys::*;

use crate::objects::*;
use crate::ring::WorkRecord;
use crate::{Entry, errno_rc};

/// Whether a send of this opcode consumes a receive at the peer.
pub fn consumes_receive(opcode: u32) -> bool {
    matches!(
        opcode,
        IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE_WITH_IMM | IBV_WR_SEND_WITH_INV
    )
}

/// Whether a request of this opcode changes the responder's memory without
/// consuming a receive (RDMA WRITE, atomics): nothing at the peer counts
/// it, so a restart may only re-post one known not to have executed
/// (`restart::drain` makes sure none is left unknown). An RDMA READ
/// changes nothing there, and a receive-consuming one is counted by the
/// peer's receives.
pub fn unreplayable(opcode: u32) -> bool {
    matches!(
        opcode,
        IBV_WR_RDMA_WRITE | IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD
    )
}

/// A name for a request's opcode in messages.
pub fn opcode_name(opcode: u32) -> &'static str {
    match opcode {
        IBV_WR_RDMA_WRITE => "RDMA write",
        IBV_WR_RDMA_WRITE_WITH_IMM => "RDMA write with immediate",
        IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_SEND_WITH_INV => "send",
        IBV_WR_RDMA_READ => "RDMA read",
        IBV_WR_ATOMIC_CMP_AND_SWP => "compare-and-swap",
        IBV_WR_ATOMIC_FETCH_AND_ADD => "fetch-and-add",
        _ => "request",
    }
}

/// Whose a device completion is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Owner {
    /// The application's: returned by `poll_cq`.
    Application,
    /// The layer's own (a drain's fence): hidden.
    Layer,
}

/// Whether the opcode's `wr` union holds an RDMA remote address and key
/// (`rdma.rkey` in the second word), or an atomic's (`atomic.rkey` in the
/// fourth).
fn rkey_word(opcode: u32) -> Option<usize> {
    match opcode {
        IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM | IBV_WR_RDMA_READ => Some(1),
        IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD => Some(3),
        _ => None,
    }
}

/// The ops table every shadow context carries.
pub fn ops() -> ibv_context_ops {
    // SAFETY: an all-zero ops table is valid (every entry is an Option of
    // a function pointer, None).
    let mut ops: ibv_context_ops = unsafe { std::mem::zeroed() };
    ops.poll_cq = Some(poll_cq);
    ops.req_notify_cq = Some(req_notify_cq);
    ops.post_send = Some(post_send);
    ops.post_recv = Some(post_recv);
    ops.post_srq_recv = Some(post_srq_recv);
    ops
}

/// The real context's ops of a real object's context.
///
/// # Safety
/// `ctx` is a live real context.
unsafe fn real_ops(ctx: *mut ibv_context) -> &'static ibv_context_ops {
    // SAFETY: the caller's contract; the table lives as long as the context.
    unsafe { &(*ctx).ops }
}

/// Translates a gather list's lkeys for a post after a restart.
fn translate_sges(pd: &Pd, sges: &[ibv_sge]) -> Vec<ibv_sge> {
    let keys = pd.lkeys.read().unwrap_or_else(|e| e.into_inner());
    sges.iter()
        .map(|s| ibv_sge {
            lkey: keys.get(&s.lkey).copied().unwrap_or(s.lkey),
            ..*s
        })
        .collect()
}

/// Collects a chain's gather list as a slice.
///
/// # Safety
/// `w` is a valid work request whose `sg_list` holds `num_sge` entries.
unsafe fn sges_of<'a>(sg_list: *mut ibv_sge, num_sge: c_int) -> &'a [ibv_sge] {
    let n = usize::try_from(num_sge).unwrap_or(0);
    if n == 0 || sg_list.is_null() {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(sg_list, n) }
}

/// `ibv_post_send` on a shadow QP.
///
/// # Safety
/// The verbs contract: `qp` is a QP this layer created, `wr` a valid chain.
pub unsafe extern "C" fn post_send(
    qp: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad_wr: *mut *mut ibv_send_wr,
) -> c_int {
    let _entry = Entry::new();
    let sqp = qp.cast::<Qp>();
    // SAFETY: the verbs contract (see above): `qp` is the ABI head of a Qp.
    let q = unsafe { &*sqp };
    let mut st = lock(&q.st);
    let ud = q.abi.qp_type == IBV_QPT_UD;
    let mut recorded = 0usize;
    let mut w = wr;
    let mut inline = Vec::new();
    while !w.is_null() {
        // SAFETY: `w` is in the application's valid chain.
        let r = unsafe { &*w };
        // SAFETY: as above, its gather list has `num_sge` entries.
        let sges = unsafe { sges_of(r.sg_list, r.num_sge) };
        inline.clear();
        if r.send_flags & IBV_SEND_INLINE != 0 {
            for s in sges {
                // SAFETY: an inline send's data is read at post time from
                // the addresses given (no key involved): they are valid.
                let data = unsafe {
                    std::slice::from_raw_parts(s.addr as usize as *const u8, s.length as usize)
                };
                inline.extend_from_slice(data);
            }
        }
        let rec = WorkRecord {
            wr_id: r.wr_id,
            opcode: r.opcode,
            send_flags: r.send_flags,
            imm_data: r.imm_data,
            wr: r.wr,
            num_sge: sges.len(),
            inline_len: inline.len(),
            signaled: st.init.sq_sig_all || r.send_flags & IBV_SEND_SIGNALED != 0,
            internal: false,
        };
        if matches!(r.opcode, IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM) {
            st.last_write = Some(RemoteWrite {
                addr: r.wr[0],
                rkey: (r.wr[1] & 0xffff_ffff) as u32,
            });
        }
        if st.sends.record(rec, sges, &inline).is_none() {
            for _ in 0..recorded {
                st.sends.ring.pop_back();
            }
            // SAFETY: `bad_wr` is the caller's out pointer.
            unsafe { *bad_wr = w };
            return libc::ENOMEM;
        }
        recorded += 1;
        w = r.next;
    }
    let real = st.real;
    // SAFETY: `real` is the live real QP of this shadow.
    let post = unsafe { real_ops((*real).context) }.post_send;
    let Some(post) = post else {
        return libc::EOPNOTSUPP;
    };
    let rc;
    let mut failed_at = recorded;
    if !ud && !translating() {
        let mut bad = std::ptr::null_mut();
        // SAFETY: the application's chain, posted unchanged on the real QP.
        rc = unsafe { post(real, wr, &mut bad) };
        if rc != 0 {
            failed_at = index_in_chain(wr, bad);
            // SAFETY: the caller's out pointer.
            unsafe { *bad_wr = bad };
        }
    } else {
        let first = st.sends.ring.len() - recorded;
        let copy = TranslatedSends::build(q, &st, first, recorded);
        let mut chain = copy.chain();
        let mut bad = std::ptr::null_mut();
        // SAFETY: `chain` is a valid chain of translated copies, alive
        // for the call.
        rc = unsafe { post(real, chain.as_mut_ptr(), &mut bad) };
        if rc != 0 {
            failed_at = index_in_chain(chain.as_mut_ptr(), bad);
            let mut orig = wr;
            for _ in 0..failed_at {
                // SAFETY: walking the application's valid chain.
                orig = unsafe { (*orig).next };
            }
            // SAFETY: the caller's out pointer.
            unsafe { *bad_wr = orig };
        }
    }
    for _ in failed_at..recorded {
        st.sends.ring.pop_back();
    }
    rc
}

/// The position of `bad` in the chain starting at `first` (the length of
/// the chain when it is not in it).
fn index_in_chain<T: Chained>(first: *mut T, bad: *mut T) -> usize {
    let mut i = 0;
    let mut w = first;
    while !w.is_null() && w != bad {
        // SAFETY: walking a valid chain.
        w = unsafe { T::next(w) };
        i += 1;
    }
    i
}

/// Work requests linked by `next`.
trait Chained {
    /// # Safety
    /// `p` is a valid request.
    unsafe fn next(p: *mut Self) -> *mut Self;
}

impl Chained for ibv_send_wr {
    unsafe fn next(p: *mut Self) -> *mut Self {
        // SAFETY: the caller's contract.
        unsafe { (*p).next }
    }
}

impl Chained for ibv_recv_wr {
    unsafe fn next(p: *mut Self) -> *mut Self {
        // SAFETY: the caller's contract.
        unsafe { (*p).next }
    }
}

/// Translated copies of recorded sends, ready to post.
pub struct TranslatedSends {
    wrs: Vec<ibv_send_wr>,
    sges: Vec<Vec<ibv_sge>>,
}

impl TranslatedSends {
    /// Copies `count` recorded sends from position `first` of the QP's
    /// send queue, with every id translated to the current real one.
    pub fn build(q: &Qp, st: &QpState, first: usize, count: usize) -> TranslatedSends {
        // SAFETY: the QP's PD outlives it (dealloc_pd fails while a QP uses it).
        let pd = unsafe { &*q.abi.pd.cast::<Pd>() };
        let ids = ids().read().unwrap_or_else(|e| e.into_inner());
        let mut out = TranslatedSends {
            wrs: Vec::with_capacity(count),
            sges: Vec::with_capacity(count),
        };
        for i in first..first + count {
            let rec = *st.sends.ring.get(i).expect("recorded");
            let mut sges = if rec.inline_len > 0 {
                let data = st.sends.inline_of(i);
                vec![ibv_sge {
                    addr: data.as_ptr() as u64,
                    length: u32::try_from(data.len()).unwrap_or(u32::MAX),
                    lkey: 0,
                }]
            } else {
                translate_sges(pd, st.sends.sges_of(i))
            };
            let mut wrw = rec.wr;
            if q.abi.qp_type == IBV_QPT_UD {
                let ah = rec.wr[0] as usize as *mut Ah;
                if !ah.is_null() {
                    // SAFETY: the application passes address handles this
                    // layer created and keeps them while sends use them.
                    let ah = unsafe { &*ah };
                    wrw[0] = lock(&ah.real).0 as u64;
                    let vqpn = (rec.wr[1] & 0xffff_ffff) as u32;
                    let node = NodeAddr::of_av(&ah.attr);
                    if let Some(real) = ids.remote_qpns.get(&(node, vqpn)) {
                        wrw[1] = (rec.wr[1] & !0xffff_ffff) | u64::from(*real);
                    }
                }
            } else if let (Some(word), Some(peer)) = (rkey_word(rec.opcode), &st.peer) {
                let vkey = (rec.wr[word] & 0xffff_ffff) as u32;
                if let Some(real) = peer.rkeys.get(&vkey) {
                    wrw[word] = (rec.wr[word] & !0xffff_ffff) | u64::from(*real);
                }
            }
            let num_sge = c_int::try_from(sges.len()).unwrap_or(0);
            out.wrs.push(ibv_send_wr {
                wr_id: rec.wr_id,
                next: std::ptr::null_mut(),
                sg_list: sges.as_mut_ptr(),
                num_sge,
                opcode: rec.opcode,
                send_flags: rec.send_flags,
                imm_data: rec.imm_data,
                wr: wrw,
                qp_type: 0,
                bind_mw_or_tso: [0; 6],
            });
            out.sges.push(sges);
        }
        out
    }

    /// Links the copies (their gather lists stay where `build` put them).
    pub fn chain(mut self) -> ChainedSends {
        let n = self.wrs.len();
        for i in 0..n {
            self.wrs[i].sg_list = self.sges[i].as_mut_ptr();
        }
        let base = self.wrs.as_mut_ptr();
        for i in 0..n.saturating_sub(1) {
            // SAFETY: both indices are in bounds of `wrs`, which does not
            // move again (it is only borrowed from here on).
            unsafe { (*base.add(i)).next = base.add(i + 1) };
        }
        ChainedSends { inner: self }
    }
}

/// A linked chain of translated sends.
pub struct ChainedSends {
    inner: TranslatedSends,
}

impl ChainedSends {
    pub fn as_mut_ptr(&mut self) -> *mut ibv_send_wr {
        if self.inner.wrs.is_empty() {
            std::ptr::null_mut()
        } else {
            self.inner.wrs.as_mut_ptr()
        }
    }
}

/// Copies of receives, with translated lkeys.
pub struct TranslatedRecvs {
    wrs: Vec<ibv_recv_wr>,
    sges: Vec<Vec<ibv_sge>>,
}

impl TranslatedRecvs {
    pub fn build(pd: &Pd, q: &crate::ring::WorkQueue, first: usize, count: usize) -> Self {
        let mut out = TranslatedRecvs {
            wrs: Vec::with_capacity(count),
            sges: Vec::with_capacity(count),
        };
        for i in first..first + count {
            let rec = *q.ring.get(i).expect("recorded");
            let mut sges = translate_sges(pd, q.sges_of(i));
            out.wrs.push(ibv_recv_wr {
                wr_id: rec.wr_id,
                next: std::ptr::null_mut(),
                sg_list: sges.as_mut_ptr(),
                num_sge: c_int::try_from(sges.len()).unwrap_or(0),
            });
            out.sges.push(sges);
        }
        let base = out.wrs.as_mut_ptr();
        for i in 0..count.saturating_sub(1) {
            // SAFETY: in bounds; `wrs` is not resized again.
            unsafe { (*base.add(i)).next = base.add(i + 1) };
        }
        out
    }

    pub fn as_mut_ptr(&mut self) -> *mut ibv_recv_wr {
        if self.wrs.is_empty() {
            std::ptr::null_mut()
        } else {
            self.wrs.as_mut_ptr()
        }
    }
}

/// Records a receive chain in `queue`; on failure, undoes it and names the
/// request that did not fit.
fn record_recvs(
    queue: &mut crate::ring::WorkQueue,
    wr: *mut ibv_recv_wr,
) -> Result<usize, *mut ibv_recv_wr> {
    let mut recorded = 0;
    let mut w = wr;
    while !w.is_null() {
        // SAFETY: `w` is in the application's valid chain.
        let r = unsafe { &*w };
        // SAFETY: as above.
        let sges = unsafe { sges_of(r.sg_list, r.num_sge) };
        let rec = WorkRecord {
            wr_id: r.wr_id,
            num_sge: sges.len(),
            signaled: true,
            ..Default::default()
        };
        if queue.record(rec, sges, &[]).is_none() {
            for _ in 0..recorded {
                queue.ring.pop_back();
            }
            return Err(w);
        }
        recorded += 1;
        w = r.next;
    }
    Ok(recorded)
}

/// Records a receive chain in `queue` and posts it on a real queue (QP or
/// SRQ) with `post` (none: the provider cannot), translated after a
/// restart; unrecords what the device refused.
///
/// # Safety
/// `wr` is the application's valid chain, `bad_wr` its out pointer;
/// `post` posts on the live real queue.
unsafe fn record_and_post_recvs(
    pd: &Pd,
    queue: &mut crate::ring::WorkQueue,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
    post: Option<impl Fn(*mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
) -> c_int {
    let recorded = match record_recvs(queue, wr) {
        Ok(n) => n,
        Err(bad) => {
            // SAFETY: the caller's out pointer.
            unsafe { *bad_wr = bad };
            return libc::ENOMEM;
        }
    };
    let Some(post) = post else {
        for _ in 0..recorded {
            queue.ring.pop_back();
        }
        return libc::EOPNOTSUPP;
    };
    let mut failed_at = recorded;
    let mut bad = std::ptr::null_mut();
    let rc = if translating() {
        let first = queue.ring.len() - recorded;
        let mut copy = TranslatedRecvs::build(pd, queue, first, recorded);
        let rc = post(copy.as_mut_ptr(), &mut bad);
        if rc != 0 {
            failed_at = index_in_chain(copy.as_mut_ptr(), bad);
            let mut orig = wr;
            for _ in 0..failed_at {
                // SAFETY: walking the application's valid chain.
                orig = unsafe { (*orig).next };
            }
            bad = orig;
        }
        rc
    } else {
        let rc = post(wr, &mut bad);
        if rc != 0 {
            failed_at = index_in_chain(wr, bad);
        }
        rc
    };
    if rc != 0 {
        // SAFETY: the caller's out pointer.
        unsafe { *bad_wr = bad };
        for _ in failed_at..recorded {
            queue.ring.pop_back();
        }
    }
    rc
}

/// `ibv_post_recv` on a shadow QP.
///
/// # Safety
/// The verbs contract, as for [`post_send`].
pub unsafe extern "C" fn post_recv(
    qp: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    let _entry = Entry::new();
    // SAFETY: the verbs contract: `qp` is the ABI head of a Qp.
    let q = unsafe { &*qp.cast::<Qp>() };
    // SAFETY: a QP's PD outlives it.
    let pd = unsafe { &*q.abi.pd.cast::<Pd>() };
    let mut st = lock(&q.st);
    let real = st.real;
    // SAFETY: the live real QP's context.
    let post = unsafe { real_ops((*real).context) }.post_recv;
    // SAFETY: the caller's chain and out pointer; `post` targets the real
    // QP (the closure is only called while it lives).
    unsafe {
        record_and_post_recvs(
            pd,
            &mut st.recvs,
            wr,
            bad_wr,
            post.map(|f| move |w, b| f(real, w, b)),
        )
    }
}

/// `ibv_post_srq_recv` on a shadow SRQ.
///
/// # Safety
/// The verbs contract, as for [`post_send`].
pub unsafe extern "C" fn post_srq_recv(
    srq: *mut c_void,
    wr: *mut ibv_recv_wr,
    bad_wr: *mut *mut ibv_recv_wr,
) -> c_int {
    let _entry = Entry::new();
    // SAFETY: the verbs contract: `srq` is the ABI head of an Srq.
    let s = unsafe { &*srq.cast::<Srq>() };
    // SAFETY: an SRQ's PD outlives it.
    let pd = unsafe { &*s.abi.pd.cast::<Pd>() };
    let mut st = lock(&s.st);
    let real = st.real;
    // SAFETY: the live real SRQ's context.
    let post = unsafe { real_ops((*real).context) }.post_srq_recv;
    // SAFETY: as in post_recv, on the real SRQ.
    unsafe {
        record_and_post_recvs(
            pd,
            &mut st.recvs,
            wr,
            bad_wr,
            post.map(|f| move |w, b| f(real.cast(), w, b)),
        )
    }
}

/// Retires what a device completion completes, rewrites its ids to the
/// virtual ones and says whose it is. Called with the CQ's lock held.
pub fn absorb(cq: &CqState, wc: &mut ibv_wc) -> Owner {
    let Some(qp) = cq.qps.get(&wc.qp_num).copied() else {
        return Owner::Application;
    };
    // SAFETY: QPs are unregistered from their CQs before they are freed,
    // under the CQ's lock, which the caller holds.
    let q = unsafe { &*qp.0 };
    let mut st = lock(&q.st);
    let ok = wc.status == IBV_WC_SUCCESS;
    let mut owner = Owner::Application;
    if wc.opcode & IBV_WC_RECV == 0 {
        if !ok {
            // A flushed or failed request: each gets its own completion.
            if st.sends.ring.pop_front().is_some_and(|r| r.internal) {
                owner = Owner::Layer;
            }
        } else {
            while let Some(rec) = st.sends.ring.pop_front() {
                if consumes_receive(rec.opcode) {
                    st.consuming_sends_done += 1;
                }
                if rec.signaled {
                    if rec.internal {
                        owner = Owner::Layer;
                    }
                    break;
                }
            }
        }
    } else {
        if st.init.srq.is_null() {
            st.recvs.ring.pop_front();
        } else {
            // SAFETY: a QP's SRQ outlives it.
            let srq = unsafe { &*st.init.srq };
            let mut s = lock(&srq.st);
            let at = (0..s.recvs.ring.len())
                .find(|&i| s.recvs.ring.get(i).is_some_and(|r| r.wr_id == wc.wr_id));
            if let Some(i) = at {
                s.recvs.remove(i);
            }
        }
        if ok {
            st.recvs_consumed += 1;
        }
    }
    wc.qp_num = q.abi.qp_num;
    if q.abi.qp_type == IBV_QPT_UD && translating() {
        let ids = ids().read().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = ids.remote_qpn_virtual.get(&(wc.slid, wc.src_qp)) {
            wc.src_qp = *v;
        }
    }
    owner
}

/// `ibv_poll_cq` on a shadow CQ: drained completions first, then the
/// device's.
///
/// # Safety
/// The verbs contract: `cq` is a CQ this layer created, `wc` has room for
/// `num_entries` completions.
pub unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    let _entry = Entry::new();
    // SAFETY: the verbs contract: `cq` is the ABI head of a Cq.
    let c = unsafe { &*cq.cast::<Cq>() };
    let mut st = lock(&c.st);
    let want = usize::try_from(num_entries).unwrap_or(0);
    let mut got = 0usize;
    while got < want {
        let Some(w) = st.drained.pop_front() else {
            break;
        };
        // SAFETY: `got < want`, within the caller's array.
        unsafe { *wc.add(got) = w };
        got += 1;
    }
    // A kick's or a fence's completion takes a slot of the device's batch
    // and is hidden: the device is polled again for the slots it took. Else a
    // completion behind it would be left for an event that never comes
    // (the application armed the CQ before polling, with it already there).
    while got < want {
        let real = st.real;
        // SAFETY: the live real CQ's context.
        let Some(poll) = (unsafe { real_ops((*real).context) }).poll_cq else {
            return errno_rc(libc::EOPNOTSUPP);
        };
        let rest = c_int::try_from(want - got).unwrap_or(c_int::MAX);
        // SAFETY: the caller's array has room for `rest` more.
        let n = unsafe { poll(real, rest, wc.add(got)) };
        if n < 0 {
            return if got > 0 {
                c_int::try_from(got).unwrap_or(c_int::MAX)
            } else {
                n
            };
        }
        let n = usize::try_from(n).unwrap_or(0);
        let mut kept = got;
        for i in got..got + n {
            // SAFETY: filled by the device just now (`kept <= i`).
            let w = unsafe { &mut *wc.add(i) };
            if Kick::owns(&st.kicks, w.qp_num) || absorb(&st, w) == Owner::Layer {
                continue;
            }
            // SAFETY: both within the caller's array.
            unsafe { *wc.add(kept) = *wc.add(i) };
            kept += 1;
        }
        got = kept;
        if n < rest as usize {
            break;
        }
    }
    c_int::try_from(got).unwrap_or(c_int::MAX)
}

/// `ibv_req_notify_cq` on a shadow CQ.
///
/// # Safety
/// The verbs contract: `cq` is a CQ this layer created.
pub unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    let _entry = Entry::new();
    // SAFETY: the verbs contract.
    let c = unsafe { &*cq.cast::<Cq>() };
    let mut st = lock(&c.st);
    st.armed = Some(solicited_only);
    let real = st.real;
    // SAFETY: the live real CQ's context.
    match (unsafe { real_ops((*real).context) }).req_notify_cq {
        // SAFETY: arming the real CQ.
        Some(f) => unsafe { f(real, solicited_only) },
        None => libc::EOPNOTSUPP,
    }
}
