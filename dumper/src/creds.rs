//! Credentials of each thread: ids, groups and capability sets from
//! `/proc/PID/task/TID/status`, securebits asked by the thread itself
//! (through the parasite), and no_new_privs. Credentials are per thread in
//! the kernel, and the raw setresuid syscall changes one thread only.

use ckpt_image::task::Creds;

use crate::error::{DumpError, Result};

/// The credentials of thread `tid` of process `pid` from its `status`
/// text (read once, see [`crate::procfile::task_texts`], and parsed by
/// procfs); `securebits` is what `prctl(PR_GET_SECUREBITS)` returned
/// inside the thread.
pub fn collect(pid: i32, tid: i32, status: &str, securebits: i64) -> Result<Creds> {
    let file = format!("task/{tid}/status");
    let status = <procfs::process::Status as procfs::FromRead>::from_read(status.as_bytes())
        .map_err(|e| DumpError::Parse {
            pid,
            path: file.clone(),
            what: e.to_string(),
        })?;
    let securebits = u32::try_from(securebits).map_err(|_| DumpError::Parse {
        pid,
        path: format!("thread {tid} prctl(PR_GET_SECUREBITS)"),
        what: format!("returned {securebits}"),
    })?;
    Ok(Creds {
        securebits,
        no_new_privs: status.nonewprivs.unwrap_or(0) != 0,
        ..from_status(&status)
    })
}

/// Ids, groups and capability sets from a `status` file.
fn from_status(st: &procfs::process::Status) -> Creds {
    Creds {
        uids: vec![st.ruid, st.euid, st.suid, st.fuid],
        gids: vec![st.rgid, st.egid, st.sgid, st.fgid],
        groups: st.groups.clone(),
        cap_eff: st.capeff,
        cap_prm: st.capprm,
        cap_inh: st.capinh,
        cap_bnd: st.capbnd.unwrap_or(0),
        cap_amb: st.capamb.unwrap_or(0),
        ..Creds::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_status_gives_own_euid() {
        let st = procfs::process::Process::myself()
            .unwrap()
            .status()
            .unwrap();
        assert_eq!(from_status(&st).uids[1], nix::unistd::geteuid().as_raw());
    }
}
