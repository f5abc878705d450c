//! Small /proc files read in one go. A /proc file reports size 0, so
//! `std::fs::read_to_string` asks for its size and position and then grows
//! its buffer read by read, some eight syscalls for a `status` file; here
//! it is an open, two reads and a close. Dumping or restoring 2,000
//! threads reads thousands of them.

use std::io::Read;
use std::path::Path;

/// The buffer a file is first read into: most /proc files fit.
const FIRST_READ: usize = 4096;

/// The whole file's bytes.
pub fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; FIRST_READ];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(buf.len() * 2, 0);
        }
        match f.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// The whole file as text.
pub fn read_string(path: &Path) -> std::io::Result<String> {
    String::from_utf8(read(path)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The kernel's `PF_EXITING` task flag (`/proc/TID/stat` field 9): set as
/// the task starts to exit, before its memory is released. Nothing undoes
/// it.
const PF_EXITING: u64 = 0x4;

/// Whether task `tid` is on its way out: exiting (killed, its memory still
/// being released), a zombie, or gone.
pub fn leaving(tid: i32) -> bool {
    let Ok(stat) = read_string(Path::new(&format!("/proc/{tid}/stat"))) else {
        return true;
    };
    // After the command name (which may hold spaces and parens): the state
    // (field 3), then flags (field 9) six fields on.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return false;
    };
    let mut fields = rest.split_whitespace();
    let state = fields.next().unwrap_or("");
    let flags = fields
        .nth(5)
        .and_then(|f| f.parse::<u64>().ok())
        .unwrap_or(0);
    matches!(state, "Z" | "X" | "x") || flags & PF_EXITING != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_task_is_not_leaving_a_missing_one_is() {
        assert!(!leaving(std::process::id() as i32));
        // Above pid_max: never a task.
        assert!(leaving(i32::MAX));
    }

    #[test]
    fn reads_small_and_large_proc_files_whole() {
        let status = read_string(Path::new("/proc/self/status")).unwrap();
        assert!(status.starts_with("Name:") && status.contains("\nPid:"));
        // Larger than the first buffer: every byte, same as std's.
        let maps = read(Path::new("/proc/self/smaps")).unwrap();
        assert!(maps.len() > FIRST_READ);
        assert!(maps.ends_with(b"\n"));
    }
}
