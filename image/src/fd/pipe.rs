//! Pipes whose both ends are in the dumped tree.

/// One end of a pipe (which end: [`super::File::flags`]'s access mode).
/// The data buffered in the pipe is in the raw image
/// [`crate::pipe_data_name`]`(pipe_id)`, shared by both ends.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PipeFile {
    /// The pipe's identity (its inode at dump time); equal for both ends.
    #[prost(uint64, tag = "1")]
    pub pipe_id: u64,
    /// Capacity in bytes (`F_GETPIPE_SZ`).
    #[prost(uint32, tag = "2")]
    pub capacity: u32,
}
