//! eventfd(2) objects.

/// An eventfd: its 64-bit counter and mode. Non-blocking mode is a file
/// status flag ([`super::File::flags`]).
#[derive(Clone, PartialEq, prost::Message)]
pub struct EventfdFile {
    /// The counter at dump time.
    #[prost(uint64, tag = "1")]
    pub count: u64,
    /// Created with `EFD_SEMAPHORE`: each read takes 1 from the counter.
    #[prost(bool, tag = "2")]
    pub semaphore: bool,
}
