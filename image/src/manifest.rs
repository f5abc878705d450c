//! The manifest: what wrote the checkpoint, on which kernel and CPU, which
//! processes it holds, and a checksum of every other file.
//!
//! The messages are defined in `image/proto/manifest.proto`; this module
//! gives them their Rust path.

pub use crate::pb::namespaces::{
    Mnt as MntNamespace, Net as NetNamespace, Time as TimeNamespace, Uts as UtsNamespace,
};
pub use crate::pb::{
    CpuInfo, FileDigest, Manifest, Namespaces, PidNamespace, ProcessEntry, ZombieIds,
};
