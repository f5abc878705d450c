//! Socket options put back, from the image's one table of them
//! (`ckpt_image::fd::inet::options`).

use std::os::fd::BorrowedFd;

use ckpt_image::fd::inet::options::{self, When};
use ckpt_image::fd::inet::{InetFamily, InetOptions, InetProtocol};

use crate::sys;

/// `SO_BUF_LOCK`, as in the table.
const SO_BUF_LOCK: i32 = 72;

/// Sets one option; a kernel that does not know it (ENOPROTOOPT) is let
/// off when the value is the default (0), which is all a dump on such a
/// kernel records.
fn set_int(sock: BorrowedFd<'_>, level: i32, opt: i32, value: i32) -> std::io::Result<()> {
    match sys::setsockopt_int(sock, level, opt, value) {
        Err(e) if value == 0 && e.raw_os_error() == Some(libc::ENOPROTOOPT) => Ok(()),
        other => other,
    }
}

/// Sets the options of `o` that apply to a socket of `family` and
/// `protocol`, before it is bound: the table's, the buffer sizes (the
/// FORCE variants take what the dump saw even above the sysctl limits:
/// what the socket had, no more; getsockopt reports twice what was set),
/// SO_LINGER and the socket filter. Returns the first failure with the
/// option's name.
pub(super) fn set(
    sock: BorrowedFd<'_>,
    family: InetFamily,
    protocol: InetProtocol,
    o: &InetOptions,
) -> std::result::Result<(), (&'static str, std::io::Error)> {
    let applies = |a: options::Applies| a.to(family, protocol);
    let numeric = |when: When| {
        options::NUMERIC
            .iter()
            .filter(move |n| n.when == when && applies(n.applies))
    };
    for n in numeric(When::Always) {
        set_int(sock, n.level, n.opt, n.get(o)).map_err(|e| (n.name, e))?;
    }
    for n in numeric(When::NonZero) {
        let v = n.get(o);
        if v != 0 {
            set_int(sock, n.level, n.opt, v).map_err(|e| (n.name, e))?;
        }
    }
    for n in options::NAMED.iter().filter(|n| applies(n.applies)) {
        let name = (n.get)(o);
        if !name.is_empty() {
            sys::setsockopt_raw(sock, n.level, n.opt, name.as_bytes()).map_err(|e| (n.name, e))?;
        }
    }
    for (name, opt, val) in [
        ("SO_SNDBUFFORCE", libc::SO_SNDBUFFORCE, o.sndbuf),
        ("SO_RCVBUFFORCE", libc::SO_RCVBUFFORCE, o.rcvbuf),
    ] {
        if val > 0 {
            super::force_buffer(sock, opt, val).map_err(|e| (name, e))?;
        }
    }
    for n in numeric(When::AfterBuffers) {
        set_int(sock, n.level, n.opt, n.get(o)).map_err(|e| (n.name, e))?;
    }
    let linger = sys::Linger {
        onoff: i32::from(o.linger_on),
        secs: i32::try_from(o.linger_secs).unwrap_or(i32::MAX),
    };
    sys::setsockopt_raw(sock, libc::SOL_SOCKET, libc::SO_LINGER, &[linger])
        .map_err(|e| ("SO_LINGER", e))?;
    if !o.filter.is_empty() {
        let prog = o
            .filter
            .iter()
            .map(|i| {
                Some(sys::SockFilter {
                    code: u16::try_from(i.code).ok()?,
                    jt: u8::try_from(i.jt).ok()?,
                    jf: u8::try_from(i.jf).ok()?,
                    k: i.k,
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                (
                    "SO_ATTACH_FILTER",
                    std::io::Error::other("an instruction's field out of bounds"),
                )
            })?;
        sys::attach_filter(sock, &prog).map_err(|e| ("SO_ATTACH_FILTER", e))?;
    }
    Ok(())
}

/// Puts SO_BUF_LOCK back after the buffer sizes were forced again (which
/// locks them): a socket whose sizes the kernel tuned goes on being tuned.
pub(super) fn lock_buffers(sock: BorrowedFd<'_>, buf_lock: u32) -> std::io::Result<()> {
    set_int(
        sock,
        libc::SOL_SOCKET,
        SO_BUF_LOCK,
        i32::try_from(buf_lock).unwrap_or(0),
    )
}
