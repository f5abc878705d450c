//! Names of UNIX sockets on restore: binding a path by the rules of
//! [`bind`], and connecting again to a socket whose path was unlinked,
//! through the socket file the restorer kept ([`connect_again`]).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use ckpt_image::fd::unix::UnixSocketFile;
use ckpt_parasite::remote::Remote;

use super::{ADDR_SLOT, call_with_addr, new_socket, sockaddr, take_socket};
use crate::error::{RestoreError, Result};
use crate::fd::{Context, take_from};
use crate::sys;

/// The socket files of sockets whose path was unlinked again, by file id:
/// what connects to them goes through `/proc/self/fd` of a copy, the
/// name leading nowhere.
#[derive(Default)]
pub(super) struct UnlinkedNames(pub(super) HashMap<u64, std::fs::File>);

/// Binds socket `s` of the process to the dumped name: an abstract name as
/// is; a path by the process itself, with its filesystem identity, inside
/// its directory opened without following a symbolic link, replacing only
/// a stale socket of the recorded owner, then given the dumped mode (and
/// unlinked again if it was).
/// Returns the socket file (`O_PATH`) when the name was unlinked again.
pub(super) fn bind(
    cx: &Context<'_, '_>,
    r: &Remote<'_>,
    s: i32,
    image: &UnixSocketFile,
) -> Result<Option<std::fs::File>> {
    let pid = r.t.pid();
    if image.name.first() == Some(&0) {
        let addr = sockaddr(cx, s, &image.name)?;
        call_with_addr(r, "bind (abstract unix name)", libc::SYS_bind, s, &addr)?;
        return Ok(None);
    }
    let path = String::from_utf8(image.name.clone())
        .map_err(|_| cx.invalid(s, "unix socket path is not UTF-8"))?;
    let err = |what: String| RestoreError::File {
        pid,
        path: path.clone(),
        what,
    };
    let p = std::path::Path::new(&path);
    let (Some(parent), Some(name)) = (p.parent(), p.file_name().and_then(|n| n.to_str())) else {
        return Err(err("cannot bind: not a path to a file".into()));
    };
    let dir = r
        .open(
            parent.to_str().unwrap_or("/"),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        )
        .map_err(|e| err(format!("cannot open its directory to bind the socket: {e}")))?;
    let result = bind_in(cx, r, s, dir, name, image, &err);
    let _ = r.close(dir);
    result
}

fn bind_in(
    cx: &Context<'_, '_>,
    r: &Remote<'_>,
    s: i32,
    dir: i32,
    name: &str,
    image: &UnixSocketFile,
    err: &dyn Fn(String) -> RestoreError,
) -> Result<Option<std::fs::File>> {
    let pid = r.t.pid();
    // Bound by its full path (getsockname reports what bind was given),
    // and checked below to have landed in the directory opened without
    // following a link; bind never follows one at the name itself.
    let addr = sockaddr(cx, s, &image.name)?;
    let try_bind = || call_with_addr(r, "bind (unix path)", libc::SYS_bind, s, &addr);
    match try_bind() {
        Ok(_) => {}
        Err(ckpt_parasite::ParasiteError::RemoteSyscall {
            errno: nix::errno::Errno::EADDRINUSE,
            ..
        }) => {
            let owner = match &image.bound {
                Some(b) => b.uid,
                None => cx.fs_uid().unwrap_or(0),
            };
            remove_stale(r, dir, name, &addr, owner, err)?;
            try_bind().map_err(|e| err(format!("cannot bind: {e}")))?;
        }
        Err(e) => return Err(err(format!("cannot bind: {e}"))),
    }
    let here = take_socket(pid, s)?;
    let made_file = sys::unix_bound_file(here.as_fd())
        .map_err(|e| err(format!("cannot find the socket file bind made: {e}")))?;
    let made = made_file
        .metadata()
        .map_err(|e| err(format!("cannot find the socket file bind made: {e}")))?;
    let named = std::fs::symlink_metadata(format!("/proc/{pid}/fd/{dir}/{name}"));
    if !named.is_ok_and(|m| (m.dev(), m.ino()) == (made.dev(), made.ino())) {
        return Err(err(
            "the socket file was not made in the directory ckpt opened (its path changed during the restore)".into(),
        ));
    }
    let Some(bound) = &image.bound else {
        return Ok(None);
    };
    // Owner, then mode, on exactly the file bind made (its O_PATH fd,
    // never the name): the recorded ones, as for files ckpt creates.
    let exact = format!("/proc/self/fd/{}", made_file.as_raw_fd());
    if (made.uid(), made.gid()) != (bound.uid, bound.gid) {
        std::os::unix::fs::chown(&exact, Some(bound.uid), Some(bound.gid))
            .map_err(|e| err(format!("cannot give the socket file its owner: {e}")))?;
    }
    std::fs::set_permissions(
        &exact,
        std::os::unix::fs::PermissionsExt::from_mode(bound.mode & PERMISSION_BITS),
    )
    .map_err(|e| err(format!("cannot set the socket file's mode: {e}")))?;
    let n = r.put_path(0, name)?;
    if bound.unlinked {
        r.call(
            "unlinkat (socket file unlinked at dump time)",
            libc::SYS_unlinkat,
            [dir as u64, n, 0, 0, 0, 0],
        )?;
        return Ok(Some(made_file));
    }
    Ok(None)
}

/// Removes the name in the way of a bind if, and only if, it is a socket
/// file of `owner` (the owner the image records for the socket file, else
/// the process's filesystem user) that nothing listens on any more (a
/// connect is refused): the socket the dumped process left behind. The
/// name is looked at in the directory opened without following a link,
/// and never followed itself.
fn remove_stale(
    r: &Remote<'_>,
    dir: i32,
    name: &str,
    addr: &[u8],
    owner: u32,
    err: &dyn Fn(String) -> RestoreError,
) -> Result<()> {
    let pid = r.t.pid();
    let there = std::fs::symlink_metadata(format!("/proc/{pid}/fd/{dir}/{name}"))
        .map_err(|e| err(format!("cannot bind, and cannot stat what is there: {e}")))?;
    if !there.file_type().is_socket() || there.uid() != owner {
        return Err(err(format!(
            "cannot bind: the name exists and is not a socket file of uid {owner} (ckpt replaces only a stale socket of the owner the image records)"
        )));
    }
    let probe = new_socket(r, u64::from(libc::SOCK_STREAM as u32), libc::SOCK_NONBLOCK)?;
    let at = r.put(ADDR_SLOT, addr)?;
    let tried = r.call(
        "connect (stale socket probe)",
        libc::SYS_connect,
        [probe as u64, at, addr.len() as u64, 0, 0, 0],
    );
    r.close(probe)?;
    match tried {
        Err(ckpt_parasite::ParasiteError::RemoteSyscall {
            errno: nix::errno::Errno::ECONNREFUSED,
            ..
        }) => {}
        _ => {
            return Err(err(
                "cannot bind: a socket is still listening on that name".into()
            ));
        }
    }
    let n = r.put_path(0, name)?;
    r.call(
        "unlinkat (stale socket)",
        libc::SYS_unlinkat,
        [dir as u64, n, 0, 0, 0, 0],
    )?;
    Ok(())
}

/// Permission bits of a file mode.
const PERMISSION_BITS: u32 = 0o7777;

/// Connects the process's socket `s` to what `image` connects to: by its
/// name, or, when that path was unlinked, through the socket file
/// itself, which the restorer kept when it unlinked the name, lent to the
/// process for the connect (`/proc/self/fd/N` leads to that file, nothing
/// the user can swap). getpeername reports the name it was bound to
/// either way.
pub(super) fn connect_again(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    s: i32,
    image: &UnixSocketFile,
    unlinked: bool,
    fd: i32,
) -> Result<()> {
    if !unlinked {
        let addr = sockaddr(cx, fd, &image.peer_name)?;
        call_with_addr(r, "connect (unix socket)", libc::SYS_connect, s, &addr)?;
        return Ok(());
    }
    let Some(file_of_name) = cx
        .state::<UnlinkedNames>()
        .0
        .get(&image.connect_to_file_id)
        .map(std::os::fd::AsRawFd::as_raw_fd)
    else {
        return Err(cx.invalid(
            fd,
            "unix socket connects to a socket whose unlinked path was not restored before it",
        ));
    };
    let lent = take_from(r, std::process::id() as i32, file_of_name)?;
    let addr = sockaddr(cx, fd, format!("/proc/self/fd/{lent}").as_bytes());
    let connected = addr.and_then(|addr| {
        call_with_addr(
            r,
            "connect (to a unix socket whose path was unlinked)",
            libc::SYS_connect,
            s,
            &addr,
        )
        .map_err(RestoreError::from)
    });
    r.close(lent)?;
    connected.map(drop)
}
