/*
 * Directories victim, one shape per mode (`dirs WORKDIR MODE`):
 *
 * "removed": fd 20 is opendir()'s fd of WORKDIR/gone (O_RDONLY|O_DIRECTORY),
 *   fd 21 an O_PATH fd of WORKDIR/kept; "gone" is removed (rmdir) before
 *   ready. After go fd 20 is still a read-only directory fd of a removed
 *   directory (nlink 0, link "... (deleted)", its owner and mode, nothing
 *   can be made in it, listing it fails with ENOENT), and fd 21 still reaches
 *   WORKDIR/kept/inside.
 * "cwd": the process's working directory WORKDIR/cwdgone is removed
 *   before ready. After go its working directory is still a removed empty
 *   directory: /proc/self/cwd reads "WORKDIR/cwdgone (deleted)", "." has
 *   nlink 0 and no file can be made in it.
 * "chroot": a child chroot()s into WORKDIR/jail (holding "marker") and
 *   chdirs to /sub; the parent answers the harness. After go (from the
 *   parent, by a pipe) the child checks that "/" is still the jail (same
 *   inode, "/marker" readable) and that its working directory is /sub,
 *   and exits 0 or 1; the parent reports that.
 * "chroot-removed": the child chroot()s into an empty WORKDIR/jail, which
 *   the parent then removes (the dump must be refused); after go the child
 *   checks its root is still the removed directory.
 */
#include "victim.h"

#include <sys/stat.h>
#include <sys/syscall.h>

#define FD_GONE 20
#define FD_KEPT 21

static int open_at_fd(const char *name, int flags, int want)
{
	char p[PATH_MAX];
	victim_path(p, sizeof(p), name);
	victim_fd_at(open(p, flags), want);
	return want;
}

static void make_dir(const char *name)
{
	char p[PATH_MAX];
	victim_path(p, sizeof(p), name);
	if (mkdir(p, 0750))
		die(name);
}

static void make_file(const char *name, const char *content)
{
	char p[PATH_MAX];
	victim_path(p, sizeof(p), name);
	int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0)
		die(name);
	victim_write_all(fd, content, strlen(content));
	close(fd);
}

static void remove_dir(const char *name)
{
	char p[PATH_MAX];
	victim_path(p, sizeof(p), name);
	if (rmdir(p))
		die(name);
}

/* The fd's /proc link ends with " (deleted)" and starts with the path. */
static void check_link_deleted(const char *link, const char *name)
{
	char want[PATH_MAX + 16], got[PATH_MAX] = { 0 }, abs_work[PATH_MAX];
	if (!realpath(victim_workdir, abs_work))
		die("realpath");
	snprintf(want, sizeof(want), "%s/%s (deleted)", abs_work, name);
	ssize_t n = readlink(link, got, sizeof(got) - 1);
	CHECK(n > 0 && strcmp(got, want) == 0, "%s reads '%s', want '%s'", link, n > 0 ? got : "",
	      want);
}

/* Nothing can be created in a removed directory. */
static void check_removed_dir(int dirfd, const char *what)
{
	struct stat st;
	CHECK(fstat(dirfd, &st) == 0 && S_ISDIR(st.st_mode), "%s: not a directory", what);
	CHECK(st.st_nlink == 0, "%s: nlink %lu, want 0 (removed)", what,
	      (unsigned long)st.st_nlink);
	CHECK((st.st_mode & 07777) == 0750, "%s: mode %#o, want 0750", what, st.st_mode & 07777);
	CHECK(st.st_uid == getuid(), "%s: owner %u, want %u", what, st.st_uid, getuid());
	int fd = openat(dirfd, "new", O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
	CHECK(fd < 0 && errno == ENOENT, "%s: a file could be made in it (%s)", what,
	      fd < 0 ? strerror(errno) : "opened");
	if (fd >= 0)
		close(fd);
}

static void removed(void)
{
	make_dir("gone");
	make_dir("kept");
	make_file("kept/inside", "here\n");
	open_at_fd("gone", O_RDONLY | O_DIRECTORY, FD_GONE);
	open_at_fd("kept", O_PATH | O_DIRECTORY, FD_KEPT);
	remove_dir("gone");

	victim_ready_and_wait(NULL);

	int fl = fcntl(FD_GONE, F_GETFL);
	CHECK(fl >= 0 && (fl & O_ACCMODE) == O_RDONLY && (fl & O_DIRECTORY),
	      "fd %d: flags %#o, want O_RDONLY|O_DIRECTORY", FD_GONE, fl);
	check_removed_dir(FD_GONE, "removed directory fd");
	check_link_deleted("/proc/self/fd/20", "gone");
	/* The kernel lists nothing of a removed directory: ENOENT. */
	char buf[1024];
	long n = syscall(SYS_getdents64, FD_GONE, buf, sizeof(buf));
	CHECK(n < 0 && errno == ENOENT, "getdents on the removed directory gave %ld (%s)", n,
	      strerror(errno));

	fl = fcntl(FD_KEPT, F_GETFL);
	CHECK(fl >= 0 && (fl & O_PATH), "fd %d: not O_PATH (%#o)", FD_KEPT, fl);
	struct stat st;
	CHECK(fstatat(FD_KEPT, "inside", &st, 0) == 0 && st.st_size == 5,
	      "kept/inside not reachable through fd %d", FD_KEPT);
	victim_finish();
}

static void cwd(void)
{
	char p[PATH_MAX];
	make_dir("cwdgone");
	victim_path(p, sizeof(p), "cwdgone");
	if (chdir(p))
		die("chdir");
	remove_dir("cwdgone");

	victim_ready_and_wait(NULL);

	check_link_deleted("/proc/self/cwd", "cwdgone");
	int dot = open(".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(dot >= 0, "open(\".\"): %s", strerror(errno));
	if (dot >= 0) {
		check_removed_dir(dot, "working directory");
		close(dot);
	}
	victim_finish();
}

static void jailed(int remove_jail)
{
	int go[2];
	make_dir("jail");
	if (!remove_jail) {
		make_dir("jail/sub");
		make_file("jail/marker", "jail\n");
	}
	if (pipe2(go, O_CLOEXEC))
		die("pipe");
	/* The child reports it is jailed by closing its end of `up`. */
	int up[2];
	if (pipe2(up, O_CLOEXEC))
		die("pipe");
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		close(go[1]);
		close(up[0]);
		char jail[PATH_MAX];
		struct stat st, before;
		victim_path(jail, sizeof(jail), "jail");
		if (stat(jail, &before) || chroot(jail) || chdir(remove_jail ? "/" : "/sub"))
			_exit(10);
		close(up[1]);
		char c;
		if (victim_read_exact(go[0], &c, 1))
			_exit(11);
		if (remove_jail) {
			struct stat root;
			_exit(stat("/", &root) || root.st_nlink != 0 ? 16 : 0);
		}
		if (stat("/", &st) || st.st_ino != before.st_ino || st.st_dev != before.st_dev)
			_exit(12);
		char buf[16];
		if (read_small_file("/marker", buf, sizeof(buf)) != 5 || memcmp(buf, "jail\n", 5))
			_exit(13);
		char here[PATH_MAX];
		if (!getcwd(here, sizeof(here)) || strcmp(here, "/sub"))
			_exit(14);
		struct stat up_st;
		if (stat("/..", &up_st) || up_st.st_ino != st.st_ino)
			_exit(15);
		_exit(0);
	}
	close(go[0]);
	close(up[1]);
	char c;
	if (read(up[0], &c, 1) != 0)
		die("child did not get into its jail");
	close(up[0]);
	if (remove_jail)
		remove_dir("jail");
	victim_ready_and_wait(NULL);
	if (write(go[1], "g", 1) != 1)
		die("write go");
	victim_check_child(child, "the chrooted child");
	victim_finish();
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	const char *mode = argc > 2 ? argv[2] : "";
	if (strcmp(mode, "removed") == 0)
		removed();
	if (strcmp(mode, "cwd") == 0)
		cwd();
	if (strcmp(mode, "chroot") == 0)
		jailed(0);
	if (strcmp(mode, "chroot-removed") == 0)
		jailed(1);
	die("unknown mode");
}
