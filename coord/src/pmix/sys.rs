//! Hand-written FFI to the PMIx client library (Debian bookworm's libpmix 4.2.2), and the
//! safe wrappers the backend uses. This is the only module of the crate with `unsafe`.
//!
//! Only what the backend needs is declared: `PMIx_Init`, `PMIx_Finalize`, `PMIx_Put`,
//! `PMIx_Commit`, `PMIx_Fence`, `PMIx_Get`, `PMIx_Value_destruct` and `PMIx_Error_string`.
//! `PMIX_VALUE_RELEASE` is a macro in `pmix_common.h` (`PMIx_Value_destruct` then the
//! inline `pmix_free`, which is plain `free`), so it is re-implemented here as
//! [`release_value`]; `PMIX_INFO_LOAD`/`PMIX_LOAD_PROCID` are macros too and are replaced by
//! constructors that fill the structs directly (only by-value types are ever loaded into an
//! info, so nothing needs destructing).
//!
//! Struct layouts follow `pmix_common.h`; the sizes and offsets were measured on
//! x86_64 Debian 12 by compiling a C program printing `sizeof`/`offsetof` against
//! `pkg-config --cflags pmix` and are asserted below at compile time.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::mem::{offset_of, size_of};
use std::ptr;

/// `PMIX_MAX_NSLEN`: longest namespace, without the terminating NUL.
pub const MAX_NSLEN: usize = 255;
/// `PMIX_MAX_KEYLEN`: longest key, without the terminating NUL.
pub const MAX_KEYLEN: usize = 511;

/// `pmix_status_t`.
pub type Status = c_int;
/// `PMIX_SUCCESS`.
pub const SUCCESS: Status = 0;
/// `PMIX_ERR_TIMEOUT`.
pub const ERR_TIMEOUT: Status = -24;
/// `PMIX_ERR_NOT_FOUND`.
pub const ERR_NOT_FOUND: Status = -46;
/// `PMIX_ERR_PARTIAL_SUCCESS`: a fence completed without some participants.
pub const ERR_PARTIAL_SUCCESS: Status = -52;

/// `PMIX_RANK_WILDCARD`: every rank of a namespace.
pub const RANK_WILDCARD: u32 = u32::MAX - 1;

// pmix_data_type_t values.
const TYPE_BOOL: u16 = 1;
const TYPE_STRING: u16 = 3;
const TYPE_INT: u16 = 6;
const TYPE_UINT32: u16 = 14;
const TYPE_BYTE_OBJECT: u16 = 27;

/// `PMIX_GLOBAL` scope (share with local and remote processes).
const SCOPE_GLOBAL: u8 = 3;

const KEY_JOB_SIZE: &str = "pmix.job.size";
const KEY_COLLECT_DATA: &str = "pmix.collect";
const KEY_TIMEOUT: &str = "pmix.timeout";
const KEY_OPTIONAL: &str = "pmix.optional";

/// `pmix_proc_t`: `char nspace[PMIX_MAX_NSLEN+1]; pmix_rank_t rank;`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Proc {
    nspace: [c_char; MAX_NSLEN + 1],
    rank: u32,
}

/// `pmix_byte_object_t`: `char *bytes; size_t size;`.
#[repr(C)]
#[derive(Clone, Copy)]
struct ByteObject {
    bytes: *mut c_char,
    size: usize,
}

/// The data union of `pmix_value_t`: only the members used here, padded to the union's
/// measured 24 bytes (its largest members, e.g. `pmix_envar_t`, are 24 bytes, 8-aligned).
#[repr(C)]
#[derive(Clone, Copy)]
union ValueData {
    flag: bool,
    integer: c_int,
    uint32: u32,
    string: *mut c_char,
    bo: ByteObject,
    pad: [u64; 3],
}

/// `pmix_value_t`: `pmix_data_type_t type; union { ... } data;`.
#[repr(C)]
struct Value {
    kind: u16,
    data: ValueData,
}

/// `pmix_info_t`: `char key[PMIX_MAX_KEYLEN+1]; pmix_info_directives_t flags; pmix_value_t value;`.
#[repr(C)]
struct Info {
    key: [c_char; MAX_KEYLEN + 1],
    flags: u32,
    value: Value,
}

// Measured with gcc against /usr/lib/x86_64-linux-gnu/pmix2/include (PMIx 4.2.2):
// pmix_proc_t size=260 align=4 nspace@0 rank@256
// pmix_byte_object_t size=16 bytes@0 size@8
// pmix_value_t size=32 align=8 type@0 data@8 sizeof(data)=24
// pmix_info_t size=552 align=8 key@0 flags@512 value@520
const _: () = assert!(size_of::<Proc>() == 260);
const _: () = assert!(align_of::<Proc>() == 4);
const _: () = assert!(offset_of!(Proc, rank) == 256);
const _: () = assert!(size_of::<ByteObject>() == 16);
const _: () = assert!(offset_of!(ByteObject, size) == 8);
const _: () = assert!(size_of::<ValueData>() == 24);
const _: () = assert!(size_of::<Value>() == 32);
const _: () = assert!(align_of::<Value>() == 8);
const _: () = assert!(offset_of!(Value, data) == 8);
const _: () = assert!(size_of::<Info>() == 552);
const _: () = assert!(offset_of!(Info, flags) == 512);
const _: () = assert!(offset_of!(Info, value) == 520);

// Linked by build.rs (`cargo:rustc-link-lib=pmix`, only with the `pmix` feature).
unsafe extern "C" {
    fn PMIx_Init(proc_: *mut Proc, info: *mut Info, ninfo: usize) -> Status;
    fn PMIx_Finalize(info: *const Info, ninfo: usize) -> Status;
    fn PMIx_Put(scope: u8, key: *const c_char, val: *mut Value) -> Status;
    fn PMIx_Commit() -> Status;
    fn PMIx_Fence(procs: *const Proc, nprocs: usize, info: *const Info, ninfo: usize) -> Status;
    fn PMIx_Get(
        proc_: *const Proc,
        key: *const c_char,
        info: *const Info,
        ninfo: usize,
        val: *mut *mut Value,
    ) -> Status;
    fn PMIx_Value_destruct(val: *mut Value);
    fn PMIx_Error_string(status: Status) -> *const c_char;
}

unsafe extern "C" {
    /// libc's `free`, what `pmix_free` (an inline function in `pmix_common.h`) calls.
    fn free(p: *mut c_void);
}

/// A PMIx call that did not return `PMIX_SUCCESS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PmixError {
    /// The call.
    pub call: &'static str,
    /// Its status.
    pub status: Status,
}

impl std::fmt::Display for PmixError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} returned {} ({})",
            self.call,
            error_string(self.status),
            self.status
        )
    }
}

fn check(call: &'static str, status: Status) -> Result<(), PmixError> {
    if status == SUCCESS {
        Ok(())
    } else {
        Err(PmixError { call, status })
    }
}

/// `PMIx_Error_string`.
pub fn error_string(status: Status) -> String {
    // SAFETY: PMIx_Error_string accepts any status and returns a pointer to a static,
    // NUL-terminated string (or NULL, handled below); it needs no initialisation.
    let p = unsafe { PMIx_Error_string(status) };
    if p.is_null() {
        return format!("status {status}");
    }
    // SAFETY: non-NULL, NUL-terminated and static per the PMIx API; copied out at once.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

impl Proc {
    /// `PMIX_LOAD_PROCID`: the process `rank` of namespace `nspace` (truncated to the
    /// namespace limit, as `PMIX_LOAD_NSPACE` does).
    pub fn new(nspace: &str, rank: u32) -> Proc {
        let mut p = Proc {
            nspace: [0; MAX_NSLEN + 1],
            rank,
        };
        for (d, s) in p.nspace.iter_mut().zip(nspace.bytes().take(MAX_NSLEN)) {
            *d = s as c_char;
        }
        p
    }

    /// The namespace.
    pub fn nspace(&self) -> String {
        let bytes: Vec<u8> = self
            .nspace
            .iter()
            .take_while(|c| **c != 0)
            .map(|c| *c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }
}

impl std::fmt::Debug for Proc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.nspace(), self.rank)
    }
}

fn key_bytes<const N: usize>(key: &str) -> [c_char; N] {
    let mut k = [0 as c_char; N];
    for (d, s) in k.iter_mut().zip(key.bytes().take(N - 1)) {
        *d = s as c_char;
    }
    k
}

impl Info {
    fn new(key: &str, kind: u16, data: ValueData) -> Info {
        Info {
            key: key_bytes::<{ MAX_KEYLEN + 1 }>(key),
            flags: 0,
            value: Value { kind, data },
        }
    }

    fn flag(key: &str, on: bool) -> Info {
        Info::new(key, TYPE_BOOL, ValueData { flag: on })
    }

    fn int(key: &str, v: c_int) -> Info {
        Info::new(key, TYPE_INT, ValueData { integer: v })
    }
}

/// PMIx timeouts are whole seconds (`int`, 0 = forever): round up, at least 1 s.
fn timeout_secs(t: std::time::Duration) -> c_int {
    let s = t.as_secs() + u64::from(t.subsec_nanos() > 0);
    c_int::try_from(s.max(1)).unwrap_or(c_int::MAX)
}

/// `PMIx_Init` with no attributes: our process identifier.
pub fn init() -> Result<Proc, PmixError> {
    let mut me = Proc::new("", 0);
    // SAFETY: `me` is a valid, writable pmix_proc_t (layout asserted above); a NULL info
    // array with ninfo = 0 is allowed by the API.
    let rc = unsafe { PMIx_Init(&mut me, ptr::null_mut(), 0) };
    check("PMIx_Init", rc)?;
    Ok(me)
}

/// `PMIx_Finalize` with no attributes (no embedded barrier).
pub fn finalize() -> Result<(), PmixError> {
    // SAFETY: a NULL info array with ninfo = 0 is allowed; PMIx refcounts Init/Finalize,
    // and callers pair every successful `init` with one `finalize`.
    let rc = unsafe { PMIx_Finalize(ptr::null(), 0) };
    check("PMIx_Finalize", rc)
}

fn c_key(call: &'static str, key: &str) -> Result<CString, PmixError> {
    if key.len() > MAX_KEYLEN {
        return Err(PmixError {
            call,
            status: -27, // PMIX_ERR_BAD_PARAM
        });
    }
    CString::new(key).map_err(|_| PmixError { call, status: -27 })
}

/// `PMIx_Put(PMIX_GLOBAL, key, PMIX_BYTE_OBJECT value)`. Visible to others after
/// [`commit`] (same node) and the next collecting [`fence`] (everywhere).
pub fn put_bytes(key: &str, value: &[u8]) -> Result<(), PmixError> {
    let k = c_key("PMIx_Put", key)?;
    let mut v = Value {
        kind: TYPE_BYTE_OBJECT,
        data: ValueData {
            bo: ByteObject {
                bytes: value.as_ptr().cast_mut().cast::<c_char>(),
                size: value.len(),
            },
        },
    };
    // SAFETY: `k` is NUL-terminated and within PMIX_MAX_KEYLEN; `v` is a valid byte-object
    // value pointing at `value.len()` readable bytes that outlive the call. PMIx_Put copies
    // the value into its own storage and never writes through the byte pointer.
    let rc = unsafe { PMIx_Put(SCOPE_GLOBAL, k.as_ptr(), &mut v) };
    check("PMIx_Put", rc)
}

/// `PMIx_Commit`.
pub fn commit() -> Result<(), PmixError> {
    // SAFETY: no arguments; valid between Init and Finalize (callers hold an initialised
    // backend), and returns an error status otherwise.
    let rc = unsafe { PMIx_Commit() };
    check("PMIx_Commit", rc)
}

/// `PMIx_Fence` over every rank of `nspace`, collecting data, with a `PMIX_TIMEOUT`.
pub fn fence(nspace: &str, timeout: std::time::Duration) -> Result<(), PmixError> {
    let all = Proc::new(nspace, RANK_WILDCARD);
    let info = [
        Info::flag(KEY_COLLECT_DATA, true),
        Info::int(KEY_TIMEOUT, timeout_secs(timeout)),
    ];
    // SAFETY: one valid pmix_proc_t and an array of two valid by-value pmix_info_t, all
    // living on our stack for the duration of the blocking call, which only reads them.
    let rc = unsafe { PMIx_Fence(&all, 1, info.as_ptr(), info.len()) };
    check("PMIx_Fence", rc)
}

/// A value fetched by [`get`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// `PMIX_BYTE_OBJECT` (or `PMIX_STRING`, without its NUL).
    Bytes(Vec<u8>),
    /// `PMIX_UINT32`.
    U32(u32),
    /// Any other type (its `pmix_data_type_t`).
    Other(u16),
}

/// How [`get`] looks for a value.
#[derive(Debug, Clone, Copy)]
pub enum Lookup {
    /// `PMIX_OPTIONAL`: only the local data store, never ask the server.
    Local,
    /// Ask the server if needed (direct modex), giving up after this long (`PMIX_TIMEOUT`).
    Wait(std::time::Duration),
}

/// `PMIX_VALUE_RELEASE`: destructs the value's contents, frees it.
///
/// # Safety
///
/// `v` must be a `pmix_value_t` allocated by the PMIx library (as returned by `PMIx_Get`)
/// and not used afterwards.
unsafe fn release_value(v: *mut Value) {
    // SAFETY: per this function's contract, `v` is a live library-allocated value.
    unsafe { PMIx_Value_destruct(v) };
    // SAFETY: the struct itself came from the library's malloc (pmix_malloc = malloc); its
    // contents were released just above.
    unsafe { free(v.cast::<c_void>()) };
}

/// `PMIx_Get(proc, key)`, copying the result out and releasing PMIx's value.
pub fn get(proc_: &Proc, key: &str, how: Lookup) -> Result<Fetched, PmixError> {
    let k = c_key("PMIx_Get", key)?;
    let info = match how {
        Lookup::Local => Info::flag(KEY_OPTIONAL, true),
        Lookup::Wait(t) => Info::int(KEY_TIMEOUT, timeout_secs(t)),
    };
    let mut out: *mut Value = ptr::null_mut();
    // SAFETY: `proc_` and `info` are valid and live for the call, `k` is NUL-terminated,
    // `out` is a valid location for the library to store its allocated value.
    let rc = unsafe { PMIx_Get(proc_, k.as_ptr(), &info, 1, &mut out) };
    check("PMIx_Get", rc)?;
    if out.is_null() {
        return Err(PmixError {
            call: "PMIx_Get",
            status: ERR_NOT_FOUND,
        });
    }
    // SAFETY: on success `out` points at a valid pmix_value_t owned by us.
    let v = unsafe { &*out };
    let fetched = match v.kind {
        TYPE_BYTE_OBJECT => {
            // SAFETY: the type tag says the `bo` member is the active one.
            let bo = unsafe { v.data.bo };
            if bo.bytes.is_null() || bo.size == 0 {
                Fetched::Bytes(Vec::new())
            } else {
                // SAFETY: PMIx guarantees `bytes` points at `size` initialised bytes, owned
                // by the value until it is released below; copied before that.
                Fetched::Bytes(
                    unsafe { std::slice::from_raw_parts(bo.bytes.cast::<u8>(), bo.size) }.to_vec(),
                )
            }
        }
        TYPE_STRING => {
            // SAFETY: the type tag says the `string` member is the active one.
            let s = unsafe { v.data.string };
            if s.is_null() {
                Fetched::Bytes(Vec::new())
            } else {
                // SAFETY: a PMIX_STRING value is NUL-terminated; copied before release.
                Fetched::Bytes(unsafe { CStr::from_ptr(s) }.to_bytes().to_vec())
            }
        }
        // SAFETY: the type tag says the `uint32` member is the active one.
        TYPE_UINT32 => Fetched::U32(unsafe { v.data.uint32 }),
        other => Fetched::Other(other),
    };
    // SAFETY: `out` was allocated by PMIx_Get, nothing borrows it any more (all data was
    // copied), and it is not used after this.
    unsafe { release_value(out) };
    Ok(fetched)
}

/// `PMIx_Get(nspace:WILDCARD, PMIX_JOB_SIZE)`: number of processes in the namespace.
pub fn job_size(nspace: &str) -> Result<u32, PmixError> {
    match get(
        &Proc::new(nspace, RANK_WILDCARD),
        KEY_JOB_SIZE,
        Lookup::Wait(std::time::Duration::from_secs(10)),
    )? {
        Fetched::U32(n) => Ok(n),
        _ => Err(PmixError {
            call: "PMIx_Get(PMIX_JOB_SIZE)",
            status: -27,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        let p = Proc::new("slurm.pmix.12.0", 3);
        assert_eq!(p.nspace(), "slurm.pmix.12.0");
        assert_eq!(p.rank(), 3);
        let long = "x".repeat(400);
        assert_eq!(Proc::new(&long, 0).nspace().len(), MAX_NSLEN);
        assert_eq!(timeout_secs(std::time::Duration::from_millis(1)), 1);
        assert_eq!(timeout_secs(std::time::Duration::from_millis(1500)), 2);
        assert_eq!(timeout_secs(std::time::Duration::from_secs(7)), 7);
        assert!(c_key("PMIx_Put", &"k".repeat(MAX_KEYLEN + 1)).is_err());
        assert!(c_key("PMIx_Put", "a\0b").is_err());
        assert_eq!(error_string(SUCCESS), "SUCCESS");
    }
}
