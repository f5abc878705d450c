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
