//! The socket options of an inet socket ckpt saves, in one table: the
//! dumper reads each with getsockopt, the restorer sets each with
//! setsockopt, both from [`NUMERIC`] (options whose value is an int) and
//! [`NAMED`] (options whose value is a name). SO_SNDBUF/SO_RCVBUF (set
//! with their FORCE variants, halved), SO_LINGER and the socket filter
//! have shapes of their own.

use super::{InetFamily, InetOptions, InetProtocol};

/// Which sockets an option applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applies {
    /// Every inet socket.
    Any,
    /// TCP sockets.
    Tcp,
    /// IPv4 sockets.
    Ipv4,
    /// IPv6 sockets.
    Ipv6,
}

impl Applies {
    /// Whether a socket of `family` and `protocol` has the option.
    pub fn to(self, family: InetFamily, protocol: InetProtocol) -> bool {
        match self {
            Applies::Any => true,
            Applies::Tcp => protocol == InetProtocol::Tcp,
            Applies::Ipv4 => family == InetFamily::Ipv4,
            Applies::Ipv6 => family == InetFamily::Ipv6,
        }
    }
}

/// UDP-Lite checksum coverage options (`SOL_UDPLITE`, linux/udp.h):
/// outside the table, UDP-Lite's own.
pub const SOL_UDPLITE: i32 = 136;
/// `UDPLITE_SEND_CSCOV`.
pub const UDPLITE_SEND_CSCOV: i32 = 10;
/// `UDPLITE_RECV_CSCOV`.
pub const UDPLITE_RECV_CSCOV: i32 = 11;
/// `IPV6_HDRINCL` (linux/in6.h; libc lacks it).
pub const IPV6_HDRINCL: i32 = 36;
/// `SOL_RAW` and the raw ICMP socket's `ICMP_FILTER` (linux/icmp.h).
pub const SOL_RAW: i32 = 255;
/// `ICMP_FILTER`.
pub const ICMP_FILTER: i32 = 1;

/// Where an option's value lives in [`InetOptions`].
#[derive(Clone, Copy)]
pub enum Field {
    /// A flag (the int is 0 or 1).
    Flag(fn(&InetOptions) -> bool, fn(&mut InetOptions, bool)),
    /// A number.
    Number(fn(&InetOptions) -> u32, fn(&mut InetOptions, u32)),
}

/// When the restore sets an option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Always, before the buffer sizes (and before bind).
    Always,
    /// Only when not 0: the kernel refuses 0 (keepalive timing).
    NonZero,
    /// After the buffer sizes, which set it as a side effect.
    AfterBuffers,
}

/// An option whose value is an int.
#[derive(Clone, Copy)]
pub struct Numeric {
    /// Its name, for errors.
    pub name: &'static str,
    /// setsockopt level.
    pub level: i32,
    /// setsockopt name.
    pub opt: i32,
    /// Sockets that have it.
    pub applies: Applies,
    /// Where the image keeps it.
    pub field: Field,
    /// When the restore sets it.
    pub when: When,
}

impl Numeric {
    /// The value `o` holds for this option, as setsockopt takes it.
    pub fn get(&self, o: &InetOptions) -> i32 {
        match self.field {
            Field::Flag(get, _) => i32::from(get(o)),
            Field::Number(get, _) => i32::try_from(get(o)).unwrap_or(i32::MAX),
        }
    }

    /// Records `value`, as getsockopt reported it, in `o`.
    pub fn set(&self, o: &mut InetOptions, value: i32) {
        match self.field {
            Field::Flag(_, set) => set(o, value != 0),
            Field::Number(_, set) => set(o, value.max(0) as u32),
        }
    }
}

macro_rules! numeric {
    ($name:ident, $level:ident, $applies:ident, $kind:ident($field:ident), $when:ident) => {
        Numeric {
            name: stringify!($name),
            level: libc::$level,
            opt: libc::$name,
            applies: Applies::$applies,
            field: Field::$kind(|o| o.$field, |o, v| o.$field = v),
            when: When::$when,
        }
    };
}

/// `SO_BUF_LOCK` (Linux 5.14; not in every libc yet).
const SO_BUF_LOCK: i32 = 72;

/// The options whose value is an int.
pub static NUMERIC: &[Numeric] = &[
    numeric!(SO_REUSEADDR, SOL_SOCKET, Any, Flag(reuseaddr), Always),
    numeric!(SO_REUSEPORT, SOL_SOCKET, Any, Flag(reuseport), Always),
    numeric!(SO_BROADCAST, SOL_SOCKET, Any, Flag(broadcast), Always),
    numeric!(SO_KEEPALIVE, SOL_SOCKET, Any, Flag(keepalive), Always),
    numeric!(IPV6_V6ONLY, IPPROTO_IPV6, Ipv6, Flag(v6only), Always),
    numeric!(IP_TOS, IPPROTO_IP, Ipv4, Number(tos), Always),
    numeric!(IPV6_TCLASS, IPPROTO_IPV6, Ipv6, Number(tos), Always),
    numeric!(IP_FREEBIND, IPPROTO_IP, Any, Flag(freebind), Always),
    numeric!(TCP_NODELAY, IPPROTO_TCP, Tcp, Flag(nodelay), Always),
    numeric!(TCP_CORK, IPPROTO_TCP, Tcp, Flag(cork), Always),
    numeric!(TCP_KEEPIDLE, IPPROTO_TCP, Tcp, Number(keepidle), NonZero),
    numeric!(TCP_KEEPINTVL, IPPROTO_TCP, Tcp, Number(keepintvl), NonZero),
    numeric!(TCP_KEEPCNT, IPPROTO_TCP, Tcp, Number(keepcnt), NonZero),
    numeric!(
        TCP_USER_TIMEOUT,
        IPPROTO_TCP,
        Tcp,
        Number(user_timeout),
        Always
    ),
    Numeric {
        name: "SO_BUF_LOCK",
        level: libc::SOL_SOCKET,
        opt: SO_BUF_LOCK,
        applies: Applies::Any,
        field: Field::Number(|o| o.buf_lock, |o, v| o.buf_lock = v),
        when: When::AfterBuffers,
    },
];

/// The most bytes of a named option's value: IFNAMSIZ and
/// TCP_CA_NAME_MAX are both 16.
pub const NAME_MAX: usize = 16;

/// An option whose value is a name.
#[derive(Clone, Copy)]
pub struct Named {
    /// Its name, for errors.
    pub name: &'static str,
    /// setsockopt level.
    pub level: i32,
    /// setsockopt name.
    pub opt: i32,
    /// Sockets that have it.
    pub applies: Applies,
    /// Its value in the image (empty: not set).
    pub get: fn(&InetOptions) -> &str,
    /// Records its value in the image.
    pub set: fn(&mut InetOptions, String),
}

/// The options whose value is a name.
pub static NAMED: &[Named] = &[
    Named {
        name: "SO_BINDTODEVICE",
        level: libc::SOL_SOCKET,
        opt: libc::SO_BINDTODEVICE,
        applies: Applies::Any,
        get: |o| &o.bind_to_device,
        set: |o, v| o.bind_to_device = v,
    },
    Named {
        name: "TCP_CONGESTION",
        level: libc::IPPROTO_TCP,
        opt: libc::TCP_CONGESTION,
        applies: Applies::Tcp,
        get: |o| &o.congestion,
        set: |o, v| o.congestion = v,
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_numeric_option_round_trips_through_its_field() {
        for n in NUMERIC {
            let mut o = InetOptions::default();
            n.set(&mut o, 1);
            assert_eq!(n.get(&o), 1, "{}", n.name);
        }
    }

    #[test]
    fn options_apply_to_their_sockets_only() {
        assert!(Applies::Tcp.to(InetFamily::Ipv6, InetProtocol::Tcp));
        assert!(!Applies::Tcp.to(InetFamily::Ipv4, InetProtocol::Udp));
        assert!(!Applies::Ipv6.to(InetFamily::Ipv4, InetProtocol::Tcp));
    }
}
