//! TCP's socket option structures.

/// The start of the kernel's `struct tcp_info` (uapi linux/tcp.h), up to
/// the byte counters ckpt reads.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct TcpInfo {
    /// `TCP_ESTABLISHED`, `TCP_LISTEN`, ...
    pub state: u8,
    pub ca_state: u8,
    pub retransmits: u8,
    pub probes: u8,
    pub backoff: u8,
    /// `TCPI_OPT_*` bits.
    pub options: u8,
    /// Send window scale in the low nibble, receive in the high one.
    pub wscale: u8,
    pub flags: u8,
    pub rto: u32,
    pub ato: u32,
    pub snd_mss: u32,
    pub rcv_mss: u32,
    /// Listening sockets: connections waiting in the accept queue.
    pub unacked: u32,
    /// Listening sockets: the backlog.
    pub sacked: u32,
    pub lost: u32,
    pub retrans: u32,
    pub fackets: u32,
    pub last_data_sent: u32,
    pub last_ack_sent: u32,
    pub last_data_recv: u32,
    pub last_ack_recv: u32,
    pub pmtu: u32,
    pub rcv_ssthresh: u32,
    pub rtt: u32,
    pub rttvar: u32,
    pub snd_ssthresh: u32,
    pub snd_cwnd: u32,
    pub advmss: u32,
    pub reordering: u32,
    pub rcv_rtt: u32,
    pub rcv_space: u32,
    pub total_retrans: u32,
    pub pacing_rate: u64,
    pub max_pacing_rate: u64,
    /// Sequence numbers the peer acknowledged, the SYN's included
    /// (since Linux 4.1).
    pub bytes_acked: u64,
    /// Sequence numbers received (since Linux 4.1).
    pub bytes_received: u64,
}

/// Bytes of [`TcpInfo`] up to and including `bytes_received`: a shorter
/// answer comes from a kernel without the counters.
pub const TCP_INFO_WITH_BYTES: usize = std::mem::size_of::<TcpInfo>();

/// The kernel's `struct tcp_repair_window`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct TcpRepairWindow {
    pub snd_wl1: u32,
    pub snd_wnd: u32,
    pub max_window: u32,
    pub rcv_wnd: u32,
    pub rcv_wup: u32,
}

/// The kernel's `struct linger` (SO_LINGER).
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Linger {
    pub onoff: i32,
    pub secs: i32,
}

/// One instruction of a classic BPF program (`struct sock_filter`).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct SockFilter {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

/// The classic BPF filter attached to socket `fd` (SO_GET_FILTER), empty
/// without one. SO_GET_FILTER counts in instructions, not bytes: asked
/// with length 0 it tells how many there are.
pub fn socket_filter(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<Vec<SockFilter>> {
    use std::os::fd::AsRawFd;
    let mut count: libc::socklen_t = 0;
    // SAFETY: with a length of 0 the kernel writes nothing to the buffer,
    // only the count into the live local `count`.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_GET_FILTER,
            std::ptr::null_mut(),
            &mut count,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut prog = vec![SockFilter::default(); count as usize];
    if prog.is_empty() {
        return Ok(prog);
    }
    // SAFETY: the kernel writes at most `count` instructions into `prog`,
    // which holds that many.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_GET_FILTER,
            prog.as_mut_ptr().cast(),
            &mut count,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    prog.truncate(count as usize);
    Ok(prog)
}
