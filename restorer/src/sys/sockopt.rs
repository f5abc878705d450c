//! Socket options with shapes of their own.

/// The kernel's `struct linger` (SO_LINGER).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Linger {
    pub onoff: i32,
    pub secs: i32,
}

/// One instruction of a classic BPF program (`struct sock_filter`).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct SockFilter {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// The kernel's `struct sock_fprog`.
#[repr(C)]
struct SockFprog {
    len: u16,
    filter: *const SockFilter,
}

/// Attaches the classic BPF program `prog` to socket `fd`
/// (SO_ATTACH_FILTER).
pub fn attach_filter(fd: std::os::fd::BorrowedFd<'_>, prog: &[SockFilter]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fprog = SockFprog {
        len: u16::try_from(prog.len())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?,
        filter: prog.as_ptr(),
    };
    // SAFETY: the kernel reads the live local `fprog` and the `len`
    // instructions of `prog` it points to, both alive for the call.
    let r = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&raw const fprog).cast(),
            std::mem::size_of::<SockFprog>() as libc::socklen_t,
        )
    };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}
