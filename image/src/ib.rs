//! The verbs layer a process ran with: the entry points the restorer
//! calls to recreate its InfiniBand resources, and the checkpoint's drain.
//!
//! The message is defined in `image/proto/ib.proto`.

pub use crate::pb::IbLayer;
