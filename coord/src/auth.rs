//! Per-job secret and the challenge-response that proves both ends hold it.
//!
//! The secret never crosses the wire: each side sends a fresh nonce and an HMAC-SHA256 over
//! both nonces and the peer's identity, so a recorded handshake cannot be replayed and a
//! process that does not hold the secret can neither join a job nor pose as its coordinator
//! (which would let it trigger, abort or poison a checkpoint).

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::protocol::{NONCE_LEN, Role};

/// Environment variable that carries the secret (hex) instead of a file.
pub const SECRET_ENV: &str = "CKPT_COORD_SECRET";

/// Secret length in bytes.
const SECRET_LEN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// Errors loading or creating a job secret.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// Reading or writing the secret file failed.
    #[error("secret file {path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The secret file can be read by other users, so it no longer protects the job.
    #[error("secret file {path} has mode {mode:o}; it must not be accessible by group or others")]
    Permissions {
        /// File.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
    /// The secret file is a FIFO, device, directory or socket: opening it
    /// could block or act, reading it means nothing.
    #[error("secret file {path} is a {found}, not a regular file; refused")]
    NotRegular {
        /// File.
        path: PathBuf,
        /// What it is.
        found: &'static str,
    },
    /// The secret is not valid hex or too short.
    #[error("secret from {origin} is not at least 16 bytes of hex")]
    Format {
        /// File path or environment variable.
        origin: String,
    },
    /// The OS random generator failed.
    #[error("cannot generate a secret or nonce: {0}")]
    Random(String),
}

/// A job secret. `Debug` hides it so it never lands in a log.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// Wraps raw secret bytes (tests and callers that manage secrets themselves).
    pub fn from_bytes(bytes: &[u8]) -> Secret {
        Secret(bytes.to_vec())
    }

    /// A fresh random secret.
    pub fn generate() -> Result<Secret, AuthError> {
        let mut b = vec![0u8; SECRET_LEN];
        getrandom::fill(&mut b).map_err(|e| AuthError::Random(e.to_string()))?;
        Ok(Secret(b))
    }

    /// Parses the hex form used in files and in [`SECRET_ENV`].
    pub fn from_hex(s: &str, origin: &str) -> Result<Secret, AuthError> {
        let s = s.trim();
        let bad = || AuthError::Format {
            origin: origin.to_string(),
        };
        if s.len() < 32 || !s.len().is_multiple_of(2) {
            return Err(bad());
        }
        let mut out = Vec::with_capacity(s.len() / 2);
        for pair in s.as_bytes().chunks(2) {
            let hex = std::str::from_utf8(pair).map_err(|_| bad())?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad())?);
        }
        Ok(Secret(out))
    }

    /// Hex form.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The secret from [`SECRET_ENV`] if set, else from `path`, creating the file (mode 0600)
    /// with a fresh secret at first use.
    pub fn load_or_create(path: &Path) -> Result<Secret, AuthError> {
        if let Ok(v) = std::env::var(SECRET_ENV) {
            return Secret::from_hex(&v, SECRET_ENV);
        }
        let io = |source| AuthError::Io {
            path: path.to_path_buf(),
            source,
        };
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(mut f) => {
                let s = Secret::generate()?;
                f.write_all(format!("{}\n", s.to_hex()).as_bytes())
                    .map_err(io)?;
                f.sync_all().map_err(io)?;
                Ok(s)
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Secret::load(path),
            Err(e) => Err(io(e)),
        }
    }

    /// The secret for a client or sub-coordinator: [`SECRET_ENV`] if set, else the
    /// existing file at `path` (clients never create one: only the root's is authoritative).
    pub fn load_client(path: &Path) -> Result<Secret, AuthError> {
        match std::env::var(SECRET_ENV) {
            Ok(v) => Secret::from_hex(&v, SECRET_ENV),
            Err(_) => Secret::load(path),
        }
    }

    /// Reads an existing secret file, refusing one that others can read.
    pub fn load(path: &Path) -> Result<Secret, AuthError> {
        let io = |source| AuthError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut f = open_regular(path)?;
        let mode = f.metadata().map_err(io)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(AuthError::Permissions {
                path: path.to_path_buf(),
                mode,
            });
        }
        let mut s = String::new();
        f.read_to_string(&mut s).map_err(io)?;
        Secret::from_hex(&s, &path.display().to_string())
    }

    /// HMAC over length-prefixed parts: the prefixes keep ("ab","c") and
    /// ("a","bc") from producing the same MAC.
    fn keyed(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut m = HmacSha256::new_from_slice(&self.0).expect("HMAC accepts any key length");
        for p in parts {
            m.update(&(p.len() as u32).to_le_bytes());
            m.update(p);
        }
        m
    }

    fn mac(&self, parts: &[&[u8]]) -> [u8; NONCE_LEN] {
        self.keyed(parts).finalize().into_bytes().into()
    }

    fn verify(&self, parts: &[&[u8]], proof: &[u8; NONCE_LEN]) -> bool {
        // Constant-time comparison, so timing reveals nothing about the expected MAC.
        self.keyed(parts).verify_slice(proof).is_ok()
    }

    /// The coordinator's proof, sent in `Challenge`.
    pub fn server_proof(
        &self,
        job: &str,
        client_nonce: &[u8; NONCE_LEN],
        server_nonce: &[u8; NONCE_LEN],
    ) -> [u8; NONCE_LEN] {
        self.mac(&server_parts(job, client_nonce, server_nonce))
    }

    /// Checks the coordinator's proof on the client side.
    pub fn verify_server(
        &self,
        job: &str,
        client_nonce: &[u8; NONCE_LEN],
        server_nonce: &[u8; NONCE_LEN],
        proof: &[u8; NONCE_LEN],
    ) -> bool {
        self.verify(&server_parts(job, client_nonce, server_nonce), proof)
    }

    /// The client's proof, sent in `Auth`; binds the job, node name and role it registered with.
    pub fn client_proof(
        &self,
        job: &str,
        node: &str,
        role: Role,
        server_nonce: &[u8; NONCE_LEN],
        client_nonce: &[u8; NONCE_LEN],
    ) -> [u8; NONCE_LEN] {
        let role = [role as u8];
        self.mac(&client_parts(job, node, &role, server_nonce, client_nonce))
    }

    /// Checks a client's proof on the coordinator side.
    pub fn verify_client(
        &self,
        job: &str,
        node: &str,
        role: Role,
        server_nonce: &[u8; NONCE_LEN],
        client_nonce: &[u8; NONCE_LEN],
        proof: &[u8; NONCE_LEN],
    ) -> bool {
        let role = [role as u8];
        self.verify(
            &client_parts(job, node, &role, server_nonce, client_nonce),
            proof,
        )
    }
}

/// What the coordinator's proof covers.
fn server_parts<'a>(
    job: &'a str,
    client_nonce: &'a [u8; NONCE_LEN],
    server_nonce: &'a [u8; NONCE_LEN],
) -> [&'a [u8]; 4] {
    [
        b"ckpt-coord server",
        job.as_bytes(),
        client_nonce,
        server_nonce,
    ]
}

/// What a client's proof covers: job, node name and role bound to both nonces.
fn client_parts<'a>(
    job: &'a str,
    node: &'a str,
    role: &'a [u8; 1],
    server_nonce: &'a [u8; NONCE_LEN],
    client_nonce: &'a [u8; NONCE_LEN],
) -> [&'a [u8]; 6] {
    [
        b"ckpt-coord client",
        job.as_bytes(),
        node.as_bytes(),
        role,
        server_nonce,
        client_nonce,
    ]
}

/// Opens `path` for reading only if it is a regular file. An `O_PATH` open
/// comes first, which opens nothing: a FIFO there would block a plain open
/// for ever, a device open could act. The file checked is then opened for
/// real through that fd, so it is the one checked.
fn open_regular(path: &Path) -> Result<fs::File, AuthError> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileTypeExt;
    let io = |source| AuthError::Io {
        path: path.to_path_buf(),
        source,
    };
    let named = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
        .open(path)
        .map_err(io)?;
    let kind = named.metadata().map_err(io)?.file_type();
    if !kind.is_file() {
        let found = if kind.is_fifo() {
            "FIFO"
        } else if kind.is_socket() {
            "socket"
        } else if kind.is_dir() {
            "directory"
        } else {
            "device"
        };
        return Err(AuthError::NotRegular {
            path: path.to_path_buf(),
            found,
        });
    }
    fs::File::open(format!("/proc/self/fd/{}", named.as_raw_fd())).map_err(io)
}

/// A fresh random nonce.
pub fn nonce() -> Result<[u8; NONCE_LEN], AuthError> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| AuthError::Random(e.to_string()))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proofs_bind_identity_and_secret() {
        let s = Secret::generate().unwrap();
        let other = Secret::generate().unwrap();
        let (c, n) = ([1; NONCE_LEN], [2; NONCE_LEN]);
        let p = s.client_proof("j", "n1", Role::Agent, &n, &c);
        assert!(s.verify_client("j", "n1", Role::Agent, &n, &c, &p));
        assert!(!s.verify_client("j", "n2", Role::Agent, &n, &c, &p));
        assert!(!s.verify_client("j", "n1", Role::Control, &n, &c, &p));
        assert!(!other.verify_client("j", "n1", Role::Agent, &n, &c, &p));
        let sp = s.server_proof("j", &c, &n);
        assert!(s.verify_server("j", &c, &n, &sp));
        assert!(!other.verify_server("j", &c, &n, &sp));
    }

    #[test]
    fn secret_file_created_0600_and_reloaded() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("job.secret");
        let a = Secret::load_or_create(&p).unwrap();
        let mode = fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(Secret::load_or_create(&p).unwrap(), a);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            Secret::load(&p),
            Err(AuthError::Permissions { .. })
        ));
    }

    /// A FIFO of mode 0600 would block a plain open for ever.
    #[test]
    fn a_fifo_secret_is_refused_without_blocking() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("job.secret");
        let made = std::process::Command::new("mkfifo")
            .args(["-m", "600"])
            .arg(&p)
            .status()
            .unwrap();
        assert!(made.success());
        for r in [Secret::load(&p), Secret::load_or_create(&p)] {
            assert!(
                matches!(r, Err(AuthError::NotRegular { found: "FIFO", .. })),
                "{r:?}"
            );
        }
    }
}
