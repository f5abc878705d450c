//! eventfd(2) objects.
//!
//! The message is defined in `image/proto/fd_eventfd.proto`.

pub use crate::pb::EventfdFile;
