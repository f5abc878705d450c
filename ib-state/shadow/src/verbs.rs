//! The exported libibverbs entry points of the control path.
//!
//! Each takes shadow objects from the application, calls the real verb on
//! the real objects they stand for, and keeps what a restart needs. The
//! exported verbs that take an object but cannot be checkpointed yet fail
//! with `EOPNOTSUPP` and say so on stderr, rather than reach libibverbs
//! with a shadow object it would misread.

#![allow(clippy::missing_safety_doc)]

use std::collections::HashMap;
use std::ffi::{CStr, c_int, c_void};
use std::sync::{Mutex, RwLock};

use ckpt_ib_state::sys::*;

use crate::datapath;
use crate::objects::*;
use crate::real::real;
use crate::ring::{CompletionQueue, WorkQueue};
use crate::{Entry, set_errno, unsupported};

/// Extra room in a CQ's drained queue beyond its depth: completions made
/// up at a restart for sends the peer had received.
const DRAINED_SLACK: usize = 64;

fn shadow<T>(p: *mut impl Sized) -> &'static T {
    // SAFETY: callers pass pointers this layer handed out (the verbs
    // contract: objects are used only between their create and destroy).
    unsafe { &*p.cast::<T>() }
}

fn cq_real(cq: *mut ibv_cq) -> *mut ibv_cq {
    if cq.is_null() {
        return cq;
    }
    lock(&shadow::<Cq>(cq).st).real
}

fn srq_real(srq: *mut c_void) -> *mut c_void {
    if srq.is_null() {
        return srq;
    }
    lock(&shadow::<Srq>(srq).st).real.cast()
}

fn channel_real(ch: *mut ibv_comp_channel) -> *mut ibv_comp_channel {
    if ch.is_null() {
        return ch;
    }
    lock(&shadow::<Channel>(ch).real).0
}

fn ctx_real(ctx: *mut ibv_context) -> *mut ibv_context {
    lock(&shadow::<Context>(ctx).st).real
}

fn pd_real(pd: *mut ibv_pd) -> *mut ibv_pd {
    shadow::<Pd>(pd)
        .real
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .0
}

/// Rewrites an address vector's virtual destination to where that port
/// is now.
pub fn translate_av(av: &mut ibv_ah_attr, ids: &Ids) {
    if let Some(now) = ids.nodes.get(&NodeAddr::of_av(av)) {
        if av.is_global != 0 {
            av.grh.dgid.raw = now.gid;
        } else {
            av.dlid = now.lid;
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context {
    let _entry = Entry::new();
    // SAFETY: the application's device from ibv_get_device_list.
    let rctx = unsafe { (real().ibv_open_device)(device) };
    if rctx.is_null() {
        return rctx;
    }
    // SAFETY: a device's name is a nul-terminated string it owns.
    let name = unsafe { CStr::from_ptr((real().ibv_get_device_name)(device)) }.to_owned();
    // SAFETY: `rctx` is the live real context just opened.
    let r = unsafe { &*rctx };
    let ctx = leak(Context {
        abi: ibv_context {
            device,
            ops: datapath::ops(),
            cmd_fd: r.cmd_fd,
            async_fd: r.async_fd,
            num_comp_vectors: r.num_comp_vectors,
            // SAFETY: an all-zero pthread mutex is PTHREAD_MUTEX_INITIALIZER.
            mutex: unsafe { std::mem::zeroed() },
            // Not the extended-verbs marker: verbs.h's inline extended
            // verbs then fall back to exported entries (or fail) instead
            // of reading a verbs_context this layer does not have.
            abi_compat: std::ptr::null_mut(),
        },
        st: Mutex::new(ContextState {
            real: rctx,
            device_name: name,
            gids: HashMap::new(),
            lids: HashMap::new(),
        }),
    });
    registry().contexts.push(Ptr(ctx));
    ctx.cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_close_device(context: *mut ibv_context) -> c_int {
    let _entry = Entry::new();
    let rctx = ctx_real(context);
    // SAFETY: the live real context.
    let rc = unsafe { (real().ibv_close_device)(rctx) };
    if rc == 0 {
        forget(&mut registry().contexts, context.cast::<Context>());
        // SAFETY: made by ibv_open_device; the application gave it up.
        unsafe { free(context.cast::<Context>()) };
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_device(context: *mut ibv_context, attr: *mut c_void) -> c_int {
    let _entry = Entry::new();
    // SAFETY: forwarding the caller's out pointer.
    unsafe { (real().ibv_query_device)(ctx_real(context), attr) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_port(
    context: *mut ibv_context,
    port_num: u8,
    attr: *mut ibv_port_attr,
) -> c_int {
    let _entry = Entry::new();
    let c = shadow::<Context>(context);
    let mut st = lock(&c.st);
    // SAFETY: forwarding the caller's out pointer.
    let rc = unsafe { (real().ibv_query_port)(st.real, port_num, attr) };
    if rc == 0 {
        // SAFETY: filled by the real verb.
        let a = unsafe { &mut *attr };
        a.lid = *st.lids.entry(port_num).or_insert(a.lid);
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_gid(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    let _entry = Entry::new();
    let c = shadow::<Context>(context);
    let mut st = lock(&c.st);
    // SAFETY: forwarding the caller's out pointer.
    let rc = unsafe { (real().ibv_query_gid)(st.real, port_num, index, gid) };
    if rc == 0 {
        // SAFETY: filled by the real verb.
        let g = unsafe { &mut *gid };
        // An unset GID is not remembered: rxe fills its table as
        // addresses appear.
        if g.raw != [0; 16] {
            *g = *st.gids.entry((port_num, index)).or_insert(*g);
        }
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_pkey(
    context: *mut ibv_context,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    let _entry = Entry::new();
    // SAFETY: forwarding the caller's out pointer.
    unsafe { (real().ibv_query_pkey)(ctx_real(context), port_num, index, pkey) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd {
    let _entry = Entry::new();
    // SAFETY: the live real context.
    let rpd = unsafe { (real().ibv_alloc_pd)(ctx_real(context)) };
    if rpd.is_null() {
        return rpd;
    }
    let pd = leak(Pd {
        abi: ibv_pd {
            context,
            // SAFETY: the live real PD.
            handle: unsafe { (*rpd).handle },
        },
        real: RwLock::new(Ptr(rpd)),
        lkeys: RwLock::new(HashMap::new()),
    });
    registry().pds.push(Ptr(pd));
    pd.cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    let _entry = Entry::new();
    // SAFETY: the live real PD.
    let rc = unsafe { (real().ibv_dealloc_pd)(pd_real(pd)) };
    // SAFETY: made by ibv_alloc_pd, given up with this call.
    unsafe { destroyed(rc, pd.cast::<Pd>(), |r| &mut r.pds) }
}

/// Picks the virtual key for a key the device just gave: itself, unless a
/// restart left a live virtual key of that value in this process.
fn fresh_virtual_key(real_key: u32, taken: &dyn Fn(u32) -> bool) -> u32 {
    let mut k = real_key;
    // Keys are an index and an 8-bit tag: step the index.
    while taken(k) {
        k = k.wrapping_add(0x100);
    }
    k
}

fn register_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    let _entry = Entry::new();
    // SAFETY: the live real PD; the range is the application's.
    let rmr = unsafe { (real().ibv_reg_mr_iova2)(pd_real(pd), addr, length, iova, access) };
    if rmr.is_null() {
        return rmr;
    }
    // SAFETY: the live real MR.
    let r = unsafe { &*rmr };
    let mut reg = registry();
    let (mut lkey, mut rkey) = (r.lkey, r.rkey);
    if translating() {
        let live: Vec<(u32, u32)> = reg
            .mrs
            .iter()
            // SAFETY: registered MRs are live.
            .map(|m| unsafe { ((*m.0).abi.lkey, (*m.0).abi.rkey) })
            .collect();
        lkey = fresh_virtual_key(r.lkey, &|k| live.iter().any(|l| l.0 == k || l.1 == k));
        rkey = fresh_virtual_key(r.rkey, &|k| live.iter().any(|l| l.0 == k || l.1 == k));
        shadow::<Pd>(pd)
            .lkeys
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(lkey, r.lkey);
    }
    let mr = leak(Mr {
        abi: ibv_mr {
            context: shadow::<Pd>(pd).abi.context,
            pd,
            addr: r.addr,
            length: r.length,
            handle: r.handle,
            lkey,
            rkey,
        },
        real: Mutex::new(Ptr(rmr)),
        iova,
        access,
    });
    reg.mrs.push(Ptr(mr));
    mr.cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    register_mr(pd, addr, length, addr as u64, access as u32)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    register_mr(pd, addr, length, iova, access as u32)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    register_mr(pd, addr, length, iova, access)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    let _entry = Entry::new();
    let m = shadow::<Mr>(mr);
    let rmr = lock(&m.real).0;
    // SAFETY: the live real MR.
    let rc = unsafe { (real().ibv_dereg_mr)(rmr) };
    if rc == 0 {
        shadow::<Pd>(m.abi.pd)
            .lkeys
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&m.abi.lkey);
        forget(&mut registry().mrs, mr.cast::<Mr>());
        // SAFETY: made by register_mr, given up.
        unsafe { free(mr.cast::<Mr>()) };
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_comp_channel(
    context: *mut ibv_context,
) -> *mut ibv_comp_channel {
    let _entry = Entry::new();
    // SAFETY: the live real context.
    let rch = unsafe { (real().ibv_create_comp_channel)(ctx_real(context)) };
    if rch.is_null() {
        return rch;
    }
    let ch = leak(Channel {
        abi: ibv_comp_channel {
            context,
            // SAFETY: the live real channel.
            fd: unsafe { (*rch).fd },
            refcnt: 0,
        },
        real: Mutex::new(Ptr(rch)),
    });
    registry().channels.push(Ptr(ch));
    ch.cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut ibv_comp_channel) -> c_int {
    let _entry = Entry::new();
    // SAFETY: the live real channel.
    let rc = unsafe { (real().ibv_destroy_comp_channel)(channel_real(channel)) };
    // SAFETY: made by ibv_create_comp_channel, given up with this call.
    unsafe { destroyed(rc, channel.cast::<Channel>(), |r| &mut r.channels) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    let _entry = Entry::new();
    let cq = leak(Cq {
        abi: ibv_cq {
            context,
            channel: channel.cast(),
            cq_context,
            handle: 0,
            cqe: 0,
            // SAFETY: all-zero pthread objects are their static initialisers.
            mutex: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            cond: unsafe { std::mem::zeroed() },
            comp_events_completed: 0,
            async_events_completed: 0,
        },
        st: Mutex::new(CqState {
            real: std::ptr::null_mut(),
            channel: channel.cast(),
            comp_vector,
            drained: CompletionQueue::new(1),
            qps: QpnMap::default(),
            armed: None,
            unacked_events: 0,
            kicks: Vec::new(),
        }),
    });
    // The real CQ's context is the shadow: completion events name it.
    // SAFETY: the live real context and channel.
    let rcq = unsafe {
        (real().ibv_create_cq)(
            ctx_real(context),
            cqe,
            cq.cast(),
            channel_real(channel),
            comp_vector,
        )
    };
    if rcq.is_null() {
        let e = crate::errno();
        // SAFETY: just made, never handed out.
        unsafe { free(cq) };
        set_errno(e);
        return std::ptr::null_mut();
    }
    // SAFETY: `cq` is ours alone until returned; `rcq` is live.
    unsafe {
        (*cq).abi.handle = (*rcq).handle;
        (*cq).abi.cqe = (*rcq).cqe;
        let mut st = lock(&(*cq).st);
        st.real = rcq;
        let depth = usize::try_from((*rcq).cqe).unwrap_or(0);
        st.drained = CompletionQueue::new(depth * 2 + DRAINED_SLACK);
    }
    registry().cqs.push(Ptr(cq));
    cq.cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    let _entry = Entry::new();
    let rc = {
        let mut st = lock(&shadow::<Cq>(cq).st);
        if !st.qps.is_empty() {
            return libc::EBUSY;
        }
        // The layer's own QPs on it go first: the device would refuse.
        for k in &mut st.kicks {
            let rc = k.destroy();
            if rc != 0 {
                return rc;
            }
        }
        st.kicks.clear();
        // SAFETY: the live real CQ.
        unsafe { (real().ibv_destroy_cq)(st.real) }
    };
    // SAFETY: made by ibv_create_cq, given up with this call.
    unsafe { destroyed(rc, cq.cast::<Cq>(), |r| &mut r.cqs) }
}

/// The wait is not counted as inside a verb: it blocks until an event
/// comes, and a checkpoint may freeze the thread there (after a restart the
/// read goes on on the new channel, whose descriptor has the same number).
/// The bookkeeping after it is counted, so no thread is ever frozen
/// holding a CQ's lock, which the drain takes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut ibv_comp_channel,
    cq: *mut *mut ibv_cq,
    cq_context: *mut *mut c_void,
) -> c_int {
    let mut rcq = std::ptr::null_mut();
    let mut shadow_ptr = std::ptr::null_mut();
    // SAFETY: the live real channel; the out pointers are ours.
    let rc = unsafe { (real().ibv_get_cq_event)(channel_real(channel), &mut rcq, &mut shadow_ptr) };
    if rc != 0 {
        return rc;
    }
    let _entry = Entry::new();
    let c = shadow::<Cq>(shadow_ptr);
    let mut st = lock(&c.st);
    // A thread frozen after the read and before this point carries an
    // event of the real CQ a restart has since replaced. The new CQ never
    // reported it: counting it would make the application's final ack one
    // more than the new CQ reported, and libibverbs' destroy waits for the
    // two to be equal, forever. The new CQ stays armed (the restart armed
    // it again), so the application's next wait still gets its event.
    if rcq == st.real {
        st.unacked_events += 1;
        st.armed = None;
    }
    // SAFETY: the caller's out pointers.
    unsafe {
        *cq = shadow_ptr.cast();
        *cq_context = c.abi.cq_context;
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, nevents: u32) {
    let _entry = Entry::new();
    let mut st = lock(&shadow::<Cq>(cq).st);
    // Events read from a CQ a restart replaced are not the new one's.
    let n = nevents.min(st.unacked_events);
    st.unacked_events -= n;
    if n > 0 {
        // SAFETY: the live real CQ.
        unsafe { (real().ibv_ack_cq_events)(st.real, n) };
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_qp(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_qp_init_attr,
) -> *mut ibv_qp {
    let _entry = Entry::new();
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *init_attr };
    let init = QpInit {
        send_cq: a.send_cq.cast(),
        recv_cq: a.recv_cq.cast(),
        srq: a.srq.cast(),
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all != 0,
    };
    let qp = leak(Qp {
        abi: ibv_qp {
            context: shadow::<Pd>(pd).abi.context,
            qp_context: a.qp_context,
            pd,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            handle: 0,
            qp_num: 0,
            state: IBV_QPS_RESET,
            qp_type: a.qp_type,
            // SAFETY: all-zero pthread objects are their static initialisers.
            mutex: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            cond: unsafe { std::mem::zeroed() },
            events_completed: 0,
        },
        st: Mutex::new(QpState {
            real: std::ptr::null_mut(),
            init,
            history: Vec::new(),
            sends: WorkQueue::new(0, 0, 0),
            recvs: WorkQueue::new(0, 0, 0),
            consuming_sends_done: 0,
            recvs_consumed: 0,
            peer: None,
            last_write: None,
        }),
    });
    let rqp = create_real_qp(pd_real(pd), qp, &init);
    if rqp.is_null() {
        let e = crate::errno();
        // SAFETY: just made, never handed out.
        unsafe { free(qp) };
        set_errno(e);
        return std::ptr::null_mut();
    }
    // SAFETY: `qp` is ours alone until returned; `rqp` is live.
    let cap = unsafe {
        (*qp).abi.handle = (*rqp).handle;
        (*qp).abi.qp_num = (*rqp).qp_num;
        (*qp).abi.state = (*rqp).state;
        let mut st = lock(&(*qp).st);
        st.real = rqp;
        st.init.cap
    };
    a.cap = cap;
    attach_to_cqs(qp, &init, 0);
    registry().qps.push(Ptr(qp));
    qp.cast()
}

/// Creates the device QP for a shadow (at creation and at a restart) and
/// sizes its bookkeeping to the capacities the device granted.
pub(crate) fn create_real_qp(rpd: *mut ibv_pd, qp: *mut Qp, init: &QpInit) -> *mut ibv_qp {
    let mut ra = ibv_qp_init_attr {
        // The real QP's context is the shadow: async events name it.
        qp_context: qp.cast(),
        send_cq: cq_real(init.send_cq.cast()),
        recv_cq: cq_real(init.recv_cq.cast()),
        srq: srq_real(init.srq.cast()),
        cap: init.cap,
        qp_type: init.qp_type,
        sq_sig_all: c_int::from(init.sq_sig_all),
    };
    // SAFETY: valid attributes naming live real objects.
    let rqp = unsafe { (real().ibv_create_qp)(rpd, &mut ra) };
    if !rqp.is_null() {
        // SAFETY: `qp` is a live shadow.
        let mut st = lock(unsafe { &(*qp).st });
        if st.history.is_empty() && st.sends.ring.is_empty() && st.recvs.ring.is_empty() {
            let cap = ra.cap;
            st.init.cap = cap;
            st.sends = WorkQueue::new(
                cap.max_send_wr as usize,
                cap.max_send_sge as usize,
                cap.max_inline_data as usize,
            );
            st.recvs = WorkQueue::new(cap.max_recv_wr as usize, cap.max_recv_sge as usize, 0);
        }
    }
    rqp
}

/// Lets the QP's CQs find it by its real number (`old` is the number it
/// had before a restart, 0 if none).
pub(crate) fn attach_to_cqs(qp: *mut Qp, init: &QpInit, old: u32) {
    // SAFETY: `qp` is live.
    let real_num = unsafe { (*lock(&(*qp).st).real).qp_num };
    for cq in [init.send_cq, init.recv_cq] {
        if cq.is_null() {
            continue;
        }
        // SAFETY: a QP's CQs outlive it.
        let mut st = lock(unsafe { &(*cq).st });
        if old != 0 {
            st.qps.remove(&old);
        }
        st.qps.insert(real_num, Ptr(qp));
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
) -> c_int {
    let _entry = Entry::new();
    let q = shadow::<Qp>(qp);
    let mut st = lock(&q.st);
    // SAFETY: the caller's attributes.
    let virt = unsafe { *attr };
    let mut r = virt;
    if translating() {
        let ids = ids().read().unwrap_or_else(|e| e.into_inner());
        translate_modify(&mut r, attr_mask, &st.history, &ids);
    }
    // SAFETY: the live real QP, a local copy of the attributes.
    let rc = unsafe { (real().ibv_modify_qp)(st.real, &mut r, attr_mask) };
    if rc == 0 {
        let ctx = shadow::<Context>(q.abi.context);
        if attr_mask & IBV_QP_PORT != 0 {
            remember_port(ctx, virt.port_num, None);
        }
        if attr_mask & IBV_QP_AV != 0 {
            let av = virt.ah_attr;
            let index = (av.is_global != 0).then_some(c_int::from(av.grh.sgid_index));
            remember_port(ctx, av.port_num, index);
        }
        st.history.push(Modify {
            attr: virt,
            mask: attr_mask,
        });
        // SAFETY: the live real QP; the shadow's state mirrors it.
        unsafe { (*qp).state = (*st.real).state };
    }
    rc
}

/// Makes sure the port's LID (and the GID at `gid_index`) as the
/// application sees them are remembered: a restart tells the peers where
/// they are now.
fn remember_port(ctx: &Context, port: u8, gid_index: Option<c_int>) {
    let mut st = lock(&ctx.st);
    if !st.lids.contains_key(&port) {
        let mut attr = ibv_port_attr::default();
        // SAFETY: the live real context, a local out struct.
        if unsafe { (real().ibv_query_port)(st.real, port, &mut attr) } == 0 {
            st.lids.insert(port, attr.lid);
        }
    }
    if let Some(i) = gid_index
        && !st.gids.contains_key(&(port, i))
    {
        let mut gid = ibv_gid::default();
        // SAFETY: as above.
        if unsafe { (real().ibv_query_gid)(st.real, port, i, &mut gid) } == 0 {
            st.gids.insert((port, i), gid);
        }
    }
}

/// The destination (virtual address, virtual QPN) the QP was last given.
pub fn destination(history: &[Modify]) -> (Option<NodeAddr>, Option<u32>) {
    let mut node = None;
    let mut qpn = None;
    for m in history {
        if m.mask & IBV_QP_AV != 0 {
            node = Some(NodeAddr::of_av(&m.attr.ah_attr));
        }
        if m.mask & IBV_QP_DEST_QPN != 0 {
            qpn = Some(m.attr.dest_qp_num);
        }
    }
    (node, qpn)
}

/// Rewrites a `modify_qp`'s virtual ids (destination port and QPN) to the
/// current real ones.
pub fn translate_modify(a: &mut ibv_qp_attr, mask: c_int, history: &[Modify], ids: &Ids) {
    let (mut node, _) = destination(history);
    if mask & IBV_QP_AV != 0 {
        node = Some(NodeAddr::of_av(&a.ah_attr));
        translate_av(&mut a.ah_attr, ids);
    }
    if mask & IBV_QP_ALT_PATH != 0 {
        translate_av(&mut a.alt_ah_attr, ids);
    }
    if mask & IBV_QP_DEST_QPN != 0
        && let Some(n) = node
        && let Some(real) = ids.remote_qpns.get(&(n, a.dest_qp_num))
    {
        a.dest_qp_num = *real;
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    attr_mask: c_int,
    init_attr: *mut ibv_qp_init_attr,
) -> c_int {
    let _entry = Entry::new();
    let q = shadow::<Qp>(qp);
    let st = lock(&q.st);
    // SAFETY: forwarding the caller's out pointers.
    let rc = unsafe { (real().ibv_query_qp)(st.real, attr, attr_mask, init_attr) };
    if rc != 0 {
        return rc;
    }
    // SAFETY: filled by the real verb.
    let (a, i) = unsafe { (&mut *attr, &mut *init_attr) };
    i.qp_context = q.abi.qp_context;
    i.send_cq = q.abi.send_cq;
    i.recv_cq = q.abi.recv_cq;
    i.srq = q.abi.srq;
    // The ids the application set, not the ones a restart put in.
    for m in &st.history {
        if m.mask & IBV_QP_AV != 0 {
            a.ah_attr = m.attr.ah_attr;
        }
        if m.mask & IBV_QP_ALT_PATH != 0 {
            a.alt_ah_attr = m.attr.alt_ah_attr;
        }
        if m.mask & IBV_QP_DEST_QPN != 0 {
            a.dest_qp_num = m.attr.dest_qp_num;
        }
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int {
    let _entry = Entry::new();
    let q = shadow::<Qp>(qp);
    let (rqp, init) = {
        let st = lock(&q.st);
        (st.real, st.init)
    };
    // SAFETY: the live real QP.
    let real_num = unsafe { (*rqp).qp_num };
    // Unregistered from the CQs first, under their locks: a concurrent
    // poll must not find a QP being freed.
    for cq in [init.send_cq, init.recv_cq] {
        if !cq.is_null() {
            // SAFETY: a QP's CQs outlive it.
            lock(unsafe { &(*cq).st }).qps.remove(&real_num);
        }
    }
    // SAFETY: the live real QP.
    let rc = unsafe { (real().ibv_destroy_qp)(rqp) };
    if rc == 0 {
        forget(&mut registry().qps, qp.cast::<Qp>());
        // SAFETY: made by ibv_create_qp, given up.
        unsafe { free(qp.cast::<Qp>()) };
    } else {
        attach_to_cqs(qp.cast(), &init, 0);
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_srq(
    pd: *mut ibv_pd,
    init_attr: *mut ibv_srq_init_attr,
) -> *mut ibv_srq {
    let _entry = Entry::new();
    // SAFETY: the caller's attributes.
    let a = unsafe { &mut *init_attr };
    let srq = leak(Srq {
        abi: ibv_srq {
            context: shadow::<Pd>(pd).abi.context,
            srq_context: a.srq_context,
            pd,
            handle: 0,
            // SAFETY: all-zero pthread objects are their static initialisers.
            mutex: unsafe { std::mem::zeroed() },
            // SAFETY: as above.
            cond: unsafe { std::mem::zeroed() },
            events_completed: 0,
        },
        st: Mutex::new(SrqState {
            real: std::ptr::null_mut(),
            attr: a.attr,
            recvs: WorkQueue::new(0, 0, 0),
        }),
    });
    let mut ra = ibv_srq_init_attr {
        srq_context: srq.cast(),
        attr: a.attr,
    };
    // SAFETY: the live real PD, valid attributes.
    let rsrq = unsafe { (real().ibv_create_srq)(pd_real(pd), &mut ra) };
    if rsrq.is_null() {
        let e = crate::errno();
        // SAFETY: just made, never handed out.
        unsafe { free(srq) };
        set_errno(e);
        return std::ptr::null_mut();
    }
    a.attr = ra.attr;
    // SAFETY: ours alone until returned; `rsrq` is live.
    unsafe {
        (*srq).abi.handle = (*rsrq).handle;
        let mut st = lock(&(*srq).st);
        st.real = rsrq;
        st.attr = ra.attr;
        st.recvs = WorkQueue::new(ra.attr.max_wr as usize, ra.attr.max_sge as usize, 0);
    }
    registry().srqs.push(Ptr(srq));
    srq.cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_modify_srq(
    srq: *mut ibv_srq,
    attr: *mut ibv_srq_attr,
    mask: c_int,
) -> c_int {
    let _entry = Entry::new();
    let mut st = lock(&shadow::<Srq>(srq).st);
    // SAFETY: the live real SRQ, the caller's attributes.
    let rc = unsafe { (real().ibv_modify_srq)(st.real, attr, mask) };
    if rc == 0 {
        // IBV_SRQ_LIMIT is the only attribute a restart has to set again.
        const IBV_SRQ_LIMIT: c_int = 1 << 1;
        if mask & IBV_SRQ_LIMIT != 0 {
            // SAFETY: the caller's attributes.
            st.attr.srq_limit = unsafe { (*attr).srq_limit };
        }
    }
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut ibv_srq, attr: *mut ibv_srq_attr) -> c_int {
    let _entry = Entry::new();
    let st = lock(&shadow::<Srq>(srq).st);
    // SAFETY: the live real SRQ, the caller's out pointer.
    unsafe { (real().ibv_query_srq)(st.real, attr) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut ibv_srq) -> c_int {
    let _entry = Entry::new();
    let rsrq = lock(&shadow::<Srq>(srq).st).real;
    // SAFETY: the live real SRQ.
    let rc = unsafe { (real().ibv_destroy_srq)(rsrq) };
    // SAFETY: made by ibv_create_srq, given up with this call.
    unsafe { destroyed(rc, srq.cast::<Srq>(), |r| &mut r.srqs) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    let _entry = Entry::new();
    // SAFETY: the caller's attributes.
    let virt = unsafe { *attr };
    let mut r = virt;
    if translating() {
        translate_av(&mut r, &ids().read().unwrap_or_else(|e| e.into_inner()));
    }
    // SAFETY: the live real PD, a local copy.
    let rah = unsafe { (real().ibv_create_ah)(pd_real(pd), &mut r) };
    if rah.is_null() {
        return rah;
    }
    let ah = leak(Ah {
        abi: ibv_ah {
            context: shadow::<Pd>(pd).abi.context,
            pd,
            // SAFETY: the live real AH.
            handle: unsafe { (*rah).handle },
        },
        attr: virt,
        real: Mutex::new(Ptr(rah)),
    });
    registry().ahs.push(Ptr(ah));
    ah.cast()
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut ibv_ah) -> c_int {
    let _entry = Entry::new();
    let rah = lock(&shadow::<Ah>(ah).real).0;
    // SAFETY: the live real AH.
    let rc = unsafe { (real().ibv_destroy_ah)(rah) };
    // SAFETY: made by ibv_create_ah, given up with this call.
    unsafe { destroyed(rc, ah.cast::<Ah>(), |r| &mut r.ahs) }
}

/// Which kind of object an async event names.
enum EventSubject {
    Cq,
    Qp,
    Srq,
    Port,
}

fn subject(event_type: u32) -> EventSubject {
    match event_type {
        IBV_EVENT_CQ_ERR => EventSubject::Cq,
        IBV_EVENT_QP_FATAL..=IBV_EVENT_PATH_MIG_ERR | IBV_EVENT_QP_LAST_WQE_REACHED => {
            EventSubject::Qp
        }
        IBV_EVENT_SRQ_ERR | IBV_EVENT_SRQ_LIMIT_REACHED => EventSubject::Srq,
        _ => EventSubject::Port,
    }
}

/// Blocks like [`ibv_get_cq_event`], so not counted as inside a verb.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_get_async_event(
    context: *mut ibv_context,
    event: *mut ibv_async_event,
) -> c_int {
    // SAFETY: the live real context, the caller's out pointer.
    let rc = unsafe { (real().ibv_get_async_event)(ctx_real(context), event) };
    if rc != 0 {
        return rc;
    }
    // SAFETY: filled by the real verb.
    let e = unsafe { &mut *event };
    // The real objects' contexts are their shadows (see the creates).
    // SAFETY: the element is a live real object of the kind named.
    e.element = unsafe {
        match subject(e.event_type) {
            EventSubject::Cq => (*e.element.cast::<ibv_cq>()).cq_context,
            EventSubject::Qp => (*e.element.cast::<ibv_qp>()).qp_context,
            EventSubject::Srq => (*e.element.cast::<ibv_srq>()).srq_context,
            EventSubject::Port => e.element,
        }
    };
    rc
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn ibv_ack_async_event(event: *mut ibv_async_event) {
    let _entry = Entry::new();
    // SAFETY: the caller's event, from ibv_get_async_event.
    let e = unsafe { &*event };
    let element: *mut c_void = match subject(e.event_type) {
        EventSubject::Cq => cq_real(e.element.cast()).cast(),
        EventSubject::Qp => lock(&shadow::<Qp>(e.element).st).real.cast(),
        EventSubject::Srq => srq_real(e.element),
        EventSubject::Port => e.element,
    };
    let mut r = ibv_async_event {
        element,
        event_type: e.event_type,
    };
    // SAFETY: an event naming the live real object.
    unsafe { (real().ibv_ack_async_event)(&mut r) };
}

/// Exported verbs that take a verbs object this layer does not shadow:
/// refused with `EOPNOTSUPP` (and a line on stderr naming the verb)
/// instead of reaching libibverbs with a shadow it would misread.
macro_rules! unsupported_int {
    ($($name:ident($($arg:ident : $ty:ty),*);)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($(_: $ty),*) -> c_int {
            unsupported(stringify!($name));
            libc::EOPNOTSUPP
        }
    )*};
}

macro_rules! unsupported_ptr {
    ($($name:ident($($arg:ident : $ty:ty),*);)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($(_: $ty),*) -> *mut c_void {
            unsupported(stringify!($name));
            set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        }
    )*};
}

unsupported_int! {
    ibv_rereg_mr(mr: *mut c_void, flags: c_int, pd: *mut c_void, addr: *mut c_void, length: usize, access: c_int);
    ibv_resize_cq(cq: *mut c_void, cqe: c_int);
    ibv_attach_mcast(qp: *mut c_void, gid: *const c_void, lid: u16);
    ibv_detach_mcast(qp: *mut c_void, gid: *const c_void, lid: u16);
    ibv_init_ah_from_wc(context: *mut c_void, port: u8, wc: *mut c_void, grh: *mut c_void, ah: *mut c_void);
    ibv_get_pkey_index(context: *mut c_void, port: u8, pkey: u16);
    ibv_query_ece(qp: *mut c_void, ece: *mut c_void);
    ibv_set_ece(qp: *mut c_void, ece: *mut c_void);
    ibv_query_qp_data_in_order(qp: *mut c_void, op: c_int, flags: u32);
    ibv_resolve_eth_l2_from_gid(context: *mut c_void, attr: *mut c_void, mac: *mut u8, vid: *mut u16);
    _ibv_query_gid_ex(context: *mut c_void, port: u32, index: u32, entry: *mut c_void, flags: u32, size: usize);
}

unsupported_ptr! {
    ibv_create_ah_from_wc(pd: *mut c_void, wc: *mut c_void, grh: *mut c_void, port: u8);
    ibv_reg_dmabuf_mr(pd: *mut c_void, offset: u64, length: usize, iova: u64, fd: c_int, access: c_int);
    ibv_import_device(cmd_fd: c_int);
    ibv_import_pd(context: *mut c_void, handle: u32);
    ibv_import_mr(pd: *mut c_void, handle: u32);
    ibv_import_dm(context: *mut c_void, handle: u32);
    ibv_qp_to_qp_ex(qp: *mut c_void);
}

/// `_ibv_query_gid_table` returns a count (negative errno on failure).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn _ibv_query_gid_table(
    _context: *mut c_void,
    _entries: *mut c_void,
    _max: usize,
    _flags: u32,
    _size: usize,
) -> isize {
    unsupported("ibv_query_gid_table");
    -(libc::EOPNOTSUPP as isize)
}
