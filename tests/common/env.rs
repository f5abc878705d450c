//! A test's temporary directory and image key, and the ordinary test user.

use super::*;

/// Per-test scratch space: `work/` for the victim, `img/` (not created) for
/// the images, and logs of every ckpt invocation.  Kept on failure so the
/// images and logs can be inspected.
pub struct TestEnv {
    tmp: Option<tempfile::TempDir>,
    pub root: PathBuf,
    pub work: PathBuf,
    pub img: PathBuf,
    pub(crate) cmd_counter: AtomicUsize,
}

impl TestEnv {
    /// The image key of this test's ckpt invocations (created by its first
    /// dump), so tests never touch the site's key in /var/lib.
    pub fn image_key(&self) -> PathBuf {
        self.root.join("image.key")
    }

    /// A `ckpt` command with this test's image key, for tests that need
    /// more control than [`ckpt`] gives (fault points, odd fds, signals).
    pub fn ckpt_command(&self) -> Command {
        let mut cmd = Command::new(CKPT);
        cmd.env("CKPT_IMAGE_KEY", self.image_key());
        cmd
    }

    pub fn new(test: &str) -> TestEnv {
        let tmp = tempfile::Builder::new()
            .prefix(&format!("ckpt-e2e-{test}-"))
            .tempdir()
            .expect("create temp dir");
        let root = tmp.path().to_path_buf();
        let work = root.join("work");
        fs::create_dir(&work).expect("create work dir");
        TestEnv {
            tmp: Some(tmp),
            img: root.join("img"),
            root,
            work,
            cmd_counter: AtomicUsize::new(0),
        }
    }
}

/// An unprivileged account for the security tests: ckpt runs as root on
/// other users' jobs, so what matters is what a restore gives a process of
/// an ordinary user.
pub struct TestUser {
    pub name: &'static str,
    pub uid: u32,
    pub gid: u32,
}

pub(crate) const TEST_USER: &str = "ckpt-test";
/// A second ordinary account, for what one user must not do to another's.
pub(crate) const OTHER_TEST_USER: &str = "ckpt-test2";

/// The test account, created (system user, no home, no login shell) on
/// first use.
pub fn test_user() -> &'static TestUser {
    static USER: std::sync::OnceLock<TestUser> = std::sync::OnceLock::new();
    USER.get_or_init(|| account(TEST_USER))
}

/// The second test account (as [`test_user`]).
pub fn other_test_user() -> &'static TestUser {
    static USER: std::sync::OnceLock<TestUser> = std::sync::OnceLock::new();
    USER.get_or_init(|| account(OTHER_TEST_USER))
}

fn account(name: &'static str) -> TestUser {
    {
        let lookup = || nix::unistd::User::from_name(name).expect("read passwd");
        if lookup().is_none() {
            let out = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    name,
                ])
                .output()
                .expect("run useradd");
            // Another test binary may have created it meanwhile.
            assert!(
                out.status.success() || lookup().is_some(),
                "useradd {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let u = lookup().expect("test user exists");
        TestUser {
            name,
            uid: u.uid.as_raw(),
            gid: u.gid.as_raw(),
        }
    }
}

impl TestEnv {
    /// Hands the work dir (where the victim keeps its state and protocol
    /// files) to `user`. The image dir stays root's.
    pub fn give_work_to(&self, user: &TestUser) {
        let own = |p: &Path| {
            nix::unistd::chown(
                p,
                Some(nix::unistd::Uid::from_raw(user.uid)),
                Some(nix::unistd::Gid::from_raw(user.gid)),
            )
            .unwrap_or_else(|e| panic!("chown {}: {e}", p.display()))
        };
        own(&self.work);
        for e in fs::read_dir(&self.work).expect("read work dir").flatten() {
            own(&e.path());
        }
        // The root dir must be reachable for the victim to get to work/.
        fs::set_permissions(&self.root, fs::Permissions::from_mode(0o755))
            .expect("chmod test root");
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(tmp) = self.tmp.take()
        {
            eprintln!("test failed: keeping {}", tmp.keep().display());
        }
    }
}
