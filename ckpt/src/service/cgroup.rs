//! The caller's control groups, which the service's worker joins before any
//! work, so that what it restores is accounted, limited and killed as the
//! caller's job: a scheduler tracks a job's processes by their cgroups
//! (Slurm's proctrack/cgroup, in the v1 hierarchies on a host without the
//! unified one, in the v2 hierarchy on the others).

use std::path::{Path, PathBuf};

use procfs::ProcessCGroup;
use procfs::process::{MountInfo, Process};

/// A cgroup hierarchy mounted on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// The cgroup at the mount's root (not `/` inside a cgroup namespace
    /// or for a bind mount of a sub-tree).
    pub root: String,
    /// Its kind: v2, or v1 with these controllers (`name=NAME` for a named
    /// hierarchy without one).
    pub kind: HierarchyKind,
}

/// What a mounted hierarchy is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HierarchyKind {
    /// The unified hierarchy (cgroup2).
    Unified,
    /// A v1 hierarchy with its controllers.
    V1(Vec<String>),
}

impl Hierarchy {
    /// The hierarchies mounted in this process's mount namespace.
    pub fn mounted() -> Vec<Hierarchy> {
        let Ok(mounts) = Process::myself().and_then(|p| p.mountinfo()) else {
            return Vec::new();
        };
        mounts.into_iter().filter_map(Self::of_mount).collect()
    }

    fn of_mount(m: MountInfo) -> Option<Hierarchy> {
        let kind = match m.fs_type.as_str() {
            "cgroup2" => HierarchyKind::Unified,
            "cgroup" => {
                let mut controllers: Vec<String> = m
                    .super_options
                    .iter()
                    .filter_map(|(k, v)| match (k.as_str(), v) {
                        ("name", Some(name)) => Some(format!("name={name}")),
                        (_, None) if !matches!(k.as_str(), "rw" | "ro") => Some(k.clone()),
                        _ => None,
                    })
                    .collect();
                controllers.sort();
                HierarchyKind::V1(controllers)
            }
            _ => return None,
        };
        Some(Hierarchy {
            mount_point: m.mount_point,
            root: m.root,
            kind,
        })
    }

    /// Whether the line of `/proc/PID/cgroup` is about this hierarchy.
    fn holds(&self, line: &ProcessCGroup) -> bool {
        match &self.kind {
            HierarchyKind::Unified => line.hierarchy == 0 && line.controllers.is_empty(),
            HierarchyKind::V1(controllers) => {
                let mut theirs = line.controllers.clone();
                theirs.sort();
                line.hierarchy != 0 && !theirs.is_empty() && &theirs == controllers
            }
        }
    }
}

/// The directories of the cgroups `lines` (a process's `/proc/PID/cgroup`)
/// names, in every hierarchy of `mounted` it is in. A cgroup outside a
/// mount's root is not reachable through it and is left out.
pub fn dirs(lines: &[ProcessCGroup], mounted: &[Hierarchy]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for line in lines {
        let Some(h) = mounted.iter().find(|h| h.holds(line)) else {
            continue;
        };
        let root = h.root.trim_end_matches('/');
        let Some(rel) = line.pathname.strip_prefix(root) else {
            continue;
        };
        if !(rel.is_empty() || rel.starts_with('/')) {
            continue;
        }
        let dir = h.mount_point.join(rel.trim_start_matches('/'));
        if !dirs.contains(&dir) {
            dirs.push(dir);
        }
    }
    dirs
}

/// The cgroup directories of process `pid`, in every mounted hierarchy.
pub fn dirs_of(pid: i32) -> Vec<PathBuf> {
    let Ok(lines) = Process::new(pid).and_then(|p| p.cgroups()) else {
        return Vec::new();
    };
    dirs(&lines.0, &Hierarchy::mounted())
}

/// Moves this process into every cgroup directory of `dirs`.
pub fn join(dirs: &[PathBuf]) -> anyhow::Result<()> {
    use anyhow::Context;
    for dir in dirs {
        let procs = dir.join("cgroup.procs");
        std::fs::write(&procs, b"0\n").with_context(|| format!("{}: join", procs.display()))?;
    }
    Ok(())
}

/// The directories as one environment value, one per line (a cgroup's
/// name cannot hold a newline that `/proc/PID/cgroup` could show).
pub fn encode(dirs: &[PathBuf]) -> std::ffi::OsString {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        if i > 0 {
            out.push(b'\n');
        }
        out.extend_from_slice(d.as_os_str().as_bytes());
    }
    std::os::unix::ffi::OsStringExt::from_vec(out)
}

/// The directories of an [`encode`]d value.
pub fn decode(value: &std::ffi::OsStr) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    value
        .as_bytes()
        .split(|&b| b == b'\n')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(std::ffi::OsStr::from_bytes(d)).to_path_buf())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(hierarchy: u32, controllers: &[&str], pathname: &str) -> ProcessCGroup {
        ProcessCGroup {
            hierarchy,
            controllers: controllers.iter().map(|c| c.to_string()).collect(),
            pathname: pathname.into(),
        }
    }

    fn v1(mount: &str, root: &str, controllers: &[&str]) -> Hierarchy {
        Hierarchy {
            mount_point: mount.into(),
            root: root.into(),
            kind: HierarchyKind::V1(controllers.iter().map(|c| c.to_string()).collect()),
        }
    }

    #[test]
    fn v1_hierarchies_are_joined_each_at_the_callers_cgroup() {
        let lines = [
            line(9, &["name=systemd"], "/"),
            line(4, &["memory"], "/slurm/uid_999/job_7/step_batch"),
            line(2, &["cpuacct", "cpu"], "/slurm/uid_999/job_7"),
            line(5, &["devices"], "/"),
            // Unified hierarchy not mounted: left out.
            line(0, &[], "/"),
        ];
        let mounted = [
            v1("/sys/fs/cgroup/memory", "/", &["memory"]),
            v1("/sys/fs/cgroup/cpu,cpuacct", "/", &["cpu", "cpuacct"]),
            v1("/sys/fs/cgroup/systemd", "/", &["name=systemd"]),
        ];
        assert_eq!(
            dirs(&lines, &mounted),
            [
                PathBuf::from("/sys/fs/cgroup/systemd"),
                PathBuf::from("/sys/fs/cgroup/memory/slurm/uid_999/job_7/step_batch"),
                PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/slurm/uid_999/job_7"),
            ]
        );
    }

    #[test]
    fn unified_hierarchy_is_joined_below_its_mounts_root_only() {
        let unified = |root: &str| Hierarchy {
            mount_point: "/sys/fs/cgroup".into(),
            root: root.into(),
            kind: HierarchyKind::Unified,
        };
        let lines = [line(0, &[], "/system.slice/slurmstepd.scope/job_7")];
        assert_eq!(
            dirs(&lines, &[unified("/")]),
            [PathBuf::from(
                "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7"
            )]
        );
        assert_eq!(
            dirs(&lines, &[unified("/system.slice")]),
            [PathBuf::from("/sys/fs/cgroup/slurmstepd.scope/job_7")]
        );
        // Not under the mount's root, nor a sibling sharing its prefix.
        assert!(dirs(&lines, &[unified("/user.slice")]).is_empty());
        assert!(dirs(&lines, &[unified("/system.sl")]).is_empty());
    }

    #[test]
    fn directories_travel_through_one_variable() {
        let d = vec![
            PathBuf::from("/sys/fs/cgroup/memory/a b"),
            PathBuf::from("/sys/fs/cgroup/pids/c"),
        ];
        assert_eq!(decode(&encode(&d)), d);
        assert!(decode(&encode(&[])).is_empty());
    }
}
