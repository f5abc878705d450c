//! Raw bindings to the system's libibverbs (rdma-core, Debian 12: 44.0).
//!
//! Hand-written rather than `ibverbs-sys` or bindgen:
//! - `ibverbs-sys` vendors rdma-core and builds it with cmake and bindgen
//!   (libclang) on every clean build, which is heavy and links a second
//!   libibverbs next to the one the checkpointed application uses. The
//!   shadow layer must sit on the very same library as the application.
//! - bindgen needs libclang at build time for a few dozen declarations.
//! - The handful of structs the shadow layer needs are part of the verbs
//!   ABI (stable since IBVERBS_1.1: providers depend on it), and
//!   `tests/layout.rs` checks every size and offset here against the
//!   installed `verbs.h` with the C compiler.
//!
//! `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are static inline in
//! verbs.h: they jump through `ibv_context::ops`. That table is laid out in
//! full here, because the shadow library will call (and interpose) those
//! entries directly.

#![allow(non_camel_case_types)]

use libc::{c_char, c_int, c_uint, c_void, pthread_cond_t, pthread_mutex_t};

/// `IBV_SYSFS_NAME_MAX`.
pub const IBV_SYSFS_NAME_MAX: usize = 64;
/// `IBV_SYSFS_PATH_MAX`.
pub const IBV_SYSFS_PATH_MAX: usize = 256;

/// `enum ibv_port_state`: `IBV_PORT_ACTIVE`.
pub const IBV_PORT_ACTIVE: c_uint = 4;
/// `enum ibv_qp_type`: `IBV_QPT_RC`.
pub const IBV_QPT_RC: c_uint = 2;
/// `enum ibv_qp_type`: `IBV_QPT_UC`.
pub const IBV_QPT_UC: c_uint = 3;
/// `enum ibv_qp_type`: `IBV_QPT_UD`.
pub const IBV_QPT_UD: c_uint = 4;
/// `enum ibv_qp_state`: `IBV_QPS_RESET`.
pub const IBV_QPS_RESET: c_uint = 0;
/// `enum ibv_qp_state`: `IBV_QPS_INIT`.
pub const IBV_QPS_INIT: c_uint = 1;
/// `enum ibv_qp_state`: `IBV_QPS_RTR`.
pub const IBV_QPS_RTR: c_uint = 2;
/// `enum ibv_qp_state`: `IBV_QPS_RTS`.
pub const IBV_QPS_RTS: c_uint = 3;
/// `enum ibv_qp_attr_mask`: `IBV_QP_STATE`.
pub const IBV_QP_STATE: c_int = 1;
/// `enum ibv_qp_attr_mask`: `IBV_QP_PORT`.
pub const IBV_QP_PORT: c_int = 1 << 5;
/// `enum ibv_qp_attr_mask`: `IBV_QP_AV` (the primary path's address vector).
pub const IBV_QP_AV: c_int = 1 << 7;
/// `enum ibv_qp_attr_mask`: `IBV_QP_ALT_PATH`.
pub const IBV_QP_ALT_PATH: c_int = 1 << 14;
/// `enum ibv_qp_attr_mask`: `IBV_QP_DEST_QPN`.
pub const IBV_QP_DEST_QPN: c_int = 1 << 20;
/// `enum ibv_wr_opcode`: `IBV_WR_RDMA_WRITE`.
pub const IBV_WR_RDMA_WRITE: c_uint = 0;
/// `enum ibv_wr_opcode`: `IBV_WR_RDMA_WRITE_WITH_IMM`.
pub const IBV_WR_RDMA_WRITE_WITH_IMM: c_uint = 1;
/// `enum ibv_wr_opcode`: `IBV_WR_SEND`.
pub const IBV_WR_SEND: c_uint = 2;
/// `enum ibv_wr_opcode`: `IBV_WR_SEND_WITH_IMM`.
pub const IBV_WR_SEND_WITH_IMM: c_uint = 3;
/// `enum ibv_wr_opcode`: `IBV_WR_RDMA_READ`.
pub const IBV_WR_RDMA_READ: c_uint = 4;
/// `enum ibv_wr_opcode`: `IBV_WR_ATOMIC_CMP_AND_SWP`.
pub const IBV_WR_ATOMIC_CMP_AND_SWP: c_uint = 5;
/// `enum ibv_wr_opcode`: `IBV_WR_ATOMIC_FETCH_AND_ADD`.
pub const IBV_WR_ATOMIC_FETCH_AND_ADD: c_uint = 6;
/// `enum ibv_send_flags`: `IBV_SEND_FENCE` (waits for the RDMA reads and
/// atomics before it).
pub const IBV_SEND_FENCE: c_uint = 1 << 0;
/// `enum ibv_send_flags`: `IBV_SEND_SIGNALED`.
pub const IBV_SEND_SIGNALED: c_uint = 1 << 1;
/// `enum ibv_send_flags`: `IBV_SEND_INLINE` (the payload is copied at post).
pub const IBV_SEND_INLINE: c_uint = 1 << 3;
/// `enum ibv_wc_status`: `IBV_WC_SUCCESS`.
pub const IBV_WC_SUCCESS: c_uint = 0;
/// `enum ibv_wc_opcode`: the first receive-side opcode (`IBV_WC_RECV`);
/// every opcode at or above it is a receive completion.
pub const IBV_WC_RECV: c_uint = 1 << 7;
/// `enum ibv_event_type`: `IBV_EVENT_CQ_ERR`, the one event about a CQ.
pub const IBV_EVENT_CQ_ERR: c_uint = 0;
/// `enum ibv_event_type`: `IBV_EVENT_QP_FATAL`; it and the events up to
/// `IBV_EVENT_PATH_MIG_ERR` name a QP.
pub const IBV_EVENT_QP_FATAL: c_uint = 1;
/// `enum ibv_event_type`: `IBV_EVENT_PATH_MIG_ERR`.
pub const IBV_EVENT_PATH_MIG_ERR: c_uint = 7;
/// `enum ibv_event_type`: `IBV_EVENT_SRQ_ERR` (names an SRQ).
pub const IBV_EVENT_SRQ_ERR: c_uint = 14;
/// `enum ibv_event_type`: `IBV_EVENT_SRQ_LIMIT_REACHED` (names an SRQ).
pub const IBV_EVENT_SRQ_LIMIT_REACHED: c_uint = 15;
/// `enum ibv_event_type`: `IBV_EVENT_QP_LAST_WQE_REACHED` (names a QP).
pub const IBV_EVENT_QP_LAST_WQE_REACHED: c_uint = 16;
/// `enum ibv_wr_opcode`: `IBV_WR_SEND_WITH_INV`.
pub const IBV_WR_SEND_WITH_INV: c_uint = 9;
/// `enum ibv_wc_opcode`: `IBV_WC_SEND`.
pub const IBV_WC_SEND: c_uint = 0;
/// `enum ibv_wc_opcode`: `IBV_WC_RDMA_WRITE`.
pub const IBV_WC_RDMA_WRITE: c_uint = 1;
/// `enum ibv_wc_opcode`: `IBV_WC_RDMA_READ`.
pub const IBV_WC_RDMA_READ: c_uint = 2;
/// `enum ibv_wc_opcode`: `IBV_WC_COMP_SWAP`.
pub const IBV_WC_COMP_SWAP: c_uint = 3;
/// `enum ibv_wc_opcode`: `IBV_WC_FETCH_ADD`.
pub const IBV_WC_FETCH_ADD: c_uint = 4;
/// `enum ibv_access_flags`: `IBV_ACCESS_LOCAL_WRITE`.
pub const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
/// `enum ibv_access_flags`: `IBV_ACCESS_REMOTE_WRITE`.
pub const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
/// `enum ibv_access_flags`: `IBV_ACCESS_REMOTE_READ`.
pub const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
/// Port link layer (`IBV_LINK_LAYER_ETHERNET`): RoCE, as rxe is.
pub const IBV_LINK_LAYER_ETHERNET: u8 = 2;

/// `union ibv_gid` (16 raw bytes; the subnet prefix/interface id view is the
/// same bytes in network order; that view's two `__be64` give the union
/// 8-byte alignment, which the structs holding a GID inherit).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ibv_gid {
    pub raw: [u8; 16],
}

/// `struct ibv_device`. The leading `_ops` are two private pointers.
#[repr(C)]
pub struct ibv_device {
    pub _ops: [*mut c_void; 2],
    pub node_type: c_int,
    pub transport_type: c_int,
    pub name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_name: [c_char; IBV_SYSFS_NAME_MAX],
    pub dev_path: [c_char; IBV_SYSFS_PATH_MAX],
    pub ibdev_path: [c_char; IBV_SYSFS_PATH_MAX],
}

/// An entry of the ops table that libibverbs keeps only for old binaries.
pub type compat_op = Option<unsafe extern "C" fn() -> *mut c_void>;

/// `struct ibv_context_ops`: the data-path entries the inline verbs use.
#[repr(C)]
pub struct ibv_context_ops {
    pub _compat_query_device: compat_op,
    pub _compat_query_port: compat_op,
    pub _compat_alloc_pd: compat_op,
    pub _compat_dealloc_pd: compat_op,
    pub _compat_reg_mr: compat_op,
    pub _compat_rereg_mr: compat_op,
    pub _compat_dereg_mr: compat_op,
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, c_uint) -> *mut c_void>,
    pub bind_mw: Option<unsafe extern "C" fn(*mut ibv_qp, *mut c_void, *mut c_void) -> c_int>,
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut c_void) -> c_int>,
    pub _compat_create_cq: compat_op,
    pub poll_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int>,
    pub req_notify_cq: Option<unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int>,
    pub _compat_cq_event: compat_op,
    pub _compat_resize_cq: compat_op,
    pub _compat_destroy_cq: compat_op,
    pub _compat_create_srq: compat_op,
    pub _compat_modify_srq: compat_op,
    pub _compat_query_srq: compat_op,
    pub _compat_destroy_srq: compat_op,
    pub post_srq_recv:
        Option<unsafe extern "C" fn(*mut c_void, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub _compat_create_qp: compat_op,
    pub _compat_query_qp: compat_op,
    pub _compat_modify_qp: compat_op,
    pub _compat_destroy_qp: compat_op,
    pub post_send:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int>,
    pub post_recv:
        Option<unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int>,
    pub _compat_create_ah: compat_op,
    pub _compat_destroy_ah: compat_op,
    pub _compat_attach_mcast: compat_op,
    pub _compat_detach_mcast: compat_op,
    pub _compat_async_event: compat_op,
}

/// `struct ibv_context`: an open device.
#[repr(C)]
pub struct ibv_context {
    pub device: *mut ibv_device,
    pub ops: ibv_context_ops,
    pub cmd_fd: c_int,
    pub async_fd: c_int,
    pub num_comp_vectors: c_int,
    pub mutex: pthread_mutex_t,
    pub abi_compat: *mut c_void,
}

/// `struct ibv_port_attr` (the part the exported, pre-extension
/// `ibv_query_port` fills; the two trailing fields stay zero).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_port_attr {
    pub state: c_uint,
    pub max_mtu: c_uint,
    pub active_mtu: c_uint,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
}

/// `struct ibv_pd`.
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
    pub handle: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
    pub channel: *mut c_void,
    pub cq_context: *mut c_void,
    pub handle: u32,
    pub cqe: c_int,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub comp_events_completed: u32,
    pub async_events_completed: u32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
    pub state: c_uint,
    pub qp_type: c_uint,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub cap: ibv_qp_cap,
    pub qp_type: c_uint,
    pub sq_sig_all: c_int,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_send_wr`. The three unions (`wr`: rdma/atomic/ud,
/// `qp_type`: xrc, and bind_mw/tso) are kept as raw words: the shadow layer
/// copies work requests, it does not build every kind.
#[repr(C)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: c_uint,
    pub send_flags: c_uint,
    pub imm_data: u32,
    pub wr: [u64; 4],
    pub qp_type: u32,
    pub bind_mw_or_tso: [u64; 6],
}

/// `struct ibv_wc`: a completion.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: c_uint,
    pub opcode: c_uint,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: c_uint,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// `struct ibv_comp_channel`: a completion event channel.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_srq`.
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
    pub srq_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub handle: u32,
    pub mutex: pthread_mutex_t,
    pub cond: pthread_cond_t,
    pub events_completed: u32,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_srq_attr {
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub attr: ibv_srq_attr,
}

/// `struct ibv_global_route`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_global_route {
    pub dgid: ibv_gid,
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`: an address vector.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_ah_attr {
    pub grh: ibv_global_route,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct ibv_ah {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub handle: u32,
}

/// `struct ibv_qp_attr`: what `ibv_modify_qp` sets (fields chosen by a mask).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ibv_qp_attr {
    pub qp_state: c_uint,
    pub cur_qp_state: c_uint,
    pub path_mtu: c_uint,
    pub path_mig_state: c_uint,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: c_uint,
    pub cap: ibv_qp_cap,
    pub ah_attr: ibv_ah_attr,
    pub alt_ah_attr: ibv_ah_attr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_async_event`: `element` is the QP, CQ or SRQ pointer (or
/// the port number) the event is about, as `event_type` says.
#[repr(C)]
pub struct ibv_async_event {
    pub element: *mut c_void,
    pub event_type: c_uint,
}

unsafe extern "C" {
    pub fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut ibv_device;
    pub fn ibv_free_device_list(list: *mut *mut ibv_device);
    pub fn ibv_get_device_name(device: *mut ibv_device) -> *const c_char;
    /// Node GUID, big-endian.
    pub fn ibv_get_device_guid(device: *mut ibv_device) -> u64;
    pub fn ibv_open_device(device: *mut ibv_device) -> *mut ibv_context;
    pub fn ibv_close_device(context: *mut ibv_context) -> c_int;
    /// The exported (IBVERBS_1.1) entry; verbs.h wraps it in an inline that
    /// prefers the extended op, which fills the same leading fields.
    pub fn ibv_query_port(
        context: *mut ibv_context,
        port_num: u8,
        port_attr: *mut ibv_port_attr,
    ) -> c_int;
    pub fn ibv_query_gid(
        context: *mut ibv_context,
        port_num: u8,
        index: c_int,
        gid: *mut ibv_gid,
    ) -> c_int;
    pub fn ibv_alloc_pd(context: *mut ibv_context) -> *mut ibv_pd;
    pub fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int;
    pub fn ibv_reg_mr(
        pd: *mut ibv_pd,
        addr: *mut c_void,
        length: usize,
        access: c_int,
    ) -> *mut ibv_mr;
    pub fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int;
    pub fn ibv_create_cq(
        context: *mut ibv_context,
        cqe: c_int,
        cq_context: *mut c_void,
        channel: *mut c_void,
        comp_vector: c_int,
    ) -> *mut ibv_cq;
    pub fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int;
    pub fn ibv_create_qp(pd: *mut ibv_pd, qp_init_attr: *mut ibv_qp_init_attr) -> *mut ibv_qp;
    pub fn ibv_destroy_qp(qp: *mut ibv_qp) -> c_int;
}
