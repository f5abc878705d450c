//! InfiniBand verbs state: what the shadow verbs layer
//! (`libckpt_ibverbs.so`, in `ib-state/shadow`) and the tests on `rxe0`
//! build on.
//!
//! [`sys`] holds raw bindings to the system's libibverbs, including the
//! per-context ops table through which the inline data-path verbs
//! (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`) dispatch. This module
//! is a small safe layer over the control path: open a device, query a
//! port and its GIDs, create a PD, a CQ, a QP and register memory, each
//! released on drop in dependency order (the borrow of the parent object
//! enforces it).
//!
//! Every object is tied to one process's open device: nothing here is
//! shared across processes or persisted; the ids (`qp_num`, keys, handles)
//! are exactly what the kernel assigned, which is why the shadow layer
//! hands the application virtual ones that survive a restart.

pub mod sys;

use std::ffi::{CStr, c_int};
use std::io;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

/// A failed verb.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No verbs device of that name (is the kernel module loaded, the link added?).
    #[error("no RDMA device named {name} (devices: {available})")]
    NoDevice { name: String, available: String },
    /// A verb returned an error; `call` is its C name.
    #[error("{call}: {source}")]
    Verb {
        call: &'static str,
        #[source]
        source: io::Error,
    },
}

/// Result of this crate's calls.
pub type Result<T> = std::result::Result<T, Error>;

fn last_error(call: &'static str) -> Error {
    Error::Verb {
        call,
        source: io::Error::last_os_error(),
    }
}

/// Verbs that return an errno value rather than setting `errno`.
fn check_rc(call: &'static str, rc: c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::Verb {
            call,
            source: io::Error::from_raw_os_error(rc.abs()),
        })
    }
}

/// A device found by libibverbs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Kernel device name, e.g. `rxe0`.
    pub name: String,
    /// Node GUID (host order).
    pub guid: u64,
}

/// The verbs devices of this host.
pub fn devices() -> Result<Vec<DeviceInfo>> {
    with_device_list(|list| {
        list.iter()
            .map(|&d| DeviceInfo {
                name: device_name(d),
                // SAFETY: `d` is a live entry of the device list.
                guid: u64::from_be(unsafe { sys::ibv_get_device_guid(d) }),
            })
            .collect()
    })
}

fn device_name(d: *mut sys::ibv_device) -> String {
    // SAFETY: `d` is a live device; libibverbs returns a NUL-terminated
    // name stored in the device itself.
    let name = unsafe { sys::ibv_get_device_name(d) };
    if name.is_null() {
        return String::new();
    }
    // SAFETY: non-null, NUL-terminated (see above), outlives this call.
    unsafe { CStr::from_ptr(name) }
        .to_string_lossy()
        .into_owned()
}

/// Runs `f` over the device list and frees it afterwards.
fn with_device_list<T>(f: impl FnOnce(&[*mut sys::ibv_device]) -> T) -> Result<T> {
    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out pointer.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(last_error("ibv_get_device_list"));
    }
    let len = usize::try_from(n).unwrap_or(0);
    // SAFETY: libibverbs returns an array of `n` device pointers (plus a
    // NULL terminator), valid until ibv_free_device_list.
    let slice = unsafe { std::slice::from_raw_parts(list, len) };
    let out = f(slice);
    // SAFETY: `list` came from ibv_get_device_list and is freed once;
    // contexts opened from it stay valid (documented in verbs.h).
    unsafe { sys::ibv_free_device_list(list) };
    Ok(out)
}

/// An open device (`struct ibv_context`).
pub struct Context {
    raw: NonNull<sys::ibv_context>,
    name: String,
}

/// Port attributes the checkpoint cares about.
#[derive(Clone, Copy, Debug)]
pub struct PortAttr {
    /// `IBV_PORT_*` state ([`sys::IBV_PORT_ACTIVE`] when usable).
    pub state: u32,
    /// Entries in the GID table.
    pub gid_table_len: u32,
    /// The port's LID (0 on RoCE).
    pub lid: u16,
    /// [`sys::IBV_LINK_LAYER_ETHERNET`] for RoCE.
    pub link_layer: u8,
    /// Active MTU (`enum ibv_mtu`).
    pub active_mtu: u32,
}

/// A GID: the port's layer-3 address (on RoCE, derived from an IP address).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// An unset table entry.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl Context {
    /// Opens the device called `name` (e.g. `rxe0`).
    pub fn open(name: &str) -> Result<Context> {
        let found = with_device_list(|list| {
            let names: Vec<String> = list.iter().map(|&d| device_name(d)).collect();
            match list.iter().zip(&names).find(|(_, n)| n.as_str() == name) {
                // SAFETY: a live entry of the device list.
                Some((&d, _)) => Ok(unsafe { sys::ibv_open_device(d) }),
                None => Err(names.join(", ")),
            }
        })?;
        match found {
            Ok(raw) => NonNull::new(raw)
                .map(|raw| Context {
                    raw,
                    name: name.to_string(),
                })
                .ok_or_else(|| last_error("ibv_open_device")),
            Err(available) => Err(Error::NoDevice {
                name: name.to_string(),
                available,
            }),
        }
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw context, for the shadow layer (its ops table, its fds).
    pub fn as_raw(&self) -> *mut sys::ibv_context {
        self.raw.as_ptr()
    }

    /// The uverbs command fd (what a checkpoint sees in the fd table).
    pub fn cmd_fd(&self) -> c_int {
        // SAFETY: the context is open for as long as `self` lives.
        unsafe { self.raw.as_ref() }.cmd_fd
    }

    /// Attributes of port `port` (ports count from 1).
    pub fn query_port(&self, port: u8) -> Result<PortAttr> {
        let mut attr = sys::ibv_port_attr::default();
        // SAFETY: open context, `attr` is a zeroed out struct at least as
        // large as what the exported verb writes.
        check_rc("ibv_query_port", unsafe {
            sys::ibv_query_port(self.raw.as_ptr(), port, &mut attr)
        })?;
        Ok(PortAttr {
            state: attr.state,
            gid_table_len: u32::try_from(attr.gid_tbl_len).unwrap_or(0),
            lid: attr.lid,
            link_layer: attr.link_layer,
            active_mtu: attr.active_mtu,
        })
    }

    /// Entry `index` of port `port`'s GID table.
    pub fn query_gid(&self, port: u8, index: u32) -> Result<Gid> {
        let mut gid = sys::ibv_gid::default();
        let index = c_int::try_from(index).map_err(|_| Error::Verb {
            call: "ibv_query_gid",
            source: io::Error::from_raw_os_error(libc::EINVAL),
        })?;
        // SAFETY: open context, valid out pointer.
        check_rc("ibv_query_gid", unsafe {
            sys::ibv_query_gid(self.raw.as_ptr(), port, index, &mut gid)
        })?;
        Ok(Gid(gid.raw))
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<Pd<'_>> {
        // SAFETY: open context.
        let raw = unsafe { sys::ibv_alloc_pd(self.raw.as_ptr()) };
        NonNull::new(raw)
            .map(|raw| Pd {
                raw,
                _ctx: PhantomData,
            })
            .ok_or_else(|| last_error("ibv_alloc_pd"))
    }

    /// Creates a completion queue of at least `depth` entries (no channel).
    pub fn create_cq(&self, depth: u32) -> Result<Cq<'_>> {
        let depth = c_int::try_from(depth).unwrap_or(c_int::MAX);
        // SAFETY: open context; no user context, no channel, vector 0.
        let raw = unsafe {
            sys::ibv_create_cq(
                self.raw.as_ptr(),
                depth,
                ptr::null_mut(),
                ptr::null_mut(),
                0,
            )
        };
        NonNull::new(raw)
            .map(|raw| Cq {
                raw,
                _ctx: PhantomData,
            })
            .ok_or_else(|| last_error("ibv_create_cq"))
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: every child object borrows `self`, so all are gone.
        unsafe { sys::ibv_close_device(self.raw.as_ptr()) };
    }
}

/// A protection domain.
pub struct Pd<'ctx> {
    raw: NonNull<sys::ibv_pd>,
    _ctx: PhantomData<&'ctx Context>,
}

impl<'ctx> Pd<'ctx> {
    /// The kernel's handle of this PD.
    pub fn handle(&self) -> u32 {
        // SAFETY: the PD lives as long as `self`.
        unsafe { self.raw.as_ref() }.handle
    }

    /// The raw PD.
    pub fn as_raw(&self) -> *mut sys::ibv_pd {
        self.raw.as_ptr()
    }

    /// Registers `buf` for local write (and remote read/write if `remote`).
    pub fn reg_mr<'a>(&'a self, buf: &'a mut [u8], remote: bool) -> Result<Mr<'a>> {
        let mut access = sys::IBV_ACCESS_LOCAL_WRITE;
        if remote {
            access |= sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ;
        }
        // SAFETY: live PD; `buf` is borrowed mutably for the MR's lifetime,
        // so the device may write it while registered.
        let raw = unsafe {
            sys::ibv_reg_mr(
                self.raw.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                access,
            )
        };
        NonNull::new(raw)
            .map(|raw| Mr {
                raw,
                _buf: PhantomData,
            })
            .ok_or_else(|| last_error("ibv_reg_mr"))
    }

    /// Creates a QP of `qp_type` (e.g. [`sys::IBV_QPT_RC`]) on `cq` for
    /// both directions.
    pub fn create_qp<'a>(
        &'a self,
        cq: &'a Cq<'ctx>,
        qp_type: u32,
        cap: sys::ibv_qp_cap,
    ) -> Result<Qp<'a>> {
        let mut init = sys::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: cq.raw.as_ptr(),
            recv_cq: cq.raw.as_ptr(),
            srq: ptr::null_mut(),
            cap,
            qp_type,
            sq_sig_all: 0,
        };
        // SAFETY: live PD and CQ of the same context; `init` is valid.
        let raw = unsafe { sys::ibv_create_qp(self.raw.as_ptr(), &mut init) };
        NonNull::new(raw)
            .map(|raw| Qp {
                raw,
                _parents: PhantomData,
            })
            .ok_or_else(|| last_error("ibv_create_qp"))
    }
}

impl Drop for Pd<'_> {
    fn drop(&mut self) {
        // SAFETY: QPs and MRs borrow the PD, so none is left.
        unsafe { sys::ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}

/// A completion queue.
pub struct Cq<'ctx> {
    raw: NonNull<sys::ibv_cq>,
    _ctx: PhantomData<&'ctx Context>,
}

impl Cq<'_> {
    /// Entries the provider actually allocated (at least the requested depth).
    pub fn capacity(&self) -> i32 {
        // SAFETY: the CQ lives as long as `self`.
        unsafe { self.raw.as_ref() }.cqe
    }

    /// The kernel's handle of this CQ.
    pub fn handle(&self) -> u32 {
        // SAFETY: as above.
        unsafe { self.raw.as_ref() }.handle
    }

    /// The raw CQ.
    pub fn as_raw(&self) -> *mut sys::ibv_cq {
        self.raw.as_ptr()
    }
}

impl Drop for Cq<'_> {
    fn drop(&mut self) {
        // SAFETY: QPs borrow the CQ, so none is attached any more.
        unsafe { sys::ibv_destroy_cq(self.raw.as_ptr()) };
    }
}

/// A registered memory region.
pub struct Mr<'a> {
    raw: NonNull<sys::ibv_mr>,
    _buf: PhantomData<&'a mut [u8]>,
}

impl Mr<'_> {
    /// Local key (used in scatter/gather entries).
    pub fn lkey(&self) -> u32 {
        // SAFETY: the MR lives as long as `self`.
        unsafe { self.raw.as_ref() }.lkey
    }

    /// Remote key (what peers use for RDMA to this region).
    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { self.raw.as_ref() }.rkey
    }
}

impl Drop for Mr<'_> {
    fn drop(&mut self) {
        // SAFETY: registered by this object, deregistered once.
        unsafe { sys::ibv_dereg_mr(self.raw.as_ptr()) };
    }
}

/// A queue pair.
pub struct Qp<'a> {
    raw: NonNull<sys::ibv_qp>,
    _parents: PhantomData<&'a ()>,
}

impl Qp<'_> {
    /// The QP number peers address (kernel-assigned: virtualised later).
    pub fn qp_num(&self) -> u32 {
        // SAFETY: the QP lives as long as `self`.
        unsafe { self.raw.as_ref() }.qp_num
    }

    /// Current `IBV_QPS_*` state as libibverbs last recorded it.
    pub fn state(&self) -> u32 {
        // SAFETY: as above.
        unsafe { self.raw.as_ref() }.state
    }

    /// The raw QP.
    pub fn as_raw(&self) -> *mut sys::ibv_qp {
        self.raw.as_ptr()
    }
}

impl Drop for Qp<'_> {
    fn drop(&mut self) {
        // SAFETY: created by this object, destroyed once.
        unsafe { sys::ibv_destroy_qp(self.raw.as_ptr()) };
    }
}
