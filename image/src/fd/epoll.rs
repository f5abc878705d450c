//! epoll(7) instances: the interest list, each target an open file of the
//! checkpoint by id.
//!
//! The messages are defined in `image/proto/fd_epoll.proto`.

pub use crate::pb::{EpollFile, EpollTarget};
