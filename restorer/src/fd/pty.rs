//! Pseudo-terminal pairs whose master the tree held: the restorer opens a
//! new pair the first time either end is needed (the slave gets whatever
//! `/dev/pts` number is free), puts the line's settings back, and each
//! process that had an end takes it from the restorer with `pidfd_getfd`,
//! as pipes do. The slave node gets the owner and mode it had (older
//! images: the user the process is restored as, as the kernel does when
//! that user opens `/dev/ptmx`). Bytes that were in flight are written
//! back through the pair set quiet before its own settings go on. A
//! session leader whose controlling terminal was a pair's slave takes the
//! new slave as its controlling terminal, with the foreground group it had.

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use ckpt_image::fd::File;
use ckpt_image::fd::file::Kind;
use ckpt_image::fd::pty::{NCCS, PtyFile, PtyLine, PtyNode, PtySide};
use ckpt_image::task::ControllingTerminal;

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
    node: Option<PtyNode>,
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
        let mine = if image.side == PtySide::Slave as i32 {
            slave_of(cx, id, fd)?
        } else {
            pair_of(cx, id, fd)?.master.as_raw_fd()
        };
        let got = take_from(r, std::process::id() as i32, mine)?;
        set_status_flags(r, got, file.flags)?;
        Ok(got)
    }
}

/// The pair of master file `id`, created the first time (`fd`: the fd
/// being restored, for errors).
fn pair_of<'p>(cx: &'p mut Context<'_, '_>, id: u64, fd: i32) -> Result<&'p mut Pair> {
    if !cx.state::<Pairs>().0.contains_key(&id) {
        let line = master_line(cx, id, fd)?;
        let pair = create(&line).map_err(|e| restorer_err("open /dev/ptmx and set its line", e))?;
        cx.state::<Pairs>().0.insert(id, pair);
    }
    Ok(cx.state::<Pairs>().0.get_mut(&id).expect("inserted above"))
}

/// The restorer's fd of the slave of master file `id`, opened the first
/// time.
fn slave_of(cx: &mut Context<'_, '_>, id: u64, fd: i32) -> Result<i32> {
    let owner = cx.fs_uid();
    let pair = pair_of(cx, id, fd)?;
    if pair.slave.is_none() {
        pair.slave =
            Some(open_slave(pair, owner).map_err(|e| restorer_err("open the pty slave", e))?);
    }
    Ok(pair.slave.as_ref().expect("opened above").as_raw_fd())
}

/// Makes the new slave of `ctty`'s pair the controlling terminal of the
/// session the process behind `r` leads. Called as soon as it leads it,
/// before it forks anything: a process has the terminal only if its
/// leader had it when it was forked (the kernel copies it at fork and
/// gives it to nobody else). A terminal whose master was outside the tree
/// is not restored: reported in one line.
pub fn take_controlling_terminal(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    ctty: &ControllingTerminal,
) -> Result<()> {
    let pid = r.t.pid();
    if ctty.pty_master_file_id == 0 {
        (cx.shared.options.notice)(&format!(
            "pid {pid} fd {}: controlling terminal {} (tty) not restored: its master was outside the checkpoint; the session has no controlling terminal",
            fd_text(ctty.fd),
            ctty.path
        ));
        return Ok(());
    }
    with_slave(cx, r, ctty, |held| {
        r.call(
            "ioctl (TIOCSCTTY)",
            libc::SYS_ioctl,
            [held as u64, libc::TIOCSCTTY, 0, 0, 0, 0],
        )
        .map(drop)
    })?;
    log::debug!(
        "pid {pid}: controlling terminal {} again (a new pair)",
        ctty.path
    );
    Ok(())
}

/// Gives the session's terminal the foreground group it had, from its
/// leader (once every process of the tree is in its group).
pub fn restore_foreground(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    ctty: &ControllingTerminal,
) -> Result<()> {
    if ctty.pty_master_file_id == 0 || ctty.foreground_pgid == 0 {
        return Ok(());
    }
    with_slave(cx, r, ctty, |held| {
        let at = r.put(0, &ctty.foreground_pgid.to_ne_bytes())?;
        r.call(
            "ioctl (TIOCSPGRP)",
            libc::SYS_ioctl,
            [held as u64, libc::TIOCSPGRP, at, 0, 0, 0],
        )
        .map(drop)
    })?;
    log::debug!(
        "pid {}: foreground group of {}: {}",
        r.t.pid(),
        ctty.path,
        ctty.foreground_pgid
    );
    Ok(())
}

/// Runs `f` with an fd of `ctty`'s new slave in the process behind `r`,
/// closed after.
fn with_slave(
    cx: &mut Context<'_, '_>,
    r: &Remote<'_>,
    ctty: &ControllingTerminal,
    f: impl FnOnce(i32) -> std::result::Result<(), ckpt_parasite::ParasiteError>,
) -> Result<()> {
    let slave = slave_of(cx, ctty.pty_master_file_id, ctty.fd)?;
    let held = take_from(r, std::process::id() as i32, slave)?;
    let done = f(held);
    r.close(held)?;
    Ok(done?)
}

/// An fd number for messages: -1 is "none".
fn fd_text(fd: i32) -> String {
    if fd < 0 { "-".into() } else { fd.to_string() }
}

fn restorer_err(what: &str, e: std::io::Error) -> RestoreError {
    RestoreError::os(std::process::id() as i32, format!("pty: {what}"), e)
}

/// The line settings of the pair of master file `master_file_id`, from
/// its record, checked.
fn master_line(cx: &Context<'_, '_>, master_file_id: u64, fd: i32) -> Result<PtyLine> {
    let master = match cx
        .shared
        .files
        .get(master_file_id)
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
    // What fits the line discipline's buffer (N_TTY_BUF_SIZE) each way.
    if line.input.len() > TTY_BUFFER || line.output.len() > TTY_BUFFER {
        return Err(cx.invalid(fd, "pty bytes in flight beyond a terminal's buffer"));
    }
    Ok(line)
}

/// A terminal's line discipline buffer, the most a pty holds each way.
const TTY_BUFFER: usize = 4096;

/// `line`'s flags and control characters as a `struct termios`.
fn termios_of(line: &PtyLine) -> libc::termios {
    // SAFETY: all-zero is a valid struct termios.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    t.c_iflag = line.iflag;
    t.c_oflag = line.oflag;
    t.c_cflag = line.cflag;
    t.c_lflag = line.lflag;
    t.c_line = line.line as u8;
    t.c_cc[..line.cc.len()].copy_from_slice(&line.cc);
    t
}

/// A new pair with `line`'s settings and the bytes it had in flight; the
/// slave stays closed (and locked) until a process needs it, unless bytes
/// had to go through it.
fn create(line: &PtyLine) -> std::io::Result<Pair> {
    let master: OwnedFd = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
        .open("/dev/ptmx")?
        .into();
    let ws = libc::winsize {
        ws_row: line.rows as u16,
        ws_col: line.cols as u16,
        ws_xpixel: line.xpixel as u16,
        ws_ypixel: line.ypixel as u16,
    };
    let mut pair = Pair {
        master,
        slave: None,
        locked: line.locked,
        node: line.slave_node,
    };
    if !line.input.is_empty() || !line.output.is_empty() {
        // Through the quiet line: the bytes were processed once already.
        sys::set_term_state(pair.master.as_fd(), &termios_of(&line.quiet()), &ws)?;
        let slave = open_slave(&pair, None)?;
        write_all(pair.master.as_fd(), &line.input)?;
        let whole = line.readable_input(&line.input);
        settle(slave.as_fd(), whole)?;
        if whole < line.input.len() {
            std::thread::sleep(PARTIAL_LINE_PAUSE);
        }
        write_all(slave.as_fd(), &line.output)?;
        settle(pair.master.as_fd(), line.output.len())?;
        pair.slave = Some(slave);
    }
    sys::set_term_state(pair.master.as_fd(), &termios_of(line), &ws)?;
    if line.packet_mode {
        sys::ioctl_set_int(pair.master.as_fd(), libc::TIOCPKT, 1)?;
    }
    Ok(pair)
}

/// Writes every byte of `data` to `fd`.
fn write_all(fd: std::os::fd::BorrowedFd<'_>, data: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    std::fs::File::from(fd.try_clone_to_owned()?).write_all(data)
}

/// How long the kernel's tty worker gets to pass the bytes written to the
/// other side's line discipline: it runs at once on an idle machine.
const SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// A half-typed line cannot be counted as it lands (`FIONREAD` of a
/// canonical terminal counts whole lines): it is given this long.
const PARTIAL_LINE_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// Waits until `fd` has at least `want` bytes readable: a write into a
/// pty reaches the other side through a kernel worker, not within the
/// write, and the line's own settings must not go on before.
fn settle(fd: std::os::fd::BorrowedFd<'_>, want: usize) -> std::io::Result<()> {
    let started = std::time::Instant::now();
    while (sys::readable_bytes(fd)?.max(0) as usize) < want {
        if started.elapsed() > SETTLE_TIMEOUT {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("bytes in flight written back did not arrive (want {want})"),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Ok(())
}

/// Opens the pair's slave, gives its node the owner and mode it had
/// (else to `owner`), and locks it again if it was.
fn open_slave(pair: &Pair, owner: Option<u32>) -> std::io::Result<OwnedFd> {
    use std::os::unix::fs::PermissionsExt;
    sys::ioctl_set_int(pair.master.as_fd(), libc::TIOCSPTLCK, 0)?;
    let slave = sys::open_pty_peer(pair.master.as_fd())?;
    match pair.node {
        Some(node) => {
            nix::unistd::fchown(
                &slave,
                Some(nix::unistd::Uid::from_raw(node.uid)),
                Some(nix::unistd::Gid::from_raw(node.gid)),
            )?;
            std::fs::File::from(slave.try_clone()?)
                .set_permissions(std::fs::Permissions::from_mode(node.mode & 0o777))?;
        }
        // The group stays the one devpts gives (its gid= mount option).
        None => {
            if let Some(uid) = owner {
                nix::unistd::fchown(&slave, Some(nix::unistd::Uid::from_raw(uid)), None)?;
            }
        }
    }
    if pair.locked {
        sys::ioctl_set_int(pair.master.as_fd(), libc::TIOCSPTLCK, 1)?;
    }
    Ok(slave)
}
