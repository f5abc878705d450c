//! Netlink sockets.
//!
//! The messages are defined in `image/proto/fd_netlink.proto`.

pub use crate::pb::{NetlinkFile, NetlinkOptions};

/// The most multicast groups an image may name (32 words of bits): far
/// above any protocol's, so a forged list cannot make restore loop long.
pub const MAX_GROUP_WORDS: usize = 32;

/// The short name of netlink protocol `p` (`NETLINK_*` of linux/netlink.h).
pub fn protocol_name(p: u32) -> String {
    match p {
        0 => "route".into(),
        2 => "usersock".into(),
        4 => "sock_diag".into(),
        5 => "nflog".into(),
        6 => "xfrm".into(),
        7 => "selinux".into(),
        8 => "iscsi".into(),
        9 => "audit".into(),
        10 => "fib_lookup".into(),
        11 => "connector".into(),
        12 => "netfilter".into(),
        15 => "kobject_uevent".into(),
        16 => "generic".into(),
        18 => "scsitransport".into(),
        20 => "rdma".into(),
        21 => "crypto".into(),
        22 => "smc".into(),
        other => format!("protocol {other}"),
    }
}

impl NetlinkFile {
    /// The multicast groups joined, by number (group n is bit n-1).
    pub fn group_numbers(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for (w, bits) in self.groups.iter().enumerate() {
            for b in 0..32 {
                if bits & (1 << b) != 0 {
                    out.push(w as u32 * 32 + b + 1);
                }
            }
        }
        out
    }
}

/// `netlink route portid 1234 groups 1,5 -> portid 0 group 3`.
impl super::Describe for NetlinkFile {
    fn describe(&self) -> String {
        let mut s = format!("netlink {}", protocol_name(self.protocol));
        if self.portid != 0 {
            s.push_str(&format!(" portid {}", self.portid));
        }
        let groups = self.group_numbers();
        if !groups.is_empty() {
            let list: Vec<String> = groups.iter().map(u32::to_string).collect();
            s.push_str(&format!(" groups {}", list.join(",")));
        }
        if self.dst_portid != 0 || self.dst_group != 0 {
            s.push_str(&format!(" -> portid {}", self.dst_portid));
            if self.dst_group != 0 {
                s.push_str(&format!(" group {}", self.dst_group));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_are_numbered_from_one_across_words() {
        let f = NetlinkFile {
            groups: vec![0b101, 1 << 1],
            ..Default::default()
        };
        assert_eq!(f.group_numbers(), vec![1, 3, 34]);
        assert_eq!(
            super::super::Describe::describe(&f),
            "netlink route groups 1,3,34"
        );
    }
}
