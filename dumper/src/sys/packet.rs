//! getsockname of a packet socket, whose `sockaddr_ll` the kernel
//! returns shorter than the structure (only as much hardware address as
//! the interface has), which nix's typed addresses refuse.

/// What a packet socket is bound to.
pub struct PacketName {
    /// The ethertype it receives, host order.
    pub protocol: u16,
    /// The interface (0: every one).
    pub ifindex: i32,
}

/// The protocol and interface packet socket `fd` is bound to.
pub fn packet_name(fd: std::os::fd::BorrowedFd<'_>) -> std::io::Result<PacketName> {
    use std::os::fd::AsRawFd;
    // SAFETY: sockaddr_ll is plain old data.
    let mut ll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into the live local `ll`.
    let r = unsafe { libc::getsockname(fd.as_raw_fd(), (&raw mut ll).cast(), &mut len) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if i32::from(ll.sll_family) != libc::AF_PACKET {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "getsockname: not a packet address",
        ));
    }
    Ok(PacketName {
        protocol: u16::from_be(ll.sll_protocol),
        ifindex: ll.sll_ifindex,
    })
}
