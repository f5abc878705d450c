//! Character devices without state worth saving.

/// A character device reopened by path (`/dev/null`, `/dev/zero`,
/// `/dev/full`, `/dev/random`, `/dev/urandom`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct DevFile {
    /// Path at dump time.
    #[prost(string, tag = "1")]
    pub path: String,
    /// Device number (`st_rdev`); restore checks the path still names it.
    #[prost(uint64, tag = "2")]
    pub rdev: u64,
}
