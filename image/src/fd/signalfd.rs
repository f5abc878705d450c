//! signalfd(2) objects.
//!
//! The message is defined in `image/proto/fd_signalfd.proto`.

pub use crate::pb::SignalfdFile;

impl SignalfdFile {
    /// The signal numbers in the mask, ascending.
    pub fn signals(&self) -> impl Iterator<Item = u32> + '_ {
        (0..u64::BITS)
            .filter(|bit| self.sigmask & (1 << bit) != 0)
            .map(|bit| bit + 1)
    }
}

impl super::Describe for SignalfdFile {
    fn describe(&self) -> String {
        let signals: Vec<String> = self.signals().map(|n| n.to_string()).collect();
        format!(
            "signalfd mask {:#x} (signals {})",
            self.sigmask,
            signals.join(",")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_bits_are_signal_numbers_minus_one() {
        // SIGUSR1 (10) and SIGTERM (15), as fdinfo shows `0000000000004200`.
        let s = SignalfdFile { sigmask: 0x4200 };
        assert_eq!(s.signals().collect::<Vec<_>>(), vec![10, 15]);
    }
}
