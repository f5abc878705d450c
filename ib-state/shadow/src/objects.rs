//! Shadow objects: what the application holds instead of libibverbs'.
//!
//! Each begins with the verbs ABI struct the application reads (ids,
//! context pointers), so a pointer to it is a valid `struct ibv_qp *` and
//! so on; what follows is the layer's: the real object it stands for now
//! (replaced at a restart), how it was created, and the bookkeeping a
//! restart replays. The application's ids in the ABI part never change:
//! they are the virtual ids, equal to the real ones until the first
//! restart.

use std::collections::HashMap;
use std::ffi::{CString, c_int};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use ckpt_ib_state::sys::*;

use crate::ring::{CompletionQueue, WorkQueue};

/// A raw pointer the registry may keep across threads: the objects it
/// points to live until the application destroys them, and every access
/// to their mutable parts goes through their own mutex.
#[derive(PartialEq, Eq, Debug)]
pub struct Ptr<T>(pub *mut T);

impl<T> Clone for Ptr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Ptr<T> {}

// SAFETY: see the type's doc: the pointee is shared state behind mutexes
// (or immutable after creation).
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as for Send.
unsafe impl<T> Sync for Ptr<T> {}

/// Locks, carrying on after a panic elsewhere (a panic aborts this
/// library anyway: every entry point is `extern "C"`).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a port is, as the application addresses it: its GID (RoCE and
/// global routes) and LID (InfiniBand).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct NodeAddr {
    pub gid: [u8; 16],
    pub lid: u16,
}

impl NodeAddr {
    /// The destination of an address vector, by what routes it: the GID
    /// when it has a global route (RoCE always), else the LID.
    pub fn of_av(av: &ibv_ah_attr) -> NodeAddr {
        if av.is_global != 0 {
            NodeAddr::by_gid(av.grh.dgid.raw)
        } else {
            NodeAddr::by_lid(av.dlid)
        }
    }

    pub fn by_gid(gid: [u8; 16]) -> NodeAddr {
        NodeAddr { gid, lid: 0 }
    }

    pub fn by_lid(lid: u16) -> NodeAddr {
        NodeAddr { gid: [0; 16], lid }
    }
}

/// An open device.
#[repr(C)]
pub struct Context {
    pub abi: ibv_context,
    pub st: Mutex<ContextState>,
}

pub struct ContextState {
    pub real: *mut ibv_context,
    /// The device's name, to reopen it at a restart.
    pub device_name: CString,
    /// GIDs and LIDs as the application first saw them: what queries
    /// answer after a restart moved the process to other ports.
    pub gids: HashMap<(u8, c_int), ibv_gid>,
    pub lids: HashMap<u8, u16>,
}

/// A protection domain.
#[repr(C)]
pub struct Pd {
    pub abi: ibv_pd,
    pub real: RwLock<Ptr<ibv_pd>>,
    /// Virtual → real lkeys of this domain's MRs, once a restart gave
    /// them new keys (empty before: virtual = real).
    pub lkeys: RwLock<HashMap<u32, u32>>,
}

/// A registered memory region.
#[repr(C)]
pub struct Mr {
    pub abi: ibv_mr,
    pub real: Mutex<Ptr<ibv_mr>>,
    pub iova: u64,
    pub access: u32,
}

/// A completion channel. `abi.fd` is the number the application polls;
/// a restart puts the new channel's descriptor on that number.
#[repr(C)]
pub struct Channel {
    pub abi: ibv_comp_channel,
    pub real: Mutex<Ptr<ibv_comp_channel>>,
}

/// A completion queue.
#[repr(C)]
pub struct Cq {
    pub abi: ibv_cq,
    pub st: Mutex<CqState>,
}

pub struct CqState {
    pub real: *mut ibv_cq,
    pub channel: *mut Channel,
    pub comp_vector: c_int,
    /// Completions drained at a checkpoint (or made up for sends a restart
    /// found delivered), returned before the device's.
    pub drained: CompletionQueue,
    /// The QPs that complete here, by their current real number.
    pub qps: QpnMap<Ptr<Qp>>,
    /// `req_notify_cq` was called and no event has been read since.
    pub armed: Option<c_int>,
    /// Events read from the current real CQ and not yet acknowledged.
    pub unacked_events: u32,
    /// QPs of the layer's own whose completions land here and are never
    /// shown to the application (see `restart::kick`); destroyed with the
    /// CQ, which the device refuses to destroy while they use it.
    pub kicks: Vec<Kick>,
}

/// The device objects of one kick (`restart::kick`): a UD QP whose send
/// queue completes on an application CQ, with its own PD, receive CQ and
/// address handle. Null members were not made (a kick that failed half
/// way).
pub struct Kick {
    pub qpn: u32,
    pub qp: *mut ibv_qp,
    pub ah: *mut ibv_ah,
    pub recv_cq: *mut ibv_cq,
    pub pd: *mut ibv_pd,
}

impl Kick {
    /// Whether a completion of QP `qpn` is the kick's (hidden from the
    /// application).
    pub fn owns(kicks: &[Kick], qpn: u32) -> bool {
        kicks.iter().any(|k| k.qpn == qpn && !k.qp.is_null())
    }

    /// Destroys what was made, dependents first; the first failure's
    /// return code (the rest are still tried, and what failed stays for
    /// another try).
    pub fn destroy(&mut self) -> c_int {
        let r = crate::real::real();
        let mut first = 0;
        let mut done = |rc: c_int| {
            if rc != 0 && first == 0 {
                first = rc;
            }
            rc == 0
        };
        // SAFETY: each member is null or a live object made by `kick` on
        // the current context, destroyed once (nulled when it was).
        unsafe {
            if !self.qp.is_null() && done((r.ibv_destroy_qp)(self.qp)) {
                self.qp = std::ptr::null_mut();
            }
            if !self.ah.is_null() && done((r.ibv_destroy_ah)(self.ah)) {
                self.ah = std::ptr::null_mut();
            }
            if !self.recv_cq.is_null() && done((r.ibv_destroy_cq)(self.recv_cq)) {
                self.recv_cq = std::ptr::null_mut();
            }
            if !self.pd.is_null() && done((r.ibv_dealloc_pd)(self.pd)) {
                self.pd = std::ptr::null_mut();
            }
        }
        first
    }
}

/// A shared receive queue.
#[repr(C)]
pub struct Srq {
    pub abi: ibv_srq,
    pub st: Mutex<SrqState>,
}

pub struct SrqState {
    pub real: *mut ibv_srq,
    pub attr: ibv_srq_attr,
    pub recvs: WorkQueue,
}

/// An address handle (UD). Its attributes are the virtual ones.
#[repr(C)]
pub struct Ah {
    pub abi: ibv_ah,
    pub attr: ibv_ah_attr,
    pub real: Mutex<Ptr<ibv_ah>>,
}

/// A `modify_qp` call as the application made it.
#[derive(Clone, Copy)]
pub struct Modify {
    pub attr: ibv_qp_attr,
    pub mask: c_int,
}

/// What a restart learnt about a peer: how to reach it now.
pub struct Peer {
    /// The peer process's virtual → real rkeys.
    pub rkeys: Arc<HashMap<u32, u32>>,
}

/// A queue pair.
#[repr(C)]
pub struct Qp {
    pub abi: ibv_qp,
    pub st: Mutex<QpState>,
}

pub struct QpState {
    pub real: *mut ibv_qp,
    pub init: QpInit,
    pub history: Vec<Modify>,
    pub sends: WorkQueue,
    /// Receives posted to the QP itself (not to its SRQ).
    pub recvs: WorkQueue,
    /// Sends that consume a receive at the peer (SEND, SEND_WITH_IMM,
    /// RDMA_WRITE_WITH_IMM) completed since creation.
    pub consuming_sends_done: u64,
    /// Receives this QP consumed since creation (the peer's count of
    /// delivered messages).
    pub recvs_consumed: u64,
    /// Set by a restart: the RC peer's keys.
    pub peer: Option<Peer>,
    /// Where the application's last RDMA write on this QP went: the peer
    /// grants remote writes there, so a drain's zero-length fence write
    /// may go there too.
    pub last_write: Option<RemoteWrite>,
}

/// The target of an RDMA write, as the application posted it (virtual
/// rkey).
#[derive(Clone, Copy, Debug)]
pub struct RemoteWrite {
    pub addr: u64,
    pub rkey: u32,
}

/// `ibv_qp_init_attr` with the shadow objects it named.
#[derive(Clone, Copy)]
pub struct QpInit {
    pub send_cq: *mut Cq,
    pub recv_cq: *mut Cq,
    pub srq: *mut Srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: bool,
}

/// Every live shadow object, in creation order (a restart recreates them
/// in that order: parents first).
#[derive(Default)]
pub struct Registry {
    pub contexts: Vec<Ptr<Context>>,
    pub pds: Vec<Ptr<Pd>>,
    pub mrs: Vec<Ptr<Mr>>,
    pub channels: Vec<Ptr<Channel>>,
    pub cqs: Vec<Ptr<Cq>>,
    pub srqs: Vec<Ptr<Srq>>,
    pub qps: Vec<Ptr<Qp>>,
    pub ahs: Vec<Ptr<Ah>>,
}

impl Registry {
    /// Whether the process holds no verbs object: every other object
    /// hangs off a device context, so none is open.
    pub fn is_empty(&self) -> bool {
        self.contexts.is_empty()
    }
}

/// The registry.
pub fn registry() -> MutexGuard<'static, Registry> {
    static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
        contexts: Vec::new(),
        pds: Vec::new(),
        mrs: Vec::new(),
        channels: Vec::new(),
        cqs: Vec::new(),
        srqs: Vec::new(),
        qps: Vec::new(),
        ahs: Vec::new(),
    });
    lock(&REGISTRY)
}

/// Removes `p` from `list`.
pub fn forget<T>(list: &mut Vec<Ptr<T>>, p: *mut T) {
    list.retain(|x| x.0 != p);
}

/// Moves a new object to the heap for the application to hold.
pub fn leak<T>(v: T) -> *mut T {
    Box::into_raw(Box::new(v))
}

/// Frees an object `leak` made.
///
/// # Safety
/// `p` came from `leak` and nothing uses it afterwards.
pub unsafe fn free<T>(p: *mut T) {
    // SAFETY: the caller's contract.
    drop(unsafe { Box::from_raw(p) });
}

/// After a real destroy: on success (`rc == 0`) the shadow `p` leaves the
/// registry's `list` and is freed. Returns `rc`.
///
/// # Safety
/// `p` came from `leak`, and the application gave it up with this call.
pub unsafe fn destroyed<T>(
    rc: c_int,
    p: *mut T,
    list: impl FnOnce(&mut Registry) -> &mut Vec<Ptr<T>>,
) -> c_int {
    if rc == 0 {
        forget(list(&mut registry()), p);
        // SAFETY: the caller's contract.
        unsafe { free(p) };
    }
    rc
}

/// The translation state that every post consults once a restart
/// happened.
pub struct Ids {
    /// (virtual address of the remote port, virtual QPN) → real QPN.
    pub remote_qpns: HashMap<(NodeAddr, u32), u32>,
    /// Virtual → current address of every port a peer had.
    pub nodes: HashMap<NodeAddr, NodeAddr>,
    /// Real → virtual, for the source of UD completions.
    pub remote_qpn_virtual: HashMap<(u16, u32), u32>,
}

/// The translation state.
pub fn ids() -> &'static RwLock<Ids> {
    static IDS: std::sync::OnceLock<RwLock<Ids>> = std::sync::OnceLock::new();
    IDS.get_or_init(|| {
        RwLock::new(Ids {
            remote_qpns: HashMap::new(),
            nodes: HashMap::new(),
            remote_qpn_virtual: HashMap::new(),
        })
    })
}

/// Set by the first restart: from then on every id may differ from the
/// real one. An atomic beside [`Ids`] so the fast path need not take its
/// lock to learn that nothing is translated yet.
pub static TRANSLATING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a restart happened (every id may differ from the real one).
pub fn translating() -> bool {
    TRANSLATING.load(std::sync::atomic::Ordering::Acquire)
}

/// Hashes a QP number (or key) for the maps the fast path consults: the
/// ids are small, distinct integers, so a multiplication spreads them
/// (SipHash would cost more than the rest of a poll).
#[derive(Default)]
pub struct IdHasher(u64);

impl std::hash::Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8 | u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A map keyed by QP number.
pub type QpnMap<V> = HashMap<u32, V, std::hash::BuildHasherDefault<IdHasher>>;
