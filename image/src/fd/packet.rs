//! Packet (AF_PACKET) sockets.
//!
//! The messages are defined in `image/proto/fd_packet.proto`.

pub use crate::pb::{PacketFile, PacketOptions};

/// `packet raw protocol 0x0800 interface 1`.
impl super::Describe for PacketFile {
    fn describe(&self) -> String {
        let ty = match self.sock_type {
            3 => "raw",
            2 => "dgram",
            _ => "?",
        };
        let mut s = format!("packet {ty} protocol {:#06x}", self.protocol);
        if self.ifindex != 0 {
            s.push_str(&format!(" interface {}", self.ifindex));
        }
        s
    }
}
