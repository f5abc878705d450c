//! The manifest: what the checkpoint holds, where it was taken, written
//! last (its seal covers every other file).

use ckpt_image::manifest::{Manifest, PidNamespace, ProcessEntry};

use crate::error::{DumpError, Result};
use crate::features;

/// The manifest of a checkpoint of the tree of `root`, made of
/// `processes` (the live ones first, tree order).
pub(crate) fn build(
    root: i32,
    processes: Vec<ProcessEntry>,
    root_core: &ckpt_image::task::Core,
) -> Result<Manifest> {
    let pid = root;
    let uts = nix::sys::utsname::uname().map_err(|e| DumpError::Proc {
        pid,
        path: "uname".into(),
        source: e.into(),
    })?;
    Ok(Manifest {
        tool_version: env!("CARGO_PKG_VERSION").into(),
        kernel: format!(
            "{} {}",
            uts.release().to_string_lossy(),
            uts.version().to_string_lossy()
        ),
        arch: std::env::consts::ARCH.into(),
        cpu: Some(features::cpu_info(&root_core.xstate)),
        created_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        root_pid: root,
        processes,
        files: Vec::new(),
        hostname: uts.nodename().to_string_lossy().into_owned(),
        pid_namespace: None,
        pre_dump: false,
        namespaces: None,
    })
}

/// Records that the tree fills its own PID namespace: `root` is the
/// host's pid of its root, `saved_root` the namespace's.
pub(crate) fn in_pid_namespace(manifest: &mut Manifest, root: i32, saved_root: i32) {
    manifest.root_pid = saved_root;
    manifest.pid_namespace = Some(PidNamespace {
        root_host_pid: root,
    });
}
