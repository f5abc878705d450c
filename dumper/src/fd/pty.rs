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
//! termios ioctls of a master act on its slave. Data in flight in either
//! direction cannot be read without consuming it, so a pair holding any
//! fails the dump by name (it is usually gone a moment later).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use ckpt_image::fd::file::Kind;
use ckpt_image::fd::pty::{NCCS, PtyFile, PtyLine, PtySide};

use super::{Blobs, FdParams, FileDumper, TreeFiles};
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
        "pseudo-terminal pairs whose master the tree holds, with their line settings and window size (recreated)"
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
        let pending = sys::readable_bytes(master.as_fd()).map_err(|e| os("FIONREAD", e))?;
        if pending > 0 {
            return Err(p.unsupported(&format!(
                "pty master (/dev/pts/{index}) has {pending} bytes of output not yet read; data in flight in a terminal is not saved, dump again in a moment"
            )));
        }
        let st = sys::term_state(master.as_fd()).map_err(|e| os("TCGETS", e))?;
        let line = PtyLine {
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
            packet_mode: sys::pty_packet_mode(master.as_fd()).map_err(|e| os("TIOCGPKT", e))?,
            locked: sys::pty_locked(master.as_fd()).map_err(|e| os("TIOCGPTLCK", e))?,
        };
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
        // Input typed into the master and not yet read by the slave's
        // reader sits on the slave's side.
        let mut blockers = Blockers::default();
        for (id, index) in slaves {
            let Some(h) = tree.holders().find(|h| h.file_id == id) else {
                continue;
            };
            let pending = steal(h.pid, h.fd).and_then(|s| {
                sys::readable_bytes(s.as_fd()).map_err(|e| DumpError::Proc {
                    pid: h.pid,
                    path: format!("fd/{} (FIONREAD)", h.fd).into(),
                    source: e,
                })
            });
            match pending {
                Ok(0) => {}
                Ok(n) => {
                    blockers.absorb::<()>(Err(DumpError::Unsupported {
                        pid: h.pid,
                        what: format!(
                            "fd {}: pty slave /dev/pts/{index} has {n} bytes of input not yet read; data in flight in a terminal is not saved, dump again in a moment",
                            h.fd
                        ),
                    }))?;
                }
                Err(e) => {
                    blockers.absorb::<()>(Err(e))?;
                }
            }
        }
        blockers.into_result()
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
