//! Pseudo-terminal pairs whose master the tree held: the restorer opens a
//! new pair the first time either end is needed (the slave gets whatever
//! `/dev/pts` number is free), puts the line's settings back, and each
//! process that had an end takes it from the restorer with `pidfd_getfd`,
//! as pipes do. The slave node is given to the user the process is
//! restored as, as the kernel does when that user opens `/dev/ptmx`.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use ckpt_image::fd::File;
use ckpt_image::fd::file::Kind;
use ckpt_image::fd::pty::{NCCS, PtyFile, PtyLine, PtySide};

use super::{Context, FileRestorer, set_status_flags, take_from};
use crate::error::{RestoreError, Result};
use crate::sys;
use ckpt_parasite::remote::Remote;

/// Pty masters and their slaves.
pub struct Pty;

/// The restorer's own ends of one new pair.
struct Pair {
    master: OwnedFd,
    slave: Option<OwnedFd>,
    locked: bool,
}

/// Every pair created so far, by the master's file id.
#[derive(Default)]
struct Pairs(HashMap<u64, Pair>);

impl FileRestorer for Pty {
    type Image = PtyFile;

    fn open(
        &self,
        cx: &mut Context<'_, '_>,
        r: &Remote<'_>,
        file: &File,
        image: &PtyFile,
        fd: i32,
    ) -> Result<i32> {
        let id = image.master_file_id;
        if !cx.state::<Pairs>().0.contains_key(&id) {
            let line = master_line(cx, image, fd)?;
            let pair =
                create(&line).map_err(|e| restorer_err("open /dev/ptmx and set its line", e))?;
            cx.state::<Pairs>().0.insert(id, pair);
        }
        let owner = cx.fs_uid();
        let pair = cx.state::<Pairs>().0.get_mut(&id).expect("inserted above");
        let mine = if image.side == PtySide::Slave as i32 {
            if pair.slave.is_none() {
                pair.slave = Some(
                    open_slave(pair, owner).map_err(|e| restorer_err("open the pty slave", e))?,
                );
            }
            pair.slave.as_ref().expect("opened above").as_raw_fd()
        } else {
            pair.master.as_raw_fd()
        };
        let got = take_from(r, std::process::id() as i32, mine)?;
        set_status_flags(r, got, file.flags)?;
        Ok(got)
    }
}

fn restorer_err(what: &str, e: std::io::Error) -> RestoreError {
    RestoreError::os(std::process::id() as i32, format!("pty: {what}"), e)
}

/// The line settings of the pair `image` belongs to, from its master's
/// record, checked.
fn master_line(cx: &Context<'_, '_>, image: &PtyFile, fd: i32) -> Result<PtyLine> {
    let master = match cx
        .shared
        .files
        .get(image.master_file_id)
        .and_then(|f| f.kind.as_ref())
    {
        Some(Kind::Pty(m)) if m.side == PtySide::Master as i32 => m,
        _ => {
            return Err(cx.invalid(
                fd,
                "pty end whose master is not a pty master of the checkpoint",
            ));
        }
    };
    let line = master
        .line
        .clone()
        .ok_or_else(|| cx.invalid(fd, "pty master without its line settings"))?;
    if line.cc.len() > NCCS {
        return Err(cx.invalid(fd, "pty line with too many control characters"));
    }
    let fits_u16 = [line.rows, line.cols, line.xpixel, line.ypixel]
        .iter()
        .all(|v| u16::try_from(*v).is_ok());
    if !fits_u16 || u8::try_from(line.line).is_err() {
        return Err(cx.invalid(fd, "pty window size or line discipline out of range"));
    }
    Ok(line)
}

/// A new pair with `line`'s settings; the slave stays closed (and locked)
/// until a process needs it.
fn create(line: &PtyLine) -> std::io::Result<Pair> {
    let master: OwnedFd = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
        .open("/dev/ptmx")?
        .into();
    // SAFETY: all-zero is a valid struct termios.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    t.c_iflag = line.iflag;
    t.c_oflag = line.oflag;
    t.c_cflag = line.cflag;
    t.c_lflag = line.lflag;
    t.c_line = line.line as u8;
    t.c_cc[..line.cc.len()].copy_from_slice(&line.cc);
    let ws = libc::winsize {
        ws_row: line.rows as u16,
        ws_col: line.cols as u16,
        ws_xpixel: line.xpixel as u16,
        ws_ypixel: line.ypixel as u16,
    };
    sys::set_term_state(master.as_fd(), &t, &ws)?;
    if line.packet_mode {
        sys::ioctl_set_int(master.as_fd(), libc::TIOCPKT, 1)?;
    }
    Ok(Pair {
        master,
        slave: None,
        locked: line.locked,
    })
}

/// Opens the pair's slave for `owner` and locks it again if it was.
fn open_slave(pair: &Pair, owner: Option<u32>) -> std::io::Result<OwnedFd> {
    sys::ioctl_set_int(pair.master.as_fd(), libc::TIOCSPTLCK, 0)?;
    let slave = sys::open_pty_peer(pair.master.as_fd())?;
    if let Some(uid) = owner {
        // The group stays the one devpts gives (its gid= mount option).
        nix::unistd::fchown(&slave, Some(nix::unistd::Uid::from_raw(uid)), None)?;
    }
    if pair.locked {
        sys::ioctl_set_int(pair.master.as_fd(), libc::TIOCSPTLCK, 1)?;
    }
    Ok(slave)
}
