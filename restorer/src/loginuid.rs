//! The audit login uid of a restored process. The kernel lets a process
//! set only its own (with CAP_AUDIT_CONTROL), so it is written from inside
//! the process while it still has the restorer's privileges, before its
//! threads exist (they inherit it).
//!
//! Acting for a user (the service), a process gets back only a login uid
//! the user could have given it: any while it has none yet (the kernel
//! lets an unprivileged process set its own once), else only the user's
//! own uid. Another one is left as the restore's, with a notice: audit
//! records must not name a login the caller could not claim.

use ckpt_image::task::Core;
use ckpt_parasite::remote::Remote;

use crate::error::Result;

/// The kernel's "never set" login uid (`AUDIT_UID_UNSET`).
const UNSET: u32 = u32::MAX;

/// Gives the process (the leader `r` stands for) the image's login uid.
pub fn restore(r: &Remote<'_>, core: &Core, notice: &dyn Fn(&str)) -> Result<()> {
    let pid = core.pid;
    let wanted = core.loginuid.unwrap_or(UNSET);
    let path = format!("/proc/{}/loginuid", r.t.pid());
    let now: u32 = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(UNSET);
    if now == wanted {
        return Ok(());
    }
    if let Some(c) = ckpt_image::caller::acting_for()
        && now != UNSET
        && wanted != c.uid
    {
        notice(&format!(
            "pid {pid}: login uid {wanted} is not uid {}'s own: left at {now}",
            c.uid
        ));
        return Ok(());
    }
    let fd = r.open("/proc/self/loginuid", libc::O_WRONLY | libc::O_CLOEXEC, 0)?;
    let text = wanted.to_string();
    let buf = r.put(1, text.as_bytes())?;
    let written = r.t.syscall_at(
        r.base,
        libc::SYS_write,
        [fd as u64, buf, text.len() as u64, 0, 0, 0],
    )?;
    r.close(fd)?;
    if written < 0 {
        // An immutable login uid (audit's loginuid_immutable) or no
        // CAP_AUDIT_CONTROL: the program runs the same, audit names the
        // restore's login.
        notice(&format!(
            "pid {pid}: login uid {wanted} not set ({}): left at {now}",
            std::io::Error::from_raw_os_error(-written as i32)
        ));
    }
    Ok(())
}
