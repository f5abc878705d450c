//! The manifest: what wrote the checkpoint, on which kernel and CPU, which
//! processes it holds, and a checksum of every other file.

/// Top-level description of a checkpoint directory.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Manifest {
    /// Version of the ckpt tool that wrote it (informational).
    #[prost(string, tag = "1")]
    pub tool_version: String,
    /// `uname -r` and `uname -v` of the dumping kernel.
    #[prost(string, tag = "2")]
    pub kernel: String,
    /// Machine architecture (`x86_64`).
    #[prost(string, tag = "3")]
    pub arch: String,
    /// The dumping CPU's register-state layout.
    #[prost(message, optional, tag = "4")]
    pub cpu: Option<CpuInfo>,
    /// Seconds since the epoch when the dump completed.
    #[prost(uint64, tag = "5")]
    pub created_unix: u64,
    /// The root of the dumped tree.
    #[prost(int32, tag = "6")]
    pub root_pid: i32,
    /// Every dumped process.
    #[prost(message, repeated, tag = "7")]
    pub processes: Vec<ProcessEntry>,
    /// Every other file in the directory with its size and checksum.
    #[prost(message, repeated, tag = "8")]
    pub files: Vec<FileDigest>,
    /// Hostname of the dumping machine (informational).
    #[prost(string, tag = "9")]
    pub hostname: String,
}

/// What the restoring CPU must support to load the saved register state.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CpuInfo {
    /// CPU vendor string from CPUID 0.
    #[prost(string, tag = "1")]
    pub vendor: String,
    /// XCR0: the user state components enabled in XSAVE.
    #[prost(uint64, tag = "2")]
    pub xcr0: u64,
    /// Size of the XSAVE area for XCR0 (CPUID 0xD.0 EBX).
    #[prost(uint32, tag = "3")]
    pub xsave_size: u32,
}

/// One dumped process.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessEntry {
    /// Its PID (in the PID namespace ckpt ran in).
    #[prost(int32, tag = "1")]
    pub pid: i32,
    /// Its parent's PID at dump time.
    #[prost(int32, tag = "2")]
    pub ppid: i32,
    /// Its command name.
    #[prost(string, tag = "3")]
    pub comm: String,
    /// Set for a zombie (exited, not yet reaped by its parent): its wait
    /// status. A zombie has no other images.
    #[prost(int32, optional, tag = "4")]
    pub zombie_status: Option<i32>,
}

/// Size and CRC32C of one file of the checkpoint.
#[derive(Clone, PartialEq, prost::Message)]
pub struct FileDigest {
    /// Name relative to the checkpoint directory.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Length in bytes.
    #[prost(uint64, tag = "2")]
    pub size: u64,
    /// CRC32C (Castagnoli) of the whole file.
    #[prost(uint32, tag = "3")]
    pub crc32c: u32,
}
