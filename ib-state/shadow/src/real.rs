//! The real libibverbs entry points, found past this library in the
//! lookup order (`dlvsym(RTLD_NEXT, ..)`, with the symbol version the
//! application would have bound). Calling them by name would call our own
//! exported definitions again.

use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;

use ckpt_ib_state::sys::*;

macro_rules! real_table {
    ($($name:ident : fn($($arg:ty),*) -> $ret:ty = $ver:literal;)*) => {
        /// Every real verb the layer forwards to.
        pub struct Real {
            $(pub $name: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        fn resolve() -> Real {
            Real {
                $($name: {
                    let f = lookup(
                        concat!(stringify!($name), "\0"),
                        concat!($ver, "\0"),
                    );
                    // SAFETY: `f` is the address of the libibverbs function
                    // of that name and version, whose C prototype verbs.h
                    // declares as written in this table.
                    unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(f) }
                },)*
            }
        }
    };
}

real_table! {
    ibv_open_device: fn(*mut ibv_device) -> *mut ibv_context = "IBVERBS_1.1";
    ibv_close_device: fn(*mut ibv_context) -> c_int = "IBVERBS_1.1";
    ibv_get_device_list: fn(*mut c_int) -> *mut *mut ibv_device = "IBVERBS_1.1";
    ibv_free_device_list: fn(*mut *mut ibv_device) -> () = "IBVERBS_1.1";
    ibv_get_device_name: fn(*mut ibv_device) -> *const libc::c_char = "IBVERBS_1.1";
    ibv_query_device: fn(*mut ibv_context, *mut c_void) -> c_int = "IBVERBS_1.1";
    ibv_query_port: fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int = "IBVERBS_1.1";
    ibv_query_gid: fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int = "IBVERBS_1.1";
    ibv_query_pkey: fn(*mut ibv_context, u8, c_int, *mut u16) -> c_int = "IBVERBS_1.1";
    ibv_get_async_event: fn(*mut ibv_context, *mut ibv_async_event) -> c_int = "IBVERBS_1.1";
    ibv_ack_async_event: fn(*mut ibv_async_event) -> () = "IBVERBS_1.1";
    ibv_alloc_pd: fn(*mut ibv_context) -> *mut ibv_pd = "IBVERBS_1.1";
    ibv_dealloc_pd: fn(*mut ibv_pd) -> c_int = "IBVERBS_1.1";
    ibv_reg_mr: fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr = "IBVERBS_1.1";
    ibv_reg_mr_iova2: fn(*mut ibv_pd, *mut c_void, usize, u64, u32) -> *mut ibv_mr = "IBVERBS_1.8";
    ibv_dereg_mr: fn(*mut ibv_mr) -> c_int = "IBVERBS_1.1";
    ibv_create_comp_channel: fn(*mut ibv_context) -> *mut ibv_comp_channel = "IBVERBS_1.0";
    ibv_destroy_comp_channel: fn(*mut ibv_comp_channel) -> c_int = "IBVERBS_1.0";
    ibv_create_cq: fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq = "IBVERBS_1.1";
    ibv_destroy_cq: fn(*mut ibv_cq) -> c_int = "IBVERBS_1.1";
    ibv_get_cq_event: fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int = "IBVERBS_1.1";
    ibv_ack_cq_events: fn(*mut ibv_cq, u32) -> () = "IBVERBS_1.1";
    ibv_create_qp: fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp = "IBVERBS_1.1";
    ibv_modify_qp: fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int = "IBVERBS_1.1";
    ibv_query_qp: fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int = "IBVERBS_1.1";
    ibv_destroy_qp: fn(*mut ibv_qp) -> c_int = "IBVERBS_1.1";
    ibv_create_srq: fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq = "IBVERBS_1.1";
    ibv_modify_srq: fn(*mut ibv_srq, *mut ibv_srq_attr, c_int) -> c_int = "IBVERBS_1.1";
    ibv_query_srq: fn(*mut ibv_srq, *mut ibv_srq_attr) -> c_int = "IBVERBS_1.1";
    ibv_destroy_srq: fn(*mut ibv_srq) -> c_int = "IBVERBS_1.1";
    ibv_create_ah: fn(*mut ibv_pd, *mut ibv_ah_attr) -> *mut ibv_ah = "IBVERBS_1.1";
    ibv_destroy_ah: fn(*mut ibv_ah) -> c_int = "IBVERBS_1.1";
}

fn lookup(name: &'static str, version: &'static str) -> *mut c_void {
    let cname = CStr::from_bytes_with_nul(name.as_bytes()).expect("nul-terminated");
    let cver = CStr::from_bytes_with_nul(version.as_bytes()).expect("nul-terminated");
    // SAFETY: both strings are nul-terminated; RTLD_NEXT searches the
    // objects loaded after this one, where libibverbs is.
    let f = unsafe { libc::dlvsym(libc::RTLD_NEXT, cname.as_ptr(), cver.as_ptr()) };
    if f.is_null() {
        crate::fatal(&format!(
            "libibverbs has no {}@{} (is libibverbs.so.1 loaded?)",
            cname.to_string_lossy(),
            cver.to_string_lossy()
        ));
    }
    f
}

/// The real verbs, resolved on first use.
pub fn real() -> &'static Real {
    static REAL: OnceLock<Real> = OnceLock::new();
    REAL.get_or_init(resolve)
}
