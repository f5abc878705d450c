//! Pipes whose both ends are in the dumped tree.
//!
//! The message is defined in `image/proto/fd_pipe.proto`.

pub use crate::pb::PipeFile;

impl super::Describe for PipeFile {
    fn describe(&self) -> String {
        if self.outside {
            format!(
                "pipe:[{}] to outside the tree (rebound to restore's fd)",
                self.pipe_id
            )
        } else {
            format!("pipe:[{}] capacity {}", self.pipe_id, self.capacity)
        }
    }
}
