//! Terminals.

/// A terminal. Restore reconnects each fd of it by the terminal rule (the
/// restorer's own fd with the same number, else `/dev/null`), so the
/// program's output appears where `ckpt restore` runs; the terminal
/// itself, its settings and job control are not restored.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TtyFile {
    /// Path at dump time (`/dev/pts/3`, ...).
    #[prost(string, tag = "1")]
    pub path: String,
    /// Device number (`st_rdev`).
    #[prost(uint64, tag = "2")]
    pub rdev: u64,
}
