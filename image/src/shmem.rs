//! Shared memory objects (shared anonymous memory, memfds, deleted files
//! still mapped): each saved once, its data runs in `shmem-ID.img`, and
//! every VMA mapping it refers to it by id and offset.
//!
//! The messages are defined in `image/proto/shmem.proto`; this module gives
//! them their Rust path and the checks restore runs before it trusts one.

pub use crate::pb::{ShmemKind, ShmemObject, ShmemObjects, ShmemRun};

/// Longest memfd name memfd_create(2) accepts (249 bytes plus `memfd:`
/// make the kernel's NAME_MAX); a longer one in an image is refused.
pub const MAX_MEMFD_NAME: usize = 249;

/// Longest path of a deleted or tmpfs file (PATH_MAX less its NUL).
pub const MAX_PATH: usize = 4095;

impl ShmemObject {
    /// The name is one the object's kind can have: none for shared
    /// anonymous memory, a memfd name, or an absolute path; never a NUL.
    pub fn name_is_valid(&self) -> bool {
        let name = &self.name;
        !name.contains('\0')
            && match ShmemKind::try_from(self.kind) {
                Ok(ShmemKind::Anon) => name.is_empty(),
                Ok(ShmemKind::Memfd) => name.len() <= MAX_MEMFD_NAME,
                Ok(ShmemKind::DeletedFile | ShmemKind::TmpfsFile) => {
                    name.starts_with('/') && name.len() <= MAX_PATH
                }
                Err(_) => false,
            }
    }

    /// The name a memfd standing in for this object gets: its own for a
    /// memfd, the file name (cut to what memfd_create takes) for a deleted
    /// file.
    pub fn memfd_name(&self) -> &str {
        let base = match ShmemKind::try_from(self.kind) {
            Ok(ShmemKind::Memfd) => self.name.as_str(),
            _ => self.name.rsplit('/').next().unwrap_or(""),
        };
        let mut end = base.len().min(MAX_MEMFD_NAME);
        while !base.is_char_boundary(end) {
            end -= 1;
        }
        &base[..end]
    }
}

/// Why an object's data cannot be laid out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShmemLayoutError {
    /// A run is empty, overlaps the previous one or ends past the object.
    #[error(
        "object {id}: data run at {offset:#x} (+{len}) is empty, out of order or past its size {size}"
    )]
    BadRun {
        /// The object.
        id: u64,
        /// Where the run starts.
        offset: u64,
        /// Its length.
        len: u64,
        /// The object's size.
        size: u64,
    },
    /// The runs do not add up to the data file.
    #[error("object {id}: data runs total {declared} bytes, its data file has {file_len}")]
    Total {
        /// The object.
        id: u64,
        /// What the runs add up to.
        declared: u64,
        /// The data file's length.
        file_len: u64,
    },
}

impl ShmemObject {
    /// Checks the data runs with overflow-safe arithmetic: ascending,
    /// disjoint, non-empty, inside the object, and filling a data file of
    /// `file_len` bytes exactly. Pure, so restore refuses a bad image
    /// before it creates anything.
    pub fn check_runs(&self, file_len: u64) -> Result<(), ShmemLayoutError> {
        let mut next = 0u64;
        let mut declared = 0u64;
        for r in &self.data {
            let end = r.offset.checked_add(r.len);
            if r.len == 0 || r.offset < next || end.is_none_or(|e| e > self.size) {
                return Err(ShmemLayoutError::BadRun {
                    id: self.id,
                    offset: r.offset,
                    len: r.len,
                    size: self.size,
                });
            }
            next = end.unwrap_or(u64::MAX);
            declared = declared.saturating_add(r.len);
        }
        if declared != file_len {
            return Err(ShmemLayoutError::Total {
                id: self.id,
                declared,
                file_len,
            });
        }
        Ok(())
    }
}

impl ShmemObjects {
    /// The object with id `id` (objects are sorted by id; checked by the
    /// restorer before use).
    pub fn get(&self, id: u64) -> Option<&ShmemObject> {
        self.objects
            .binary_search_by_key(&id, |o| o.id)
            .ok()
            .map(|i| &self.objects[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_fit_their_kind() {
        let named = |kind: ShmemKind, name: &str| ShmemObject {
            kind: kind as i32,
            name: name.into(),
            ..Default::default()
        };
        assert!(named(ShmemKind::Anon, "").name_is_valid());
        assert!(!named(ShmemKind::Anon, "x").name_is_valid());
        assert!(named(ShmemKind::Memfd, "a b").name_is_valid());
        assert!(!named(ShmemKind::Memfd, &"m".repeat(250)).name_is_valid());
        assert!(!named(ShmemKind::Memfd, "a\0b").name_is_valid());
        assert!(!named(ShmemKind::TmpfsFile, "dev/shm/x").name_is_valid());
        let long = format!("/tmp/{}", "é".repeat(200));
        let deleted = named(ShmemKind::DeletedFile, &long);
        assert!(deleted.name_is_valid());
        assert!(deleted.memfd_name().len() <= MAX_MEMFD_NAME);
        assert!(deleted.memfd_name().starts_with('é'));
        assert_eq!(
            named(ShmemKind::DeletedFile, "/a/lib.so").memfd_name(),
            "lib.so"
        );
    }

    #[test]
    fn runs_must_be_ordered_inside_and_add_up() {
        let mut o = ShmemObject {
            id: 1,
            size: 0x3000,
            data: vec![
                ShmemRun {
                    offset: 0,
                    len: 0x1000,
                },
                ShmemRun {
                    offset: 0x2000,
                    len: 0x800,
                },
            ],
            ..Default::default()
        };
        assert_eq!(o.check_runs(0x1800), Ok(()));
        assert!(matches!(
            o.check_runs(0x1000),
            Err(ShmemLayoutError::Total { .. })
        ));
        o.data[1].offset = 0x800;
        assert!(matches!(
            o.check_runs(0x1800),
            Err(ShmemLayoutError::BadRun { .. })
        ));
        o.data[1].offset = u64::MAX;
        assert!(matches!(
            o.check_runs(0x1800),
            Err(ShmemLayoutError::BadRun { .. })
        ));
        o.data[1] = ShmemRun {
            offset: 0x2000,
            len: 0x1001,
        };
        assert!(matches!(
            o.check_runs(0x2001),
            Err(ShmemLayoutError::BadRun { .. })
        ));
    }
}
