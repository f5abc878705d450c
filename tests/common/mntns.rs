//! A mount namespace of a test's own.

use super::*;

/// A mount namespace of its own (private: nothing mounted in it reaches
/// the test's, nor the other way) with a tmpfs at `dir` that only its
/// processes see, kept alive by a `sleep` in it. Dropping it kills the
/// sleeper; the namespace, and the tmpfs with its files, end with the last
/// process in it.
pub struct MntNs {
    /// Where the tmpfs is mounted inside (an empty directory outside).
    pub dir: PathBuf,
    sleeper: Child,
}

impl MntNs {
    /// Makes the namespace and mounts the tmpfs (`dir` is created).
    pub fn new(dir: &Path) -> MntNs {
        use std::os::unix::ffi::OsStrExt;
        fs::create_dir_all(dir).expect("create the mount point");
        let at = std::ffi::CString::new(dir.as_os_str().as_bytes()).expect("mount point");
        let mut cmd = Command::new("sleep");
        cmd.arg("600")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        cloexec_inherited_fds(&mut cmd, false);
        // SAFETY: between fork and exec the hook makes raw syscalls only,
        // on static strings and a CString made before the fork; it does
        // not allocate.
        unsafe {
            cmd.pre_exec(move || {
                let private = libc::MS_REC | libc::MS_PRIVATE;
                if libc::unshare(libc::CLONE_NEWNS) != 0
                    || libc::mount(
                        std::ptr::null(),
                        c"/".as_ptr(),
                        std::ptr::null(),
                        private,
                        std::ptr::null(),
                    ) != 0
                    || libc::mount(
                        c"ckpt-test".as_ptr(),
                        at.as_ptr(),
                        c"tmpfs".as_ptr(),
                        0,
                        c"mode=0755".as_ptr().cast(),
                    ) != 0
                {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let sleeper = cmd
            .spawn()
            .expect("start a process in a new mount namespace");
        MntNs {
            dir: dir.to_path_buf(),
            sleeper,
        }
    }

    /// The namespace file: `/proc/PID/ns/mnt` of the sleeper.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/mnt", self.sleeper.id()))
    }

    /// The namespace's inode (`mnt:[INODE]`).
    pub fn inode(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(self.path())
            .expect("stat the mount namespace")
            .ino()
    }

    /// `path` (absolute) as the namespace's processes see it, reached from
    /// outside through the sleeper's root.
    pub fn inside(&self, path: &Path) -> PathBuf {
        Path::new(&format!("/proc/{}/root", self.sleeper.id()))
            .join(path.strip_prefix("/").unwrap_or(path))
    }
}

impl Drop for MntNs {
    fn drop(&mut self) {
        let _ = self.sleeper.kill();
        let _ = self.sleeper.wait();
    }
}

/// Gives the processes in the mount namespace of `pid` (a restored copy of
/// a job, in a private mount namespace) a work directory of their own,
/// `ROOT/work2`, bound over the shared one, so that two copies report
/// apart. Returns it.
pub fn own_work_dir_in(env: &TestEnv, pid: i32) -> PathBuf {
    let other = env.root.join("work2");
    std::fs::create_dir(&other).unwrap();
    let mnt = format!("--mount=/proc/{pid}/ns/mnt");
    let bind = Command::new("nsenter")
        .args([
            &mnt,
            "mount",
            "--bind",
            path_str(&other),
            path_str(&env.work),
        ])
        .status()
        .expect("run nsenter");
    assert!(bind.success(), "bind mount in the copy's namespace: {bind}");
    other
}
