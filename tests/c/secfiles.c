/*
 * Victim for tests/security_files.rs, run as an unprivileged user.
 * `secfiles WORKDIR MODE [ARG]`, MODE one of:
 *
 *   ghost   fd 20: an unlinked file of its own with mode 04755. After go
 *           it must still be owned by this user with mode 04755 (never
 *           setuid-root) and hold the same bytes.
 *   data    fd 10: WORKDIR/data.txt read-write at offset 4.
 *   log     fd 6: WORKDIR/log.txt write-only, "line1\n" written. After
 *           go the offset must be the end of the file (true both when
 *           the file did not change and when restore was told it may
 *           have and put the offset at its end).
 *   tty7    fd 7: a pty slave (the master is closed). With ARG "null",
 *           after go fd 7 must be /dev/null.
 *   lease   fd 5: WORKDIR/db read-only holding a read lease (F_SETLEASE),
 *           its break signal SIGIO caught. After go F_GETLEASE must say
 *           F_RDLCK, and a process opening db for writing (non-blocking,
 *           so it fails with EWOULDBLOCK) must make the victim get SIGIO;
 *           the victim then gives the lease up and the writer gets in.
 *           With ARG "breaking", that writer runs before the dump, so the
 *           lease is being broken then, and after go the victim only
 *           gives it up.
 *   shm     maps the tmpfs file ARG (another user's, mode 0666) shared and
 *           writes its data there, keeping no fd. After go the mapping
 *           must still hold that data.
 *   cwd     its working directory is WORKDIR/cwd, made by itself. After
 *           go it must be that very directory (device and inode).
 */
#include "victim.h"

#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#define FD_GHOST 20
#define FD_DATA 10
#define FD_LOG 6
#define FD_TTY 7
#define FD_LOCK 5

#define GHOST_MODE 04755
#define DATA_OFFSET 4

static const char ghost_bytes[] = "ghost contents\n";
static const char line1[] = "line1\n";

static void setup_ghost(void)
{
	char p[PATH_MAX];

	victim_path(p, sizeof(p), "suid-ghost");
	victim_fd_at(open(p, O_RDWR | O_CREAT | O_EXCL, 0600), FD_GHOST);
	victim_write_all(FD_GHOST, ghost_bytes, sizeof(ghost_bytes) - 1);
	if (fchmod(FD_GHOST, GHOST_MODE))
		die("fchmod");
	if (unlink(p))
		die("unlink");
}

static void check_ghost(void)
{
	struct stat st;
	char buf[64] = { 0 };

	CHECK(fstat(FD_GHOST, &st) == 0, "fstat ghost: %s", strerror(errno));
	CHECK(st.st_uid == getuid() && st.st_gid == getgid(),
	      "ghost owned by %u:%u, want %u:%u", st.st_uid, st.st_gid, getuid(), getgid());
	CHECK((st.st_mode & 07777) == GHOST_MODE, "ghost mode %04o, want %04o",
	      st.st_mode & 07777, GHOST_MODE);
	CHECK(st.st_nlink == 0, "ghost has %lu links", (unsigned long)st.st_nlink);
	CHECK(pread(FD_GHOST, buf, sizeof(buf) - 1, 0) == sizeof(ghost_bytes) - 1 &&
		      strcmp(buf, ghost_bytes) == 0,
	      "ghost contents changed");
}

static void setup_data(void)
{
	char p[PATH_MAX];

	victim_path(p, sizeof(p), "data.txt");
	victim_fd_at(open(p, O_RDWR | O_CREAT | O_TRUNC, 0600), FD_DATA);
	victim_write_all(FD_DATA, "0123456789\n", 11);
	if (lseek(FD_DATA, DATA_OFFSET, SEEK_SET) != DATA_OFFSET)
		die("lseek");
}

static void check_data(void)
{
	CHECK(lseek(FD_DATA, 0, SEEK_CUR) == DATA_OFFSET, "data.txt offset changed");
}

static void setup_log(void)
{
	char p[PATH_MAX];

	victim_path(p, sizeof(p), "log.txt");
	victim_fd_at(open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644), FD_LOG);
	victim_write_all(FD_LOG, line1, sizeof(line1) - 1);
}

static void check_log(void)
{
	struct stat st;
	off_t off = lseek(FD_LOG, 0, SEEK_CUR);

	CHECK(fstat(FD_LOG, &st) == 0, "fstat log: %s", strerror(errno));
	CHECK(off == st.st_size, "log offset %ld is not its end %ld (would overwrite)",
	      (long)off, (long)st.st_size);
	victim_write_all(FD_LOG, "line2\n", 6);
}

static void setup_tty(void)
{
	int master = posix_openpt(O_RDWR | O_NOCTTY);
	char *name;

	if (master < 0 || grantpt(master) || unlockpt(master))
		die("posix_openpt");
	name = ptsname(master);
	if (!name)
		die("ptsname");
	victim_fd_at(open(name, O_RDWR | O_NOCTTY), FD_TTY);
	close(master);
}

static void check_tty_is_null(void)
{
	struct stat st;

	CHECK(fstat(FD_TTY, &st) == 0, "fstat fd 7: %s", strerror(errno));
	CHECK(S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 && minor(st.st_rdev) == 3,
	      "fd 7 is not /dev/null (mode %o, rdev %u:%u)", st.st_mode, major(st.st_rdev),
	      minor(st.st_rdev));
}

static volatile sig_atomic_t lease_broken;

static void on_sigio(int sig)
{
	(void)sig;
	lease_broken = 1;
}

/* Forks a process that opens db for writing without waiting; returns
 * its exit status: 0 if the open failed with EWOULDBLOCK (a lease is
 * held), 1 if it got in, 2 on any other error. */
static int try_writer(void)
{
	char p[PATH_MAX];
	int st;

	victim_path(p, sizeof(p), "db");
	pid_t w = fork();
	if (w < 0)
		return -1;
	if (w == 0) {
		int fd = open(p, O_WRONLY | O_NONBLOCK);
		_exit(fd >= 0 ? 1 : errno == EWOULDBLOCK ? 0 : 2);
	}
	/* The lease-break signal may arrive while waiting. */
	pid_t got;
	while ((got = waitpid(w, &st, 0)) < 0 && errno == EINTR)
		;
	if (got != w || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

/* Waits up to 2 s for the lease-break signal. */
static int wait_lease_broken(void)
{
	for (int i = 0; i < 200 && !lease_broken; i++)
		usleep(10000);
	return lease_broken;
}

static void setup_lease(const char *arg)
{
	char p[PATH_MAX];
	int fd;
	struct sigaction sa = { .sa_handler = on_sigio };

	victim_path(p, sizeof(p), "db");
	fd = open(p, O_RDWR | O_CREAT, 0600);
	if (fd < 0)
		die("create db");
	close(fd);
	if (sigaction(SIGIO, &sa, NULL))
		die("sigaction");
	victim_fd_at(open(p, O_RDONLY), FD_LOCK);
	if (fcntl(FD_LOCK, F_SETLEASE, F_RDLCK))
		die("F_SETLEASE");
	if (strcmp(arg, "breaking") == 0 && (try_writer() != 0 || !wait_lease_broken()))
		die("break the lease");
}

static void check_lease(const char *arg)
{
	int w;

	if (strcmp(arg, "breaking") == 0)
		goto give_up;
	CHECK(fcntl(FD_LOCK, F_GETLEASE) == F_RDLCK, "F_GETLEASE is %d, want F_RDLCK",
	      fcntl(FD_LOCK, F_GETLEASE));
	CHECK(!lease_broken, "lease-break signal before any writer");
	w = try_writer();
	CHECK(w == 0, "a writer got status %d, want 0 (EWOULDBLOCK)", w);
	CHECK(wait_lease_broken(), "no SIGIO for the writer");
give_up:
	CHECK(fcntl(FD_LOCK, F_SETLEASE, F_UNLCK) == 0, "give the lease up: %s",
	      strerror(errno));
	w = try_writer();
	CHECK(w == 1, "a writer after the lease got status %d, want 1", w);
}

static const char shm_data[] = "the job's data\n";
static char *shm_map;

static void setup_shm(const char *path)
{
	int fd = open(path, O_RDWR);

	if (fd < 0)
		die("open shm file");
	shm_map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (shm_map == MAP_FAILED)
		die("mmap shm file");
	close(fd);
	memcpy(shm_map, shm_data, sizeof(shm_data));
}

static void check_shm(void)
{
	CHECK(memcmp(shm_map, shm_data, sizeof(shm_data)) == 0, "shm mapping lost its data");
}

static struct stat cwd_at_setup;

static void setup_cwd(void)
{
	char p[PATH_MAX];

	victim_path(p, sizeof(p), "cwd");
	if (mkdir(p, 0755) || chdir(p) || stat(".", &cwd_at_setup))
		die("make and enter cwd");
}

static void check_cwd(void)
{
	struct stat st;

	CHECK(stat(".", &st) == 0, "stat cwd: %s", strerror(errno));
	CHECK(st.st_dev == cwd_at_setup.st_dev && st.st_ino == cwd_at_setup.st_ino,
	      "cwd is inode %lu, want %lu", (unsigned long)st.st_ino,
	      (unsigned long)cwd_at_setup.st_ino);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 2 ? argv[2] : "";
	const char *arg = argc > 3 ? argv[3] : "";

	victim_init(argc, argv);
	if (strcmp(mode, "ghost") == 0)
		setup_ghost();
	else if (strcmp(mode, "data") == 0)
		setup_data();
	else if (strcmp(mode, "log") == 0)
		setup_log();
	else if (strcmp(mode, "tty7") == 0)
		setup_tty();
	else if (strcmp(mode, "lease") == 0)
		setup_lease(arg);
	else if (strcmp(mode, "cwd") == 0)
		setup_cwd();
	else if (strcmp(mode, "shm") == 0)
		setup_shm(arg);
	else
		die("unknown mode");

	victim_ready_and_wait(NULL);

	if (strcmp(mode, "ghost") == 0)
		check_ghost();
	else if (strcmp(mode, "data") == 0)
		check_data();
	else if (strcmp(mode, "log") == 0)
		check_log();
	else if (strcmp(mode, "tty7") == 0 && strcmp(arg, "null") == 0)
		check_tty_is_null();
	else if (strcmp(mode, "cwd") == 0)
		check_cwd();
	else if (strcmp(mode, "lease") == 0)
		check_lease(arg);
	else if (strcmp(mode, "shm") == 0)
		check_shm();
	victim_finish();
}
