//! The service's worker: the `ckpt` process that does one user's request,
//! as root, acting for that user.

use ckpt_image::Caller;

use super::ServiceError;

/// The caller's ids, `UID:GID:G1,...`, set by the service only (its worker
/// starts with an empty environment plus this).
pub const CALLER_ENV: &str = "CKPT_SERVICE_CALLER";
/// The caller's cgroup directories, one per mounted hierarchy and line,
/// which the worker joins before any work.
pub const CGROUP_ENV: &str = "CKPT_SERVICE_CGROUP";

/// Prefix of the variables that carry the client's environment, one
/// `KEY=VALUE` each: the environment of the job a worker's `ckpt run`
/// starts, and the job step's PMIx variables a worker's `ckpt restore`
/// reconnects ranks with.
pub const JOB_ENV_PREFIX: &str = "CKPT_JOB_ENV_";

/// The client's environment, as the service handed it over.
pub fn job_env() -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    use std::os::unix::ffi::OsStrExt;
    let mut numbered: Vec<(usize, std::ffi::OsString)> = std::env::vars_os()
        .filter_map(|(k, v)| {
            let n = k.to_str()?.strip_prefix(JOB_ENV_PREFIX)?.parse().ok()?;
            Some((n, v))
        })
        .collect();
    numbered.sort_by_key(|(n, _)| *n);
    numbered
        .into_iter()
        .filter_map(|(_, kv)| {
            let bytes = kv.as_bytes();
            let eq = bytes.iter().position(|&b| b == b'=')?;
            Some((
                std::ffi::OsStr::from_bytes(&bytes[..eq]).to_owned(),
                std::ffi::OsStr::from_bytes(&bytes[eq + 1..]).to_owned(),
            ))
        })
        .collect()
}

/// Makes this process act for the caller the service named, if it is the
/// service's worker (root, with [`CALLER_ENV`] set; a user setting it gets
/// nothing, having no root to restrict). Joins the caller's cgroup first, so
/// that what it restores is accounted and limited as the caller's job (a
/// scheduler tracks a job's processes by their cgroup).
pub fn enter() -> anyhow::Result<Option<&'static Caller>> {
    let Some(text) = std::env::var_os(CALLER_ENV) else {
        return Ok(None);
    };
    if !nix::unistd::geteuid().is_root() {
        return Ok(None);
    }
    let caller = Caller::decode(&text.to_string_lossy())?;
    if let Some(dirs) = std::env::var_os(CGROUP_ENV) {
        super::cgroup::join(&super::cgroup::decode(&dirs))?;
    }
    ckpt_image::caller::act_for(caller).map_err(|c| anyhow::anyhow!("already acting for {c}"))?;
    Ok(ckpt_image::caller::acting_for())
}

/// Refuses, for a worker, a command or flag the service does not run for
/// users; `refusal` is what the command's arguments found (a flag and what
/// to do instead).
pub fn refuse(what: &str, hint: &'static str) -> anyhow::Error {
    ServiceError::NotForUsers {
        what: what.into(),
        hint,
    }
    .into()
}

/// The hint for flags that would have root act on a path or program the
/// user names.
pub const ROOT_ONLY_HINT: &str = "run ckpt as root for it";
