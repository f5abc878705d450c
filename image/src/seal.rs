//! Sealing checkpoints with the site's key.
//!
//! ckpt runs as root on other users' jobs, so an image must not be able to
//! grant more than the dumped process had: whoever can write an image
//! directory (or hand one to an operator) could otherwise restore a process
//! as root with every capability. The dumper therefore seals the manifest
//! with HMAC-SHA256 under a key only root can read, and the restorer (and
//! `ckpt show`) refuse a manifest whose seal is missing or wrong. The
//! manifest holds the size, CRC32C and SHA-256 of every other file, so the
//! seal covers the whole checkpoint.
//!
//! The key is 32 random bytes in a file (default [`DEFAULT_KEY_PATH`],
//! overridden by `CKPT_IMAGE_KEY` or `--image-key`), created by the first
//! dump: directory 0700, file 0600, both owned by root. Restoring on another
//! node needs the same key there (copy it, like a munge key).
//!
//! The seal is `manifest.mac`: the magic `CKPTSEAL`, 8 bytes naming the key
//! (the start of SHA-256 over a label and the key, so a wrong key is told
//! apart from a tampered manifest), and HMAC-SHA256(key, label ‖ the whole
//! `manifest.img` file).

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

use crate::sys;

/// Where the key lives when nothing else is said.
pub const DEFAULT_KEY_PATH: &str = "/var/lib/ckpt/image.key";

/// Environment variable naming the key file (below `--image-key`).
pub const KEY_ENV: &str = "CKPT_IMAGE_KEY";

/// Bytes of key material.
pub const KEY_LEN: usize = 32;

/// File name of the seal inside a checkpoint directory.
pub const SEAL_NAME: &str = "manifest.mac";

const SEAL_MAGIC: &[u8; 8] = b"CKPTSEAL";
const KEY_ID_LEN: usize = 8;
const TAG_LEN: usize = 32;

/// Length of `manifest.mac`.
pub const SEAL_LEN: usize = SEAL_MAGIC.len() + KEY_ID_LEN + TAG_LEN;

/// Domain separation: this key seals nothing but ckpt manifests.
const MAC_LABEL: &[u8] = b"ckpt image manifest seal v1\0";
const KEY_ID_LABEL: &[u8] = b"ckpt image key id v1\0";
const USER_KEY_LABEL: &[u8] = b"ckpt user image key v1\0";

/// The key file to use: the `--image-key` flag, else `CKPT_IMAGE_KEY`, else
/// [`DEFAULT_KEY_PATH`].
pub fn key_path(flag: Option<&Path>) -> PathBuf {
    if let Some(p) = flag {
        return p.into();
    }
    match std::env::var_os(KEY_ENV) {
        Some(p) if !p.is_empty() => p.into(),
        _ => DEFAULT_KEY_PATH.into(),
    }
}

/// Something is wrong with the key file.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// No key file, and this command does not create one.
    #[error(
        "{path}: no image key; `ckpt dump` creates it, and restoring another node's checkpoint needs that node's key copied here"
    )]
    Missing {
        /// The key file.
        path: PathBuf,
    },
    /// An I/O call on the key file or its directory failed.
    #[error("{path}: {op}")]
    Io {
        /// The key file or its directory.
        path: PathBuf,
        /// What was being done.
        op: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The key file is not a regular file.
    #[error("{path}: image key is a {found}, not a regular file; refusing it")]
    NotRegular {
        /// The key file.
        path: PathBuf,
        /// What it is.
        found: &'static str,
    },
    /// Someone other than root owns the key file.
    #[error("{path}: image key is owned by uid {uid}, not root; refusing it")]
    Owner {
        /// The key file.
        path: PathBuf,
        /// Its owner.
        uid: u32,
    },
    /// The key file's mode lets others read or change it.
    #[error("{path}: image key has mode {mode:o}, not 600; refusing it")]
    Mode {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The key file does not hold exactly [`KEY_LEN`] bytes.
    #[error("{path}: image key is {len} bytes, not {KEY_LEN}; refusing it")]
    Length {
        /// The key file.
        path: PathBuf,
        /// Its length.
        len: u64,
    },
    /// No randomness for a new key.
    #[error("{path}: cannot get random bytes for a new image key: {reason}")]
    Random {
        /// The key file.
        path: PathBuf,
        /// The error (getrandom's error is not a `std` error without its
        /// `std` feature).
        reason: getrandom::Error,
    },
}

impl KeyError {
    /// The key file concerned.
    pub fn path(&self) -> &std::path::Path {
        match self {
            KeyError::Missing { path }
            | KeyError::Io { path, .. }
            | KeyError::NotRegular { path, .. }
            | KeyError::Owner { path, .. }
            | KeyError::Mode { path, .. }
            | KeyError::Length { path, .. }
            | KeyError::Random { path, .. } => path,
        }
    }
}

/// Why a seal did not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SealFailure {
    /// There is no `manifest.mac`.
    Missing,
    /// `manifest.mac` is not a seal.
    Malformed,
    /// Sealed with another key.
    OtherKey,
    /// Sealed with this key, but the manifest was changed since.
    Mismatch,
}

impl std::fmt::Display for SealFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SealFailure::Missing => "manifest.mac is missing",
            SealFailure::Malformed => "manifest.mac is not a ckpt seal",
            SealFailure::OtherKey => "sealed with another key",
            SealFailure::Mismatch => "the manifest was changed after it was sealed",
        })
    }
}

/// The site's image key.
#[derive(Clone)]
pub struct ImageKey {
    path: PathBuf,
    secret: [u8; KEY_LEN],
}

impl std::fmt::Debug for ImageKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImageKey")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl ImageKey {
    /// The key file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the key at `path`, which must be a regular file owned by root
    /// (or by the user ckpt runs as) with mode 0600 and [`KEY_LEN`] bytes.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let (dir, name) = split(path);
        let parent = sys::open_dir_path(dir).map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) => KeyError::Missing { path: path.into() },
            _ => KeyError::Io {
                path: dir.into(),
                op: "open key directory",
                source: e,
            },
        })?;
        let (mut f, st) = match sys::open_regular_at(parent.as_fd(), name) {
            Ok(x) => x,
            Err(sys::OpenError::NotRegular(t)) => {
                return Err(KeyError::NotRegular {
                    path: path.into(),
                    found: t.name(),
                });
            }
            Err(sys::OpenError::Io(e)) if e.raw_os_error() == Some(libc::ENOENT) => {
                return Err(KeyError::Missing { path: path.into() });
            }
            Err(sys::OpenError::Io(e)) => {
                return Err(KeyError::Io {
                    path: path.into(),
                    op: "open",
                    source: e,
                });
            }
        };
        if st.st_uid != 0 && st.st_uid != sys::euid() {
            return Err(KeyError::Owner {
                path: path.into(),
                uid: st.st_uid,
            });
        }
        let mode = st.st_mode & 0o7777;
        if mode != sys::FILE_MODE {
            return Err(KeyError::Mode {
                path: path.into(),
                mode,
            });
        }
        if st.st_size as u64 != KEY_LEN as u64 {
            return Err(KeyError::Length {
                path: path.into(),
                len: st.st_size as u64,
            });
        }
        let mut secret = [0u8; KEY_LEN];
        f.read_exact(&mut secret).map_err(|e| KeyError::Io {
            path: path.into(),
            op: "read",
            source: e,
        })?;
        Ok(ImageKey {
            path: path.into(),
            secret,
        })
    }

    /// Reads the key at `path`, creating it first if there is none: its
    /// directory (if missing) 0700, the file 0600 with [`KEY_LEN`] random
    /// bytes, written under a temporary name and renamed into place without
    /// replacing anything, so two dumps starting at once agree on one key.
    pub fn load_or_create(path: &Path) -> Result<Self, KeyError> {
        match Self::load(path) {
            Err(KeyError::Missing { .. }) => {}
            other => return other,
        }
        let (dir, name) = split(path);
        let io = |p: &Path, op: &'static str| {
            let p = p.to_path_buf();
            move |source| KeyError::Io {
                path: p,
                op,
                source,
            }
        };
        if std::fs::symlink_metadata(dir).is_err() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .create(dir)
                .map_err(io(dir, "create key directory"))?;
            let d = sys::open_dir_path(dir).map_err(io(dir, "open key directory"))?;
            sys::set_mode(d.as_fd(), sys::DIR_MODE).map_err(io(dir, "chmod key directory"))?;
        }
        let parent = sys::open_dir_path(dir).map_err(io(dir, "open key directory"))?;
        let mut secret = [0u8; KEY_LEN];
        getrandom::fill(&mut secret).map_err(|reason| KeyError::Random {
            path: path.into(),
            reason,
        })?;
        let mut tmp_name = name.to_owned();
        tmp_name.push(format!(".tmp.{}", std::process::id()));
        let tmp_path = dir.join(&tmp_name);
        // A leftover of a dumper that died with our pid.
        let _ = sys::unlink_at(parent.as_fd(), &tmp_name);
        let mut f = sys::create_file_at(parent.as_fd(), &tmp_name, false)
            .map_err(io(&tmp_path, "create"))?;
        let written = f
            .write_all(&secret)
            .and_then(|()| f.sync_all())
            .map_err(io(&tmp_path, "write"))
            .and_then(|()| {
                sys::rename_noreplace_at(parent.as_fd(), &tmp_name, name)
                    .map_err(io(path, "rename into place"))
            });
        drop(f);
        match written {
            Ok(sys::RenameOutcome::Renamed) => {
                sys::sync(parent.as_fd()).map_err(io(dir, "fsync key directory"))?;
            }
            // Another dump created it first: use that one.
            Ok(sys::RenameOutcome::Exists) => {
                let _ = sys::unlink_at(parent.as_fd(), &tmp_name);
            }
            Err(e) => {
                let _ = sys::unlink_at(parent.as_fd(), &tmp_name);
                return Err(e);
            }
        }
        Self::load(path)
    }

    /// A key from raw bytes, for tests and tools that hold the key elsewhere.
    pub fn from_secret(path: &Path, secret: [u8; KEY_LEN]) -> Self {
        ImageKey {
            path: path.into(),
            secret,
        }
    }

    /// The key that seals the images of user `uid` made by the ckpt
    /// service: derived from the site's key, so only root can compute it,
    /// and different for every user, so one user's images verify for no
    /// one else (a user handing the service someone else's checkpoint gets
    /// "sealed with another key"). Images the site seals with its own key
    /// verify for root only.
    pub fn for_user(&self, uid: u32) -> ImageKey {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.secret)
            .expect("HMAC accepts keys of any length");
        m.update(USER_KEY_LABEL);
        m.update(&uid.to_le_bytes());
        let mut secret = [0u8; KEY_LEN];
        secret.copy_from_slice(&m.finalize().into_bytes());
        ImageKey {
            path: self.path.clone(),
            secret,
        }
    }

    fn key_id(&self) -> [u8; KEY_ID_LEN] {
        let mut h = Sha256::new();
        h.update(KEY_ID_LABEL);
        h.update(self.secret);
        let d = h.finalize();
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&d[..KEY_ID_LEN]);
        id
    }

    fn mac(&self) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.secret)
            .expect("HMAC accepts keys of any length");
        m.update(MAC_LABEL);
        m
    }

    /// The contents of `manifest.mac` for the manifest file `manifest`.
    pub fn seal(&self, manifest: &[u8]) -> Vec<u8> {
        let mut m = self.mac();
        m.update(manifest);
        let mut out = Vec::with_capacity(SEAL_LEN);
        out.extend_from_slice(SEAL_MAGIC);
        out.extend_from_slice(&self.key_id());
        out.extend_from_slice(&m.finalize().into_bytes());
        out
    }

    /// Checks `seal` (the contents of `manifest.mac`) over `manifest`, in
    /// constant time.
    pub fn verify(&self, manifest: &[u8], seal: &[u8]) -> Result<(), SealFailure> {
        if seal.len() != SEAL_LEN || &seal[..SEAL_MAGIC.len()] != SEAL_MAGIC {
            return Err(SealFailure::Malformed);
        }
        let (id, tag) = seal[SEAL_MAGIC.len()..].split_at(KEY_ID_LEN);
        if id != self.key_id() {
            return Err(SealFailure::OtherKey);
        }
        let mut m = self.mac();
        m.update(manifest);
        m.verify_slice(tag).map_err(|_| SealFailure::Mismatch)
    }
}

/// The directory and file name of a key path (a bare name is in `.`).
fn split(path: &Path) -> (&Path, &OsStr) {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    (dir, path.file_name().unwrap_or(path.as_os_str()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn users_keys_differ_from_the_sites_and_from_each_other() {
        let site = super::ImageKey::from_secret(std::path::Path::new("k"), [7; super::KEY_LEN]);
        let (a, b) = (site.for_user(1000), site.for_user(1001));
        let manifest = b"manifest";
        assert!(a.verify(manifest, &a.seal(manifest)).is_ok());
        assert_eq!(
            b.verify(manifest, &a.seal(manifest)),
            Err(super::SealFailure::OtherKey)
        );
        assert_eq!(
            site.verify(manifest, &a.seal(manifest)),
            Err(super::SealFailure::OtherKey)
        );
        assert!(
            a.verify(manifest, &site.for_user(1000).seal(manifest))
                .is_ok()
        );
    }

    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn created_key_is_root_0600_in_a_0700_dir_and_reloads() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("var/lib/ckpt/image.key");
        let k = ImageKey::load_or_create(&path).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
        assert_eq!(meta.uid(), sys::euid());
        assert_eq!(meta.len(), KEY_LEN as u64);
        let dmeta = std::fs::metadata(path.parent().unwrap()).unwrap();
        assert_eq!(dmeta.permissions().mode() & 0o7777, 0o700);
        let again = ImageKey::load_or_create(&path).unwrap();
        assert_eq!(k.secret, again.secret, "an existing key was replaced");
        assert!(
            std::fs::read_dir(path.parent().unwrap()).unwrap().count() == 1,
            "temporary key file left behind"
        );
    }

    #[test]
    fn default_path_and_overrides() {
        assert_eq!(
            key_path(Some(Path::new("/k"))),
            PathBuf::from("/k"),
            "the flag wins"
        );
        if std::env::var_os(KEY_ENV).is_none() {
            assert_eq!(key_path(None), PathBuf::from(DEFAULT_KEY_PATH));
        }
    }

    #[test]
    fn unsafe_key_files_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let path = t.path().join("image.key");
        ImageKey::load_or_create(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            ImageKey::load(&path),
            Err(KeyError::Mode { mode: 0o644, .. })
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, b"short").unwrap();
        assert!(matches!(
            ImageKey::load(&path),
            Err(KeyError::Length { len: 5, .. })
        ));
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/zero", &path).unwrap();
        assert!(matches!(
            ImageKey::load_or_create(&path),
            Err(KeyError::NotRegular { .. })
        ));
        std::fs::remove_file(&path).unwrap();
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(matches!(
            ImageKey::load(&path),
            Err(KeyError::NotRegular { .. })
        ));
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(
            ImageKey::load(&path),
            Err(KeyError::Missing { .. })
        ));
        if sys::euid() == 0 {
            ImageKey::load_or_create(&path).unwrap();
            std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
            assert!(matches!(
                ImageKey::load(&path),
                Err(KeyError::Owner { uid: 65534, .. })
            ));
        }
    }

    #[test]
    fn seal_verifies_and_tells_failures_apart() {
        let k = ImageKey::from_secret(Path::new("k"), [7; KEY_LEN]);
        let other = ImageKey::from_secret(Path::new("o"), [8; KEY_LEN]);
        let s = k.seal(b"manifest");
        assert_eq!(s.len(), SEAL_LEN);
        assert_eq!(k.verify(b"manifest", &s), Ok(()));
        assert_eq!(k.verify(b"manifesT", &s), Err(SealFailure::Mismatch));
        assert_eq!(other.verify(b"manifest", &s), Err(SealFailure::OtherKey));
        assert_eq!(k.verify(b"manifest", &s[1..]), Err(SealFailure::Malformed));
        let mut bad = s.clone();
        bad[SEAL_LEN - 1] ^= 1;
        assert_eq!(k.verify(b"manifest", &bad), Err(SealFailure::Mismatch));
    }
}
