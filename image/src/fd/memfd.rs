//! memfds (memfd_create(2)) held by fds; their contents are shared memory
//! objects (`crate::shmem`).
//!
//! The message is defined in `image/proto/fd_memfd.proto`.

pub use crate::pb::MemfdFile;

impl super::Describe for MemfdFile {
    fn describe(&self) -> String {
        format!("memfd, shared memory object {}", self.shmem_id)
    }
}
