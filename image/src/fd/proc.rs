//! Files of /proc/PID and namespace files of processes of the checkpoint.
//!
//! The message is defined in `image/proto/fd_proc.proto`.

pub use crate::pb::ProcFile;

impl ProcFile {
    /// Where the process finds the file again, in its own /proc.
    pub fn path(&self) -> String {
        if self.name.is_empty() {
            format!("/proc/{}", self.pid)
        } else {
            format!("/proc/{}/{}", self.pid, self.name)
        }
    }

    /// It is a namespace file (`ns/net`, ...).
    pub fn is_namespace(&self) -> bool {
        self.name.starts_with("ns/")
    }
}

impl super::Describe for ProcFile {
    fn describe(&self) -> String {
        self.path()
    }
}
