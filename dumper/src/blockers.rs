//! Everything in a tree that ckpt cannot save, gathered across the whole
//! collection so the user sees every blocker at once instead of fixing one
//! thing per run. Only "not supported" errors are gathered; any other error
//! still ends the dump at once. Nothing is written while a blocker exists,
//! and the tree is thawed unharmed.

use crate::error::{Blocker, DumpError, Result};

/// The blockers found so far.
#[derive(Default, Clone)]
pub struct Blockers(Vec<Blocker>);

impl Blockers {
    /// Records `r`'s error if it is "not supported" (and returns `None`);
    /// passes a value or any other error through.
    pub fn absorb<T>(&mut self, r: Result<T>) -> Result<Option<T>> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(DumpError::Unsupported { pid, what }) => {
                log::debug!("refused: pid {pid}: {what} not supported");
                self.0.push(Blocker { pid, what });
                Ok(None)
            }
            Err(DumpError::Blocked { blockers }) => {
                for b in &blockers {
                    log::debug!("refused: pid {}: {} not supported", b.pid, b.what);
                }
                self.0.extend(blockers);
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// Adds the blockers of an earlier phase.
    pub fn extend(&mut self, other: Blockers) {
        self.0.extend(other.0);
    }

    /// `Ok` if nothing blocks the dump, else every blocker in one error (a
    /// single blocker stays the plain "not supported" error).
    pub fn into_result(mut self) -> Result<()> {
        match self.0.len() {
            0 => Ok(()),
            1 => {
                let b = self.0.remove(0);
                Err(DumpError::Unsupported {
                    pid: b.pid,
                    what: b.what,
                })
            }
            _ => Err(DumpError::Blocked { blockers: self.0 }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unsupported(pid: i32, what: &str) -> Result<()> {
        Err(DumpError::Unsupported {
            pid,
            what: what.into(),
        })
    }

    #[test]
    fn gathers_unsupported_and_passes_other_errors() {
        let mut b = Blockers::default();
        assert_eq!(b.absorb(Ok(5)).unwrap(), Some(5));
        assert!(b.absorb(unsupported(1, "fd 3: socket")).unwrap().is_none());
        assert!(b.absorb(unsupported(2, "fd 4: memfd")).unwrap().is_none());
        assert!(matches!(
            b.absorb::<()>(Err(DumpError::NoProcess { pid: 3 })),
            Err(DumpError::NoProcess { pid: 3 })
        ));
        match b.into_result() {
            Err(DumpError::Blocked { blockers }) => {
                assert_eq!(blockers.len(), 2);
                assert_eq!(
                    (blockers[1].pid, blockers[1].what.as_str()),
                    (2, "fd 4: memfd")
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn one_blocker_is_the_plain_error() {
        let mut b = Blockers::default();
        b.absorb(unsupported(1, "fd 3: socket")).unwrap();
        assert!(matches!(
            b.into_result(),
            Err(DumpError::Unsupported { pid: 1, .. })
        ));
        assert!(Blockers::default().into_result().is_ok());
    }
}
