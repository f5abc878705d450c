//! Pseudo-terminal pairs whose master the tree holds (a launcher like
//! `mpirun` or `script` giving its children a terminal for their output).
//!
//! The master (`/dev/ptmx`, device 5:2) is this kind; its slave, a
//! `/dev/pts/N` fd the `tty` kind claims like any terminal, becomes this
//! kind too once the whole tree is seen ([`FileDumper::link_tree`]) if its
//! number is the `tty-index` of a master in the tree: such a slave is not
//! the user's terminal to rebind, it is one end of a pair ckpt recreates.
//!
//! The line's settings are read from a copy of the master taken with
//! `pidfd_getfd` (reopening `/dev/ptmx` by path would make a new pair);
//! termios ioctls of a master act on its slave. Bytes in flight either
//! way are read (which consumes them) and written back at once through
//! the pair set quiet ([`PtyLine::quiet`]): the tree, if it runs on,
//! finds them where they were. Only output in packet mode is refused.
//! The slave node's owner and mode come from a slave fd of the tree.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::pty::{NCCS, PtyFile, PtyLine, PtyNode, PtySide};

use super::{Blobs, FdParams, FileDumper, Holder, TreeFiles};
use crate::blockers::Blockers;
use crate::error::{DumpError, Result};
use crate::sys;

/// Pty masters, and the slaves of those masters.
pub struct Pty;

/// `/dev/ptmx`'s device number.
const PTMX_MAJOR: u32 = 5;
const PTMX_MINOR: u32 = 2;
/// Unix98 pty slaves use majors 136 to 143, 256 minors each.
const PTS_MAJORS: std::ops::RangeInclusive<u32> = 136..=143;
const PTS_MINORS_PER_MAJOR: u32 = 256;

/// The `/dev/pts` number of a slave device, if `rdev` is one.
fn pts_index(rdev: u64) -> Option<u32> {
    let major = libc::major(rdev);
    PTS_MAJORS
        .contains(&major)
        .then(|| (major - PTS_MAJORS.start()) * PTS_MINORS_PER_MAJOR + libc::minor(rdev))
}

impl FileDumper for Pty {
    fn name(&self) -> &'static str {
        "pty"
    }

    fn description(&self) -> &'static str {
        "pseudo-terminal pairs whose master the tree holds, with their line settings, window size, slave owner and bytes in flight both ways (recreated); a session's controlling terminal and foreground group among them"
    }

    fn claims(&self, p: &FdParams) -> bool {
        let rdev = p.meta.rdev();
        p.meta.mode() & libc::S_IFMT == libc::S_IFCHR
            && (libc::major(rdev), libc::minor(rdev)) == (PTMX_MAJOR, PTMX_MINOR)
    }

    fn collect(&self, p: &FdParams, file_id: u64, _blobs: &mut Blobs) -> Result<Kind> {
        let index: u32 = p
            .info_field("tty-index")?
            .trim()
            .parse()
            .map_err(|_| p.unsupported("pty master with an unreadable tty-index"))?;
        let master = steal(p.pid, p.fd)?;
        let os = |what: &str, e: std::io::Error| DumpError::Proc {
            pid: p.pid,
            path: format!("fd/{} ({what})", p.fd).into(),
            source: e,
        };
        let st = sys::term_state(master.as_fd()).map_err(|e| os("TCGETS", e))?;
        let packet_mode = sys::pty_packet_mode(master.as_fd()).map_err(|e| os("TIOCGPKT", e))?;
        let mut line = line_of(&st);
        line.packet_mode = packet_mode;
        line.locked = sys::pty_locked(master.as_fd()).map_err(|e| os("TIOCGPTLCK", e))?;
        let pending = sys::readable_bytes(master.as_fd()).map_err(|e| os("FIONREAD", e))?;
        if pending > 0 && packet_mode {
            return Err(p.unsupported(&format!(
                "pty master (/dev/pts/{index}) in packet mode has {pending} bytes of output not yet read; output in flight is saved only without packet mode, dump again in a moment"
            )));
        }
        if pending > 0 {
            line.output = take_output(master.as_fd(), &st.termios, &line, pending as usize)
                .map_err(|e| os("output in flight", e))?;
            log::debug!(
                "pid {}: fd {}: pty /dev/pts/{index}: {} bytes of output in flight saved",
                p.pid,
                p.fd,
                line.output.len()
            );
        }
        Ok(Kind::Pty(PtyFile {
            side: PtySide::Master as i32,
            master_file_id: file_id,
            index,
            line: Some(line),
        }))
    }

    fn link_tree(&self, tree: &mut TreeFiles) -> Result<()> {
        let masters: HashMap<u32, u64> = tree
            .files
            .files
            .iter()
            .filter_map(|f| match &f.kind {
                Some(Kind::Pty(p)) if p.side == PtySide::Master as i32 => Some((p.index, f.id)),
                _ => None,
            })
            .collect();
        if masters.is_empty() {
            return Ok(());
        }
        let mut slaves = Vec::new();
        for f in tree.files.files.iter_mut() {
            let Some(Kind::Tty(t)) = &f.kind else {
                continue;
            };
            let Some(index) = pts_index(t.rdev) else {
                continue;
            };
            let Some(&master_file_id) = masters.get(&index) else {
                continue;
            };
            f.kind = Some(Kind::Pty(PtyFile {
                side: PtySide::Slave as i32,
                master_file_id,
                index,
                line: None,
            }));
            slaves.push((f.id, index));
        }
        // Per pair, once: the slave node's owner, and input typed into
        // the master and not yet read by the slave's reader, which sits on
        // the slave's side.
        let mut blockers = Blockers::default();
        let mut done = Vec::new();
        for (id, index) in slaves {
            let Some(h) = tree.holders().find(|h| h.file_id == id) else {
                continue;
            };
            let master_id = masters[&index];
            if done.contains(&master_id) {
                continue;
            }
            done.push(master_id);
            let Some(m) = tree.holders().find(|h| h.file_id == master_id) else {
                continue;
            };
            let taken = blockers.absorb(slave_side(h, m, index))?;
            let Some(SlaveSide { node, input }) = taken else {
                continue;
            };
            let master = tree
                .files
                .files
                .iter_mut()
                .find(|f| f.id == master_id)
                .expect("found above");
            if let Some(Kind::Pty(PtyFile {
                line: Some(line), ..
            })) = &mut master.kind
            {
                line.slave_node = Some(node);
                line.input = input;
            }
        }
        blockers.into_result()
    }
}

/// What a pair's slave end holds: its node's owner and the input not yet
/// read.
struct SlaveSide {
    node: PtyNode,
    input: Vec<u8>,
}

/// Reads the slave side of pair `index` through `slave` (a holder of
/// the slave), putting the input back through `master` (a holder of
/// the master).
fn slave_side(slave: Holder, master: Holder, index: u32) -> Result<SlaveSide> {
    let s = steal(slave.pid, slave.fd)?;
    let m = steal(master.pid, master.fd)?;
    let os = |what: &str, e: std::io::Error| DumpError::Proc {
        pid: slave.pid,
        path: format!("fd/{} (pty slave /dev/pts/{index}: {what})", slave.fd).into(),
        source: e,
    };
    let meta = std::fs::File::from(s.try_clone().map_err(|e| os("dup", e))?)
        .metadata()
        .map_err(|e| os("fstat", e))?;
    let node = PtyNode {
        uid: meta.uid(),
        gid: meta.gid(),
        mode: meta.mode() & 0o777,
    };
    let st = sys::term_state(s.as_fd()).map_err(|e| os("TCGETS", e))?;
    let input =
        take_input(s.as_fd(), m.as_fd(), &st.termios).map_err(|e| os("input in flight", e))?;
    if !input.is_empty() {
        log::debug!(
            "pid {}: fd {}: pty /dev/pts/{index}: {} bytes of input in flight saved",
            slave.pid,
            slave.fd,
            input.len()
        );
    }
    Ok(SlaveSide { node, input })
}

/// The line settings of a terminal's state (packet mode and lock are the
/// master's, read apart).
fn line_of(st: &sys::TermState) -> PtyLine {
    PtyLine {
        iflag: st.termios.c_iflag,
        oflag: st.termios.c_oflag,
        cflag: st.termios.c_cflag,
        lflag: st.termios.c_lflag,
        line: u32::from(st.termios.c_line),
        cc: st.termios.c_cc[..NCCS].to_vec(),
        rows: u32::from(st.winsize.ws_row),
        cols: u32::from(st.winsize.ws_col),
        xpixel: u32::from(st.winsize.ws_xpixel),
        ypixel: u32::from(st.winsize.ws_ypixel),
        ..Default::default()
    }
}

/// `base` with `line`'s flags and control characters.
fn termios_with(base: &libc::termios, line: &PtyLine) -> libc::termios {
    let mut t = *base;
    t.c_iflag = line.iflag;
    t.c_oflag = line.oflag;
    t.c_lflag = line.lflag;
    t.c_cc[..line.cc.len()].copy_from_slice(&line.cc);
    t
}

/// How long the kernel's tty worker gets to pass bytes written back to
/// the line discipline: it runs at once on an idle machine.
const SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Waits until `fd` has at least `want` bytes readable: a write into a
/// pty reaches the other side's line discipline through a kernel worker,
/// not within the write.
fn settle(fd: BorrowedFd<'_>, want: usize) -> std::io::Result<()> {
    let started = std::time::Instant::now();
    while (sys::readable_bytes(fd)?.max(0) as usize) < want {
        if started.elapsed() > SETTLE_TIMEOUT {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("bytes written back did not arrive (want {want})"),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    Ok(())
}

/// A half-typed line cannot be counted as it lands (`FIONREAD` of a
/// canonical terminal counts whole lines): it is given this long.
const PARTIAL_LINE_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

/// Writes every byte of `data` to `fd`.
fn write_all(fd: BorrowedFd<'_>, data: &[u8]) -> std::io::Result<()> {
    let mut f = std::fs::File::from(fd.try_clone_to_owned()?);
    f.write_all(data)
}

/// Reads the `pending` bytes of output waiting in `master`, and writes them
/// back through the slave with output processing off (they were
/// processed on their way in). `termios` and `line` are the slave's.
fn take_output(
    master: BorrowedFd<'_>,
    termios: &libc::termios,
    line: &PtyLine,
    pending: usize,
) -> std::io::Result<Vec<u8>> {
    let mut data = vec![0; pending];
    // The master is never canonical: every byte counted is readable now.
    let mut f = std::fs::File::from(master.try_clone_to_owned()?);
    f.read_exact(&mut data)?;
    let slave = sys::open_pty_peer(master)?;
    sys::set_termios(slave.as_fd(), &termios_with(termios, &line.quiet()))?;
    let put_back = write_all(slave.as_fd(), &data).and_then(|()| settle(master, data.len()));
    sys::set_termios(slave.as_fd(), termios)?;
    put_back?;
    Ok(data)
}

/// Reads every byte of input waiting on `slave`, a half-typed line of a
/// canonical terminal included, and writes it back through `master` with
/// the line quiet, so lines end where they ended and nothing is echoed.
/// `termios` is the slave's.
fn take_input(
    slave: BorrowedFd<'_>,
    master: BorrowedFd<'_>,
    termios: &libc::termios,
) -> std::io::Result<Vec<u8>> {
    // Non-canonical with VMIN = VTIME = 0, every byte of the line
    // discipline's buffer is readable and a read never waits.
    let mut reading = *termios;
    reading.c_lflag &= !libc::ICANON;
    reading.c_cc[libc::VMIN] = 0;
    reading.c_cc[libc::VTIME] = 0;
    sys::set_termios(slave, &reading)?;
    let mut data = Vec::new();
    let mut f = std::fs::File::from(slave.try_clone_to_owned()?);
    let mut buf = [0u8; 4096];
    let read = loop {
        match f.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) => data.extend_from_slice(&buf[..n]),
            // The process's own O_NONBLOCK, or its master gone: nothing more.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EIO)) => {
                break Ok(());
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => break Err(e),
        }
    };
    if let Err(e) = read.and_then(|()| put_back_input(slave, master, termios, &data)) {
        let _ = sys::set_termios(slave, termios);
        return Err(e);
    }
    sys::set_termios(slave, termios)?;
    Ok(data)
}

/// Writes `data` into the slave's input through `master` with the line
/// quiet, and waits for it to land.
fn put_back_input(
    slave: BorrowedFd<'_>,
    master: BorrowedFd<'_>,
    termios: &libc::termios,
    data: &[u8],
) -> std::io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let line = line_of(&sys::TermState {
        termios: *termios,
        // SAFETY: all-zero is a valid struct winsize.
        winsize: unsafe { std::mem::zeroed() },
    });
    sys::set_termios(slave, &termios_with(termios, &line.quiet()))?;
    write_all(master, data)?;
    let whole = line.readable_input(data);
    settle(slave, whole)?;
    if whole < data.len() {
        std::thread::sleep(PARTIAL_LINE_PAUSE);
    }
    Ok(())
}

/// Fills in, for every session leader with a controlling terminal, which
/// pty pair of the tree it is (by its `/dev/pts` number) and the leader's
/// fd on it, if any.
pub fn link_controlling_terminals<'c>(
    cores: impl IntoIterator<Item = &'c mut ckpt_image::task::Core>,
    files: &TreeFiles,
) {
    for core in cores {
        let pid = core.pid;
        let Some(ctty) = core.ctty.as_mut() else {
            continue;
        };
        ctty.path = match pts_index(ctty.rdev) {
            Some(n) => format!("/dev/pts/{n}"),
            None => format!(
                "terminal {}:{}",
                libc::major(ctty.rdev),
                libc::minor(ctty.rdev)
            ),
        };
        let index = pts_index(ctty.rdev);
        ctty.pty_master_file_id = files
            .files
            .files
            .iter()
            .find_map(|f| match &f.kind {
                Some(Kind::Pty(p))
                    if p.side == PtySide::Master as i32 && Some(p.index) == index =>
                {
                    Some(f.id)
                }
                _ => None,
            })
            .unwrap_or(0);
        ctty.fd = files
            .tables
            .iter()
            .find(|(p, _)| *p == pid)
            .and_then(|(_, t)| {
                t.fds.iter().find(|fd| {
                    std::fs::metadata(format!("/proc/{pid}/fd/{}", fd.fd)).is_ok_and(|m| {
                        m.rdev() == ctty.rdev && m.mode() & libc::S_IFMT == libc::S_IFCHR
                    })
                })
            })
            .map_or(-1, |fd| fd.fd);
    }
}

fn steal(pid: i32, fd: i32) -> Result<OwnedFd> {
    sys::take_fd(pid, fd).map_err(|e| DumpError::Proc {
        pid,
        path: format!("fd/{fd} (pidfd_getfd)").into(),
        source: e,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pts_numbers_span_the_slave_majors() {
        assert_eq!(pts_index(libc::makedev(136, 0)), Some(0));
        assert_eq!(pts_index(libc::makedev(136, 255)), Some(255));
        assert_eq!(pts_index(libc::makedev(137, 1)), Some(257));
        assert_eq!(pts_index(libc::makedev(5, 2)), None);
        assert_eq!(pts_index(libc::makedev(4, 1)), None);
    }
}
