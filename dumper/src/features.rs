//! What ckpt needs from the kernel and the CPU, probed at run time
//! (`ckpt check`, and the CPU description stored in every manifest).

use ckpt_image::manifest::CpuInfo;

use crate::sys;

/// One probed feature.
#[derive(Debug, Clone)]
pub struct Feature {
    /// Short name.
    pub name: &'static str,
    /// Present and usable.
    pub ok: bool,
    /// Needed for a basic dump/restore (false: only for later features).
    pub required: bool,
    /// A privilege of the process running ckpt (root has it; an ordinary
    /// user's dumps and restores go to the ckpt service, which has it).
    pub privilege: bool,
    /// What was found.
    pub detail: String,
}

/// The CPU's register-state layout, from CPUID and a task's XSAVE area.
pub fn cpu_info(xstate: &[u8]) -> CpuInfo {
    // XCR0 straight from the CPU (xgetbv): it is the same for every task of
    // this kernel, and reading it from a task's XSAVE area depends on which
    // software-reserved layout the kernel used for that copy.
    CpuInfo {
        vendor: ckpt_parasite::cpu_vendor(),
        xcr0: ckpt_parasite::xcr0(),
        xsave_size: xstate.len() as u32,
    }
}

/// What a probed feature is needed for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// Every dump or restore.
    Basic,
    /// Every dump or restore, and it is a privilege of who runs it.
    Privilege,
    /// Only some features.
    Later,
}

/// Probes everything `ckpt check` reports.
pub fn probe() -> Vec<Feature> {
    let mut out = Vec::new();
    let mut add = |name, need: Need, r: Result<String, String>| {
        let ok = r.is_ok();
        out.push(Feature {
            name,
            ok,
            required: need != Need::Later,
            privilege: need == Need::Privilege,
            detail: r.unwrap_or_else(|e| e),
        })
    };
    let errno = |e: i32| std::io::Error::from_raw_os_error(e).to_string();

    let uts = nix::sys::utsname::uname().ok();
    add(
        "kernel",
        Need::Basic,
        Ok(uts
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default()),
    );
    add("ptrace seize/interrupt", Need::Basic, probe_ptrace());
    add(
        "clone3 set_tid",
        Need::Privilege,
        if std::path::Path::new("/proc/sys/kernel/ns_last_pid").exists() {
            caps_any(&[
                caps::Capability::CAP_CHECKPOINT_RESTORE,
                caps::Capability::CAP_SYS_ADMIN,
            ])
            .map(|c| format!("clone3 with set_tid allowed ({c})"))
        } else {
            Err("no /proc/sys/kernel/ns_last_pid: kernel lacks CONFIG_CHECKPOINT_RESTORE".into())
        },
    );
    add(
        "PR_SET_MM_MAP",
        Need::Basic,
        sys::prctl_mm_map_size()
            .map(|size| format!("struct prctl_mm_map is {size} bytes"))
            .map_err(errno),
    );
    add(
        "kcmp",
        Need::Basic,
        sys::kcmp_probe()
            .map(|()| "available".into())
            .map_err(errno),
    );
    add(
        "PTRACE_GET_RSEQ_CONFIGURATION",
        Need::Basic,
        if uts_at_least(5, 13) {
            Ok("kernel >= 5.13".into())
        } else {
            Err("kernel older than 5.13".into())
        },
    );
    add(
        "xsave",
        Need::Basic,
        Ok(format!(
            "{} bytes of XSAVE state",
            ckpt_parasite::xsave_size()
        )),
    );
    add("PAGEMAP_SCAN", Need::Later, probe_pagemap_scan());
    add(
        "pidfd_getfd",
        Need::Later,
        sys::pidfd_getfd_probe()
            .map(|()| "available".into())
            .map_err(errno),
    );
    add(
        "userfaultfd",
        Need::Later,
        sys::userfaultfd_probe()
            .map(|()| "available".into())
            .map_err(errno),
    );
    add(
        "capabilities",
        Need::Privilege,
        caps_any(&[caps::Capability::CAP_SYS_PTRACE]).map(|_| {
            let all = caps::read(None, caps::CapSet::Effective).unwrap_or_default();
            let has = |c| if all.contains(&c) { "yes" } else { "no" };
            format!(
                "CAP_SYS_PTRACE yes, CAP_CHECKPOINT_RESTORE {}, CAP_SYS_ADMIN {}, CAP_SYS_RESOURCE {}",
                has(caps::Capability::CAP_CHECKPOINT_RESTORE),
                has(caps::Capability::CAP_SYS_ADMIN),
                has(caps::Capability::CAP_SYS_RESOURCE)
            )
        }),
    );
    add(
        "SysV IPC ids",
        Need::Later,
        if ["shm", "sem", "msg"]
            .iter()
            .all(|k| std::path::Path::new(&format!("/proc/sys/kernel/{k}_next_id")).exists())
        {
            Ok("shm/sem/msg_next_id present: SysV objects come back with their ids".into())
        } else {
            Err("no /proc/sys/kernel/*_next_id: SysV IPC objects cannot be restored".into())
        },
    );
    add(
        "network lock",
        Need::Later,
        ckpt_netlock::program()
            .map(|p| {
                format!(
                    "{}: peers of TCP connections saved with --tcp-established see no reset",
                    p.display()
                )
            })
            .map_err(|e| e.to_string()),
    );
    out
}

fn caps_any(want: &[caps::Capability]) -> Result<String, String> {
    let eff = caps::read(None, caps::CapSet::Effective).map_err(|e| e.to_string())?;
    want.iter()
        .find(|c| eff.contains(c))
        .map(|c| c.to_string())
        .ok_or_else(|| format!("missing capability: one of {want:?}"))
}

fn uts_at_least(major: u32, minor: u32) -> bool {
    let Ok(u) = nix::sys::utsname::uname() else {
        return false;
    };
    let rel = u.release().to_string_lossy().into_owned();
    let mut it = rel.split(|c: char| !c.is_ascii_digit());
    let a: u32 = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let b: u32 = it.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    (a, b) >= (major, minor)
}

/// Seizes a forked child, interrupts it and lets it go.
fn probe_ptrace() -> Result<String, String> {
    use nix::sys::signal::{Signal, kill};
    let child = sys::fork_sleeper().map_err(|e| e.to_string())?;
    let r = ckpt_parasite::Tracee::seize(child.as_raw())
        .and_then(|t| t.detach())
        .map(|()| "PTRACE_SEIZE + PTRACE_INTERRUPT work".to_string())
        .map_err(|e| e.to_string());
    let _ = kill(child, Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(child, None);
    r
}

fn probe_pagemap_scan() -> Result<String, String> {
    let f = std::fs::File::open("/proc/self/pagemap").map_err(|e| e.to_string())?;
    sys::pagemap_scan_probe(&f)
        .map(|()| "available".into())
        .map_err(|_| "not supported by this kernel (6.7+ needed)".into())
}
