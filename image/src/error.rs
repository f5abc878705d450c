//! Errors of reading and writing images. Every variant names the file.

use std::path::PathBuf;

/// Something is wrong with an image file or the image directory.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// An I/O call on an image file failed.
    #[error("{path}: {op}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done ("open", "write", "fsync", "rename", ...).
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the magic of the expected kind.
    #[error("{path}: not a ckpt {expected} image (bad magic)")]
    BadMagic {
        /// The file.
        path: PathBuf,
        /// The kind that was expected.
        expected: &'static str,
    },
    /// The file was written by an incompatible format version.
    #[error(
        "{path}: image format version {found} is not supported (this ckpt reads version {supported})"
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// The file is shorter or longer than its header or the manifest says.
    #[error("{path}: truncated or resized: {found} bytes, expected {expected}")]
    Size {
        /// The file.
        path: PathBuf,
        /// Actual size.
        found: u64,
        /// Expected size.
        expected: u64,
    },
    /// The content does not match its checksum.
    #[error("{path}: checksum mismatch (image corrupted or tampered with)")]
    Checksum {
        /// The file.
        path: PathBuf,
    },
    /// The payload could not be decoded.
    #[error("{path}: cannot decode: {source}")]
    Decode {
        /// The file.
        path: PathBuf,
        /// The decoder's complaint.
        #[source]
        source: prost::DecodeError,
    },
    /// A metadata payload is larger than any ckpt writes; refuse before allocating.
    #[error("{path}: payload of {len} bytes exceeds the {limit} byte limit")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Declared length.
        len: u64,
        /// Limit.
        limit: u64,
    },
    /// The manifest does not list a file the reader needs.
    #[error("{dir}: manifest does not list {name}")]
    NotListed {
        /// The image directory.
        dir: PathBuf,
        /// The file name.
        name: String,
    },
    /// The destination of a dump already exists.
    #[error("{path}: already exists; refusing to overwrite an existing checkpoint")]
    Exists {
        /// The directory.
        path: PathBuf,
    },
    /// The checkpoint's parent directory is reached through a symlink a
    /// user controls, or cannot be reached.
    #[error(transparent)]
    Path(#[from] crate::trusted_path::PathError),
    /// The image key could not be read or created.
    #[error(transparent)]
    Key(#[from] crate::seal::KeyError),
    /// The manifest's seal is missing or does not verify under this site's key.
    #[error("{path}: not sealed by this site's key ({key_file}): {why}")]
    NotSealed {
        /// The manifest.
        path: PathBuf,
        /// The key file it was checked with.
        key_file: PathBuf,
        /// What is wrong with the seal.
        why: crate::seal::SealFailure,
    },
    /// An image file is a symlink, directory, FIFO or device.
    #[error("{path}: is a {found}, not a regular file; refusing to read it")]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is.
        found: &'static str,
    },
    /// Someone other than ckpt's user could change the file after it is
    /// verified.
    #[error("{path}: {what}; only checkpoints that ckpt's user alone can write are read")]
    Unsafe {
        /// The file or directory.
        path: PathBuf,
        /// Who else owns or can write it.
        what: String,
    },
    /// The temporary or final directory of a dump was replaced while the
    /// dump wrote it (another user can write its parent).
    #[error("{path}: {what}; the checkpoint was not committed")]
    Hijacked {
        /// The directory.
        path: PathBuf,
        /// What was found instead.
        what: String,
    },
    /// The images are internally inconsistent.
    #[error("{path}: invalid image: {what}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
}

impl ImageError {
    /// Wraps an I/O error with the file and the operation.
    pub fn io(path: impl Into<PathBuf>, op: &'static str, source: std::io::Error) -> Self {
        ImageError::Io {
            path: path.into(),
            op,
            source,
        }
    }
}
