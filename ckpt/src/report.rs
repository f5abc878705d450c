//! How `ckpt` reports a failure: one line on stderr (`ckpt: error: ...`), or
//! with `--json` one object on stdout, and an exit code per class of error
//! so scripts and schedulers can tell "try again later" from "this job can
//! never be checkpointed".

use std::process::ExitCode;

use ckpt_dumper::DumpError;
use ckpt_image::{ImageError, PathError};
use ckpt_parasite::ParasiteError;
use ckpt_restorer::RestoreError;

/// The class of a failure; each has its own exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Something else went wrong (a bug, an unexpected OS error).
    Internal,
    /// Bad arguments.
    Usage,
    /// The target holds something ckpt cannot save (yet).
    Unsupported,
    /// ckpt may not trace, read or write what it needs.
    Permission,
    /// The target process does not exist or died meanwhile.
    TargetGone,
    /// Reading or writing the checkpoint's storage failed.
    Storage,
    /// The checkpoint is missing, corrupted, tampered with or inconsistent.
    ImageInvalid,
    /// This machine cannot take the restore as things are: a pid in use, a
    /// changed file, another CPU or kernel.
    Conflict,
}

impl ErrorKind {
    /// Every class.
    #[cfg(test)]
    pub const ALL: [ErrorKind; 8] = [
        ErrorKind::Internal,
        ErrorKind::Usage,
        ErrorKind::Unsupported,
        ErrorKind::Permission,
        ErrorKind::TargetGone,
        ErrorKind::Storage,
        ErrorKind::ImageInvalid,
        ErrorKind::Conflict,
    ];

    /// The process exit code (documented in docs/usage.md).
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorKind::Internal => 1,
            ErrorKind::Usage => 2,
            ErrorKind::Unsupported => 3,
            ErrorKind::Permission => 4,
            ErrorKind::TargetGone => 5,
            ErrorKind::Storage => 6,
            ErrorKind::ImageInvalid => 7,
            ErrorKind::Conflict => 8,
        }
    }

    /// The name in JSON error objects.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Internal => "internal",
            ErrorKind::Usage => "usage",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Permission => "permission",
            ErrorKind::TargetGone => "target_gone",
            ErrorKind::Storage => "storage",
            ErrorKind::ImageInvalid => "image_invalid",
            ErrorKind::Conflict => "conflict",
        }
    }
}

/// One failure, ready to print.
#[derive(Debug)]
pub struct ErrorReport {
    /// Its class.
    pub kind: ErrorKind,
    /// The process it concerns, if one.
    pub pid: Option<i32>,
    /// The fd it concerns, if one.
    pub fd: Option<i32>,
    /// The file it concerns, if one.
    pub path: Option<String>,
    /// The whole message, one line.
    pub message: String,
    /// For a dump refused for several reasons: each of them.
    pub blockers: Vec<ckpt_dumper::Blocker>,
    /// What the failing step was part of (the contexts around the dump
    /// error, e.g. `node a: epoch 3: DUMP` of a coordinated dump), named in
    /// the summary of a refused dump.
    pub scope: Option<String>,
}

impl ErrorReport {
    /// Classifies an error from any layer of ckpt.
    pub fn from_error(e: &anyhow::Error) -> ErrorReport {
        let message = one_line(e);
        let mut r = ErrorReport {
            kind: ErrorKind::Internal,
            pid: None,
            fd: None,
            path: None,
            message,
            blockers: Vec::new(),
            scope: None,
        };
        let mut outer = Vec::new();
        for cause in e.chain() {
            if let Some(d) = cause.downcast_ref::<DumpError>() {
                r.classify_dump(d);
                r.scope = (!outer.is_empty()).then(|| outer.join(": "));
                break;
            }
            outer.push(cause.to_string());
            if let Some(re) = cause.downcast_ref::<RestoreError>() {
                r.classify_restore(re);
                break;
            }
            if let Some(i) = cause.downcast_ref::<ImageError>() {
                r.classify_image(i);
                break;
            }
            if let Some(p) = cause.downcast_ref::<PathError>() {
                r.classify_path(p);
                break;
            }
            if let Some(p) = cause.downcast_ref::<ParasiteError>() {
                r.classify_parasite(p);
                break;
            }
            if let Some(k) = cause.downcast_ref::<ckpt_image::KeyError>() {
                r.kind = ErrorKind::Permission;
                r.path = Some(k.path().display().to_string());
                break;
            }
            // A job directory, or an entry in it, that is not the user's
            // own to trust (a link, another user's, writable by others).
            if let Some(
                ckpt_job::dir::DirError::SymLink { .. }
                | ckpt_job::dir::DirError::NotOurs { .. }
                | ckpt_job::dir::DirError::OthersWrite { .. },
            ) = cause.downcast_ref::<ckpt_job::dir::DirError>()
            {
                r.kind = ErrorKind::Permission;
                break;
            }
            if let Some(s) = cause.downcast_ref::<crate::service::ServiceError>() {
                // Busy may go through next time, as a conflict does.
                r.kind = match s {
                    crate::service::ServiceError::Busy { .. } => ErrorKind::Conflict,
                    _ => ErrorKind::Permission,
                };
                break;
            }
        }
        // What nothing above claimed but the kernel refused for want of
        // rights (a job directory, a secret, a socket of another user's)
        // is a permission problem too.
        if r.kind == ErrorKind::Internal
            && e.chain().any(|c| {
                c.downcast_ref::<std::io::Error>()
                    .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
                    || c.is::<ckpt_image::caller::RightsError>()
            })
        {
            r.kind = ErrorKind::Permission;
        }
        r.fd = r.fd.or_else(|| fd_in(&r.message));
        r
    }

    /// A usage error (bad arguments).
    pub fn usage(message: String) -> ErrorReport {
        ErrorReport {
            kind: ErrorKind::Usage,
            pid: None,
            fd: None,
            path: None,
            message,
            blockers: Vec::new(),
            scope: None,
        }
    }

    fn classify_dump(&mut self, e: &DumpError) {
        match e {
            DumpError::NoProcess { pid } | DumpError::Exited { pid, .. } => {
                self.set(ErrorKind::TargetGone, Some(*pid))
            }
            DumpError::Permission { pid, .. } => self.set(ErrorKind::Permission, Some(*pid)),
            DumpError::Unsupported { pid, .. }
            | DumpError::Ib { pid, .. }
            | DumpError::SrunPmixRank { pid, .. }
            | DumpError::NetworkLock { pid, .. } => self.set(ErrorKind::Unsupported, Some(*pid)),
            DumpError::Blocked { blockers } => {
                self.set(ErrorKind::Unsupported, None);
                self.blockers = blockers.clone();
            }
            DumpError::Proc { pid, path, .. } => {
                self.set(ErrorKind::Internal, Some(*pid));
                self.path = Some(path.display().to_string());
            }
            DumpError::Parse { pid, path, .. } => {
                self.set(ErrorKind::Internal, Some(*pid));
                self.path = Some(path.clone());
            }
            // The job changed under a background dump: like a conflict
            // with another user of the process, it may go through next time.
            DumpError::BackgroundLost { pid, .. } => self.set(ErrorKind::Conflict, Some(*pid)),
            // Another node of the job failed: this one may go through next time.
            DumpError::ThawRefused { pid, .. } => self.set(ErrorKind::Conflict, Some(*pid)),
            DumpError::Parasite(p) => self.classify_parasite(p),
            DumpError::Image(i) => self.classify_image(i),
        }
    }

    fn classify_restore(&mut self, e: &RestoreError) {
        match e {
            RestoreError::Image(i) => self.classify_image(i),
            RestoreError::PidInUse { pid, .. } | RestoreError::PidWaitTimeout { pid, .. } => {
                self.set(ErrorKind::Conflict, Some(*pid))
            }
            RestoreError::NotCallers { pid, .. } => self.set(ErrorKind::Permission, Some(*pid)),
            RestoreError::Incompatible { dir, .. } => {
                self.set(ErrorKind::Conflict, None);
                self.path = Some(dir.display().to_string());
            }
            RestoreError::Host { pid, .. }
            | RestoreError::Ib { pid, .. }
            | RestoreError::Vdso { pid, .. } => self.set(ErrorKind::Conflict, Some(*pid)),
            RestoreError::NetNamespace { path, .. } | RestoreError::MntNamespace { path, .. } => {
                self.set(ErrorKind::Usage, None);
                self.path = Some(path.display().to_string());
            }
            RestoreError::File { pid, path, .. } => {
                self.set(ErrorKind::Conflict, Some(*pid));
                self.path = Some(path.clone());
            }
            RestoreError::Changed { pid, at, path, .. } => {
                self.set(ErrorKind::Conflict, Some(*pid));
                self.path = Some(path.clone());
                if let ckpt_restorer::FileUse::Fd(fd) = at {
                    self.fd = Some(*fd);
                }
            }
            RestoreError::Os { pid, .. } => self.set(ErrorKind::Internal, Some(*pid)),
            // The job step around the restore is not the one the rank needs.
            RestoreError::Pmix { pid, fd, .. } => {
                self.set(ErrorKind::Conflict, Some(*pid));
                self.fd = Some(*fd);
            }
            // As the death of the process's leader (`ParasiteError::Died`).
            RestoreError::ThreadDied { pid, .. } => self.set(ErrorKind::TargetGone, Some(*pid)),
            RestoreError::Parasite(p) => self.classify_parasite(p),
            RestoreError::Ipc { .. } => self.set(ErrorKind::Conflict, None),
        }
    }

    fn classify_image(&mut self, e: &ImageError) {
        let (kind, path) = match e {
            // A checkpoint that is not there is a bad argument about images,
            // not a storage failure.
            ImageError::Io { path, source, .. } => match source.kind() {
                std::io::ErrorKind::NotFound => (ErrorKind::ImageInvalid, path),
                std::io::ErrorKind::PermissionDenied => (ErrorKind::Permission, path),
                _ => (ErrorKind::Storage, path),
            },
            ImageError::Exists { path } => (ErrorKind::Usage, path),
            ImageError::NotListed { dir, .. } => (ErrorKind::ImageInvalid, dir),
            // The ckpt service seals each user's images with that user's
            // key: for a user, another key's are someone else's.
            ImageError::NotSealed {
                path,
                why: ckpt_image::seal::SealFailure::OtherKey,
                ..
            } if ckpt_image::caller::acting_for().is_some() => {
                self.message.push_str(
                    " (the ckpt service seals each user's images with a key of their own: these are not yours)",
                );
                (ErrorKind::Permission, path)
            }
            ImageError::BadMagic { path, .. }
            | ImageError::Version { path, .. }
            | ImageError::Size { path, .. }
            | ImageError::Checksum { path }
            | ImageError::Decode { path, .. }
            | ImageError::TooLarge { path, .. }
            | ImageError::NotSealed { path, .. }
            | ImageError::NotRegular { path, .. }
            | ImageError::Invalid { path, .. } => (ErrorKind::ImageInvalid, path),
            // Someone else could write the checkpoint, or swapped the dump's
            // directory: a permission problem of the storage, not of ckpt.
            ImageError::Unsafe { path, .. } | ImageError::Hijacked { path, .. } => {
                (ErrorKind::Permission, path)
            }
            ImageError::Key(k) => {
                self.kind = ErrorKind::Permission;
                self.path = Some(k.path().display().to_string());
                return;
            }
            ImageError::Path(p) => return self.classify_path(p),
        };
        self.kind = kind;
        self.path = Some(path.display().to_string());
    }

    /// A path ckpt was to write as root: refused (a user's symlink, a
    /// FIFO, a hard link) is a permission problem; otherwise as the OS said.
    fn classify_path(&mut self, e: &PathError) {
        self.kind = match e {
            PathError::Io { source, .. } => match source.kind() {
                std::io::ErrorKind::NotFound => ErrorKind::Usage,
                std::io::ErrorKind::PermissionDenied => ErrorKind::Permission,
                _ => ErrorKind::Storage,
            },
            _ => ErrorKind::Permission,
        };
        self.path = Some(e.path().display().to_string());
    }

    fn classify_parasite(&mut self, e: &ParasiteError) {
        let pid = match e {
            ParasiteError::Ptrace { pid, .. }
            | ParasiteError::AlreadyTraced { pid, .. }
            | ParasiteError::Died { pid, .. }
            | ParasiteError::UnexpectedStop { pid, .. }
            | ParasiteError::Mem { pid, .. }
            | ParasiteError::RemoteSyscall { pid, .. }
            | ParasiteError::Command { pid, .. }
            | ParasiteError::Userfault { pid, .. }
            | ParasiteError::Layout { pid, .. } => *pid,
            ParasiteError::RemoteOpen { pid, path, .. } => {
                self.path = Some(path.clone());
                *pid
            }
        };
        let kind = match e {
            ParasiteError::Died { .. } => ErrorKind::TargetGone,
            ParasiteError::AlreadyTraced { .. } => ErrorKind::Conflict,
            ParasiteError::RemoteOpen { .. } => ErrorKind::Conflict,
            _ => ErrorKind::Internal,
        };
        self.set(kind, Some(pid));
    }

    fn set(&mut self, kind: ErrorKind, pid: Option<i32>) {
        self.kind = kind;
        self.pid = pid;
    }

    /// Prints the report (stderr line, or JSON on stdout) and returns the
    /// exit code.
    pub fn emit(&self, json: bool) -> ExitCode {
        if json {
            let blockers: Vec<serde_json::Value> = self
                .blockers
                .iter()
                .map(|b| {
                    serde_json::json!({
                        "pid": b.pid,
                        "fd": fd_in(&b.what),
                        "message": format!("pid {}: {} not supported", b.pid, b.what),
                    })
                })
                .collect();
            // Already failing: a stdout that cannot take the report
            // leaves only the exit code to say it.
            let _ = crate::commands::print_stdout(&format!(
                "{}\n",
                serde_json::json!({ "error": {
                    "kind": self.kind.name(),
                    "pid": self.pid,
                    "fd": self.fd,
                    "path": self.path,
                    "message": self.message,
                    "blockers": blockers,
                }})
            ));
        } else if self.blockers.is_empty() {
            eprintln!("ckpt: error: {}", self.message);
        } else {
            // One line per blocker, then the summary.
            for b in &self.blockers {
                eprintln!("ckpt: error: pid {}: {} not supported", b.pid, b.what);
            }
            let mut pids: Vec<i32> = self.blockers.iter().map(|b| b.pid).collect();
            pids.sort_unstable();
            pids.dedup();
            let scope = self
                .scope
                .as_ref()
                .map_or(String::new(), |s| format!("{s}: "));
            eprintln!(
                "ckpt: error: {scope}dump refused: {} things cannot be saved, in {} process{}; the tree keeps running",
                self.blockers.len(),
                pids.len(),
                if pids.len() == 1 { "" } else { "es" }
            );
        }
        ExitCode::from(self.kind.exit_code())
    }
}

/// The error and its causes as one line, without repeating a cause whose
/// text the previous message already includes (thiserror messages often
/// embed their source).
fn one_line(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out.replace('\n', " ")
}

/// The fd an error message names ("... fd 7: ..."), for the JSON report.
fn fd_in(message: &str) -> Option<i32> {
    let at = message.find("fd ")?;
    let digits: String = message[at + 3..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_distinct() {
        let mut codes: Vec<u8> = ErrorKind::ALL.iter().map(|k| k.exit_code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), ErrorKind::ALL.len());
        assert!(!codes.contains(&0));
    }

    #[test]
    fn causes_are_not_repeated() {
        let io = std::io::Error::from_raw_os_error(libc::ENOENT);
        let e = anyhow::Error::new(ImageError::io("/x/manifest.img", "open", io))
            .context("restore from /x failed");
        let line = one_line(&e);
        assert_eq!(
            line.matches("No such file or directory").count(),
            1,
            "{line}"
        );
        let r = ErrorReport::from_error(&e);
        assert_eq!(r.kind, ErrorKind::ImageInvalid);
        assert_eq!(r.path.as_deref(), Some("/x/manifest.img"));
    }

    #[test]
    fn unsupported_fd_is_classified_with_pid_and_fd() {
        let e = anyhow::Error::new(DumpError::Unsupported {
            pid: 123,
            what: "fd 7: socket".into(),
        });
        let r = ErrorReport::from_error(&e);
        assert_eq!(
            (r.kind, r.pid, r.fd),
            (ErrorKind::Unsupported, Some(123), Some(7))
        );
        assert_eq!(r.message, "pid 123: fd 7: socket not supported");
    }
}
