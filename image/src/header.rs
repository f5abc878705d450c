//! The fixed header in front of every metadata image file.
//!
//! ```text
//! 0   magic       8 bytes  "CKPT" + 4-byte kind tag
//! 8   version     u32 LE   FORMAT_VERSION
//! 12  reserved    u32      zero
//! 16  payload_len u64 LE
//! 24  crc32c      u32 LE   of the payload
//! 28  reserved    u32      zero
//! 32  payload     protobuf
//! ```

use std::path::Path;

use crate::error::ImageError;

/// Version of the on-disk format; independent of the tool's version.
pub const FORMAT_VERSION: u32 = 5;

/// Length of [`encode`]'s header.
pub const HEADER_LEN: usize = 32;

/// No metadata payload ckpt writes comes near this; checked before allocating.
pub const MAX_PAYLOAD: u64 = 256 << 20;

/// The kinds of metadata image, each with its own magic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// `manifest.img`.
    Manifest,
    /// `core-PID.img`.
    Core,
    /// `mm-PID.img`.
    Mm,
    /// `fds-PID.img`.
    FdTable,
    /// `files.img`.
    Files,
    /// `shmem.img`.
    Shmem,
    /// `ipc.img`.
    Ipc,
}

impl ImageKind {
    /// The 8 magic bytes.
    pub fn magic(self) -> [u8; 8] {
        *match self {
            ImageKind::Manifest => b"CKPTMANI",
            ImageKind::Core => b"CKPTCORE",
            ImageKind::Mm => b"CKPTMMAP",
            ImageKind::FdTable => b"CKPTFDTB",
            ImageKind::Files => b"CKPTFILE",
            ImageKind::Shmem => b"CKPTSHMM",
            ImageKind::Ipc => b"CKPTSIPC",
        }
    }

    /// Human name, for errors.
    pub fn name(self) -> &'static str {
        match self {
            ImageKind::Manifest => "manifest",
            ImageKind::Core => "core",
            ImageKind::Mm => "mm",
            ImageKind::FdTable => "fd table",
            ImageKind::Files => "files",
            ImageKind::Shmem => "shmem",
            ImageKind::Ipc => "ipc",
        }
    }
}

/// Frames `msg` with the header of `kind`.
pub fn encode<M: prost::Message>(kind: ImageKind, msg: &M) -> Vec<u8> {
    let payload = msg.encode_to_vec();
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    out.extend_from_slice(&kind.magic());
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&payload);
    out
}

/// Checks the header of `bytes` (read from `path`) and decodes the payload.
pub fn decode<M: prost::Message + Default>(
    kind: ImageKind,
    path: &Path,
    bytes: &[u8],
) -> Result<M, ImageError> {
    if bytes.len() < HEADER_LEN {
        return Err(ImageError::Size {
            path: path.into(),
            found: bytes.len() as u64,
            expected: HEADER_LEN as u64,
        });
    }
    if bytes[..8] != kind.magic() {
        return Err(ImageError::BadMagic {
            path: path.into(),
            expected: kind.name(),
        });
    }
    let le32 = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let version = le32(8);
    if version != FORMAT_VERSION {
        return Err(ImageError::Version {
            path: path.into(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let len = u64::from_le_bytes(bytes[16..24].try_into().expect("8 bytes"));
    if len > MAX_PAYLOAD {
        return Err(ImageError::TooLarge {
            path: path.into(),
            len,
            limit: MAX_PAYLOAD,
        });
    }
    let expected = HEADER_LEN as u64 + len;
    if bytes.len() as u64 != expected {
        return Err(ImageError::Size {
            path: path.into(),
            found: bytes.len() as u64,
            expected,
        });
    }
    let payload = &bytes[HEADER_LEN..];
    if crc32c::crc32c(payload) != le32(24) {
        return Err(ImageError::Checksum { path: path.into() });
    }
    M::decode(payload).map_err(|source| ImageError::Decode {
        path: path.into(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::FileDigest;

    fn sample() -> FileDigest {
        FileDigest {
            name: "pages-1.img".into(),
            size: 8192,
            blake3: vec![1; 32],
            block_blake3: Vec::new(),
        }
    }

    #[test]
    fn round_trip() {
        let bytes = encode(ImageKind::Manifest, &sample());
        let back: FileDigest = decode(ImageKind::Manifest, Path::new("m"), &bytes).unwrap();
        assert_eq!(back, sample());
    }

    #[test]
    fn every_flipped_byte_is_caught() {
        let bytes = encode(ImageKind::Manifest, &sample());
        for i in 0..bytes.len() {
            if (12..16).contains(&i) || (28..32).contains(&i) {
                continue; // reserved
            }
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            let r: Result<FileDigest, _> = decode(ImageKind::Manifest, Path::new("m"), &bad);
            assert!(r.is_err(), "flip at {i} not detected");
        }
    }

    #[test]
    fn wrong_kind_and_truncation() {
        let bytes = encode(ImageKind::Core, &sample());
        let r: Result<FileDigest, _> = decode(ImageKind::Mm, Path::new("m"), &bytes);
        assert!(matches!(r, Err(ImageError::BadMagic { .. })));
        let r: Result<FileDigest, _> =
            decode(ImageKind::Core, Path::new("m"), &bytes[..bytes.len() - 1]);
        assert!(matches!(r, Err(ImageError::Size { .. })));
    }
}
