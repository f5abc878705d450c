//! Credentials of each thread, set inside the thread (they are per thread
//! in the kernel) after everything that needs the restorer's privileges.
//!
//! Order, each step needing what the one before it kept:
//! 1. groups, then `PR_SET_KEEPCAPS` and setresgid/setresuid: keep-caps
//!    keeps the permitted set across the uid change (the effective set
//!    and the ambient set are cleared by it whatever the securebits);
//! 2. a transitional capset: effective = the permitted set still held,
//!    inheritable = the dumped one (while the bounding set is still full,
//!    which capset requires of a new inheritable set);
//! 3. setfsgid/setfsuid (CAP_SETUID/CAP_SETGID from step 2: the fs ids
//!    need not be any of the real/effective/saved ones);
//! 4. `PR_CAPBSET_DROP` of every capability missing from the dumped
//!    bounding set (CAP_SETPCAP);
//! 5. `PR_CAP_AMBIENT_RAISE` of the dumped ambient set (needs each cap in
//!    permitted and inheritable, and no SECBIT_NO_CAP_AMBIENT_RAISE yet);
//! 6. `PR_SET_SECUREBITS` to the dumped bits, locked ones included
//!    (CAP_SETPCAP; this also resets the keep-caps of step 1);
//! 7. the final capset to the dumped effective/permitted/inheritable sets
//!    (only ever lowers; the kernel trims ambient to permitted ∩
//!    inheritable, which the dumped sets satisfy);
//! 8. `PR_SET_NO_NEW_PRIVS` last: it can never be unset.
//!
//! The result is read back from `/proc/TID/status` and compared.

use ckpt_image::task::{Core, Creds};

use crate::error::{RestoreError, Result};
use ckpt_parasite::remote::Remote;

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets in two 32-bit words.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// Where the kernel says which capability is its highest.
const CAP_LAST_CAP: &str = "/proc/sys/kernel/cap_last_cap";
/// Capabilities a 64-bit set can name.
const MAX_CAPS: u32 = 64;

/// A thread's credentials as `/proc/TID/status` shows them, in the
/// image's terms (to compare before and after).
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    uids: Vec<u32>,
    gids: Vec<u32>,
    groups: Vec<u32>,
    cap_inh: u64,
    cap_prm: u64,
    cap_eff: u64,
    cap_bnd: u64,
    cap_amb: u64,
    no_new_privs: bool,
}

impl Seen {
    fn read(tid: i32) -> Result<Seen> {
        let path = format!("/proc/{tid}/status");
        let status = ckpt_parasite::proc_read::read_string(std::path::Path::new(&path))
            .map_err(|e| RestoreError::os(tid, "read status", e))?;
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
                .unwrap_or_default()
                .trim()
        };
        let ids = |k: &str| {
            field(k)
                .split_whitespace()
                .filter_map(|v| v.parse().ok())
                .collect()
        };
        let cap = |k: &str| u64::from_str_radix(field(k), 16).unwrap_or(0);
        Ok(Seen {
            uids: ids("Uid"),
            gids: ids("Gid"),
            groups: ids("Groups"),
            cap_inh: cap("CapInh"),
            cap_prm: cap("CapPrm"),
            cap_eff: cap("CapEff"),
            cap_bnd: cap("CapBnd"),
            cap_amb: cap("CapAmb"),
            no_new_privs: field("NoNewPrivs") == "1",
        })
    }

    fn of(c: &Creds) -> Seen {
        Seen {
            uids: c.uids.clone(),
            gids: c.gids.clone(),
            groups: c.groups.clone(),
            cap_inh: c.cap_inh,
            cap_prm: c.cap_prm,
            cap_eff: c.cap_eff,
            cap_bnd: c.cap_bnd,
            cap_amb: c.cap_amb,
            no_new_privs: c.no_new_privs,
        }
    }
}

/// Gives the thread behind `r` (of process `tgid`) the credentials `c`
/// (nothing when the image has none, or they are the restorer's already).
pub fn restore(r: &Remote<'_>, tgid: i32, c: Option<&Creds>) -> Result<()> {
    let Some(c) = c else { return Ok(()) };
    let tid = r.t.pid();
    let invalid = |what: String| {
        RestoreError::Image(ckpt_image::ImageError::Invalid {
            path: ckpt_image::core_name(tgid).into(),
            what: format!("thread {tid}: {what}"),
        })
    };
    if c.uids.len() != 4 || c.gids.len() != 4 {
        return Err(invalid("credentials lack uids or gids".into()));
    }
    let last_cap = last_cap(tid)?;
    let all_caps = if last_cap + 1 >= MAX_CAPS {
        u64::MAX
    } else {
        (1u64 << (last_cap + 1)) - 1
    };
    for (set, v) in [
        ("effective", c.cap_eff),
        ("permitted", c.cap_prm),
        ("inheritable", c.cap_inh),
        ("ambient", c.cap_amb),
    ] {
        if v & !all_caps != 0 {
            return Err(invalid(format!(
                "{set} capabilities {v:#x} beyond this kernel's last ({last_cap})"
            )));
        }
    }
    let now = Seen::read(tid)?;
    let wanted = Seen {
        no_new_privs: now.no_new_privs,
        cap_bnd: c.cap_bnd & all_caps,
        ..Seen::of(c)
    };
    // The restorer's own securebits are none: nothing to change then.
    let changed = now != wanted || c.securebits != 0;
    if changed {
        change(r, c, now.cap_prm, last_cap)?;
    }
    if !changed && !c.no_new_privs && !now.no_new_privs {
        // Already as saved (the common case, and one status read a thread
        // less).
        return Ok(());
    }
    if c.no_new_privs {
        r.call(
            "prctl(PR_SET_NO_NEW_PRIVS)",
            libc::SYS_prctl,
            [libc::PR_SET_NO_NEW_PRIVS as u64, 1, 0, 0, 0, 0],
        )?;
    }
    let got = Seen::read(tid)?;
    let wanted = Seen {
        cap_bnd: c.cap_bnd & all_caps,
        ..Seen::of(c)
    };
    if got != wanted {
        return Err(RestoreError::Host {
            pid: tgid,
            what: format!("thread {tid}: credentials after restore are {got:?}, not {wanted:?}"),
        });
    }
    Ok(())
}

fn change(r: &Remote<'_>, c: &Creds, held: u64, last_cap: u32) -> Result<()> {
    let prctl = |name: &'static str, args: [u64; 5]| {
        r.call(
            name,
            libc::SYS_prctl,
            [args[0], args[1], args[2], args[3], args[4], 0],
        )
    };
    set_groups(r, &c.groups)?;
    prctl(
        "prctl(PR_SET_KEEPCAPS)",
        [libc::PR_SET_KEEPCAPS as u64, 1, 0, 0, 0],
    )?;
    let ids = |v: &[u32]| [v[0] as u64, v[1] as u64, v[2] as u64, 0, 0, 0];
    r.call("setresgid", libc::SYS_setresgid, ids(&c.gids))?;
    r.call("setresuid", libc::SYS_setresuid, ids(&c.uids))?;
    capset(r, held, held, c.cap_inh)?;
    // setfs[ug]id return the previous id, never an error: the read-back
    // at the end catches one that did not take.
    r.call(
        "setfsgid",
        libc::SYS_setfsgid,
        [c.gids[3] as u64, 0, 0, 0, 0, 0],
    )?;
    r.call(
        "setfsuid",
        libc::SYS_setfsuid,
        [c.uids[3] as u64, 0, 0, 0, 0, 0],
    )?;
    for cap in (0..=last_cap).filter(|cap| c.cap_bnd & (1 << cap) == 0) {
        prctl(
            "prctl(PR_CAPBSET_DROP)",
            [PR_CAPBSET_DROP, cap as u64, 0, 0, 0],
        )?;
    }
    for cap in (0..=last_cap).filter(|cap| c.cap_amb & (1 << cap) != 0) {
        prctl(
            "prctl(PR_CAP_AMBIENT_RAISE)",
            [PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap as u64, 0, 0],
        )?;
    }
    prctl(
        "prctl(PR_SET_SECUREBITS)",
        [libc::PR_SET_SECUREBITS as u64, c.securebits as u64, 0, 0, 0],
    )?;
    capset(r, c.cap_eff, c.cap_prm, c.cap_inh)
}

/// `prctl(PR_CAPBSET_DROP)`.
const PR_CAPBSET_DROP: u64 = 24;
/// `prctl(PR_CAP_AMBIENT)`.
const PR_CAP_AMBIENT: u64 = 47;
/// Its `PR_CAP_AMBIENT_RAISE` operation.
const PR_CAP_AMBIENT_RAISE: u64 = 2;

fn capset(r: &Remote<'_>, eff: u64, prm: u64, inh: u64) -> Result<()> {
    // struct __user_cap_header_struct {version, pid = 0 (self)} and two
    // struct __user_cap_data_struct {effective, permitted, inheritable}.
    let hdr = r.put(
        0,
        &[CAPABILITY_VERSION_3.to_le_bytes(), 0u32.to_le_bytes()].concat(),
    )?;
    let lo = |v: u64| v as u32;
    let hi = |v: u64| (v >> 32) as u32;
    let data: Vec<u8> = [lo(eff), lo(prm), lo(inh), hi(eff), hi(prm), hi(inh)]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    let dp = r.put(1, &data)?;
    r.call("capset", libc::SYS_capset, [hdr, dp, 0, 0, 0, 0])?;
    Ok(())
}

fn last_cap(tid: i32) -> Result<u32> {
    // Read once per restore: every thread asks.
    static LAST: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    if let Some(n) = LAST.get() {
        return Ok(*n);
    }
    let s = std::fs::read_to_string(CAP_LAST_CAP)
        .map_err(|e| RestoreError::os(tid, "read cap_last_cap", e))?;
    let n = s
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|n| *n < MAX_CAPS)
        .ok_or_else(|| RestoreError::Host {
            pid: tid,
            what: format!("{CAP_LAST_CAP} holds {s:?}"),
        })?;
    Ok(*LAST.get_or_init(|| n))
}

/// `CAP_SETGID`.
const CAP_SETGID: u32 = 6;
/// `CAP_SETUID`.
const CAP_SETUID: u32 = 7;

/// The threads of `core` may not hold more than the leader, whose ids
/// the restorer already matched with the sealed manifest, could have
/// given them: without a root uid, ids other than its own need
/// CAP_SETUID/CAP_SETGID in its permitted set, and capabilities outside
/// its permitted set need a root uid. (A sealed image is trusted; this
/// keeps a dumper bug from handing a thread someone else's ids.)
pub fn check_threads(core: &Core) -> Result<()> {
    let Some(leader) = &core.creds else {
        return Ok(());
    };
    let root = leader.uids.contains(&0);
    let has = |cap: u32| leader.cap_prm & (1 << cap) != 0;
    for t in &core.threads {
        let Some(c) = &t.creds else { continue };
        let refuse = |what: String| {
            Err(RestoreError::Image(ckpt_image::ImageError::Invalid {
                path: ckpt_image::core_name(core.pid).into(),
                what: format!("thread {}: {what}", t.tid),
            }))
        };
        if !root && !has(CAP_SETUID) && c.uids.iter().any(|u| !leader.uids.contains(u)) {
            return refuse(format!(
                "uids {:?} beyond the process's {:?}",
                c.uids, leader.uids
            ));
        }
        let own_gid = |g: &u32| leader.gids.contains(g) || leader.groups.contains(g);
        if !root
            && !has(CAP_SETGID)
            && (!c.gids.iter().all(own_gid) || !c.groups.iter().all(own_gid))
        {
            return refuse(format!(
                "gids {:?} groups {:?} beyond the process's",
                c.gids, c.groups
            ));
        }
        if !root && c.cap_prm & !leader.cap_prm != 0 {
            return refuse(format!(
                "permitted capabilities {:#x} beyond the process's {:#x}",
                c.cap_prm, leader.cap_prm
            ));
        }
    }
    Ok(())
}

/// `setgroups(groups)` run by the process `r` acts in.
pub(crate) fn set_groups(r: &Remote<'_>, groups: &[u32]) -> Result<()> {
    let bytes: Vec<u8> = groups.iter().flat_map(|g| g.to_ne_bytes()).collect();
    let at = r.put(0, &bytes)?;
    r.call(
        "setgroups",
        libc::SYS_setgroups,
        [groups.len() as u64, at, 0, 0, 0, 0],
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ckpt_image::task::ThreadCore;

    fn user(uid: u32) -> Creds {
        Creds {
            uids: vec![uid; 4],
            gids: vec![uid; 4],
            ..Creds::default()
        }
    }

    #[test]
    fn threads_get_no_more_than_the_leader_could_give() {
        let mut core = Core {
            pid: 9,
            creds: Some(user(1000)),
            threads: vec![ThreadCore {
                tid: 10,
                creds: Some(user(1000)),
                ..Default::default()
            }],
            ..Default::default()
        };
        check_threads(&core).unwrap();
        core.threads[0].creds = Some(user(0));
        let err = check_threads(&core).unwrap_err().to_string();
        assert!(err.contains("thread 10: uids [0, 0, 0, 0]"), "{err}");
        core.threads[0].creds = Some(Creds {
            cap_prm: 1 << 21,
            ..user(1000)
        });
        assert!(check_threads(&core).is_err());
        // A root leader may have threads of any user.
        core.creds = Some(user(0));
        core.threads[0].creds = Some(user(1234));
        check_threads(&core).unwrap();
    }
}
