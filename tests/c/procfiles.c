/*
 * /proc files held open, one shape per mode (`procfiles WORKDIR MODE`):
 *
 * "own": fd 20 is /proc/self/stat, fd 21 /proc/self/maps, fd 22
 *   /proc/CHILD/maps of a child of the victim (which waits on a pipe),
 *   fd 23 /proc/self/ns/net, fd 25 the directory /proc/self and fd 26
 *   the directory /proc/self/fd. After go each must describe the restored
 *   processes: the stat read through fd 20 has the pid, parent and start
 *   time of a fresh read of /proc/self/stat (a process made again starts
 *   later than the dumped one), the maps read through fds 21 and 22 are
 *   the ones a fresh open reads, fd 23 is the network namespace the
 *   process is in, "stat" under fd 25 is the restored process's, listing
 *   fd 26 shows fd 26, and every fd is the same inode as a fresh open.
 * "gone": fd 24 is /proc/CHILD/stat of a child that has since exited and
 *   been reaped (the dump must be refused); after go reading it still
 *   fails with ESRCH.
 * "outside": fd 24 is /proc/1/stat, of a process outside the tree (the
 *   dump must be refused); after go it still reads pid 1.
 */
#include "victim.h"

#include <sys/stat.h>

#define FD_STAT 20
#define FD_MAPS 21
#define FD_CHILD_MAPS 22
#define FD_NET 23
#define FD_GONE_STAT 24
#define FD_SELF_DIR 25
#define FD_FD_DIR 26

#define BIG 65536
static char got[BIG], want[BIG];

/* A child that lives until `hold`'s write end closes. */
static pid_t waiting_child(int hold[2])
{
	if (pipe2(hold, O_CLOEXEC))
		die("pipe");
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		char c;
		close(hold[1]);
		_exit(read(hold[0], &c, 1) == 0 ? 0 : 1);
	}
	close(hold[0]);
	return child;
}

static int open_proc(const char *path, int want_fd)
{
	victim_fd_at(open(path, O_RDONLY), want_fd);
	return want_fd;
}

/* The whole file from offset 0 through `fd`, NUL-terminated. */
static ssize_t read_fd(int fd, char *buf)
{
	ssize_t total = 0, n;
	if (lseek(fd, 0, SEEK_SET) != 0)
		return -1;
	while ((n = read(fd, buf + total, BIG - 1 - total)) > 0)
		total += n;
	buf[total] = '\0';
	return n < 0 ? -1 : total;
}

static ssize_t read_path(const char *path, char *buf)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read_fd(fd, buf);
	close(fd);
	return n;
}

/* Field `n` (1-based) of a /proc/PID/stat line, after the command name. */
static long long stat_field(const char *line, int n)
{
	const char *p = strrchr(line, ')');
	if (!p)
		return -1;
	/* Field 3 (state) follows ") ". */
	p += 2;
	for (int i = 3; i < n; i++) {
		p = strchr(p, ' ');
		if (!p)
			return -1;
		p++;
	}
	return atoll(p);
}

static void same_inode(int fd, const char *path)
{
	struct stat a, b;
	CHECK(fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino &&
		      a.st_dev == b.st_dev,
	      "fd %d is not the inode %s opens now", fd, path);
}

static void own(void)
{
	int hold[2];
	pid_t child = waiting_child(hold);
	char child_maps[64];
	snprintf(child_maps, sizeof(child_maps), "/proc/%d/maps", child);
	open_proc("/proc/self/stat", FD_STAT);
	open_proc("/proc/self/maps", FD_MAPS);
	open_proc(child_maps, FD_CHILD_MAPS);
	open_proc("/proc/self/ns/net", FD_NET);
	victim_fd_at(open("/proc/self", O_RDONLY | O_DIRECTORY), FD_SELF_DIR);
	victim_fd_at(open("/proc/self/fd", O_RDONLY | O_DIRECTORY), FD_FD_DIR);
	if (read_path("/proc/self/stat", want) < 0)
		die("read stat");
	long long start_before = stat_field(want, 22);

	victim_ready_and_wait(NULL);

	CHECK(read_fd(FD_STAT, got) > 0, "reading fd %d: %s", FD_STAT, strerror(errno));
	CHECK(read_path("/proc/self/stat", want) > 0, "reading /proc/self/stat: %s",
	      strerror(errno));
	CHECK(atoi(got) == getpid(), "fd %d describes pid %d, not %d", FD_STAT, atoi(got),
	      getpid());
	CHECK(stat_field(got, 4) == getppid(), "fd %d gives parent %lld, not %d", FD_STAT,
	      stat_field(got, 4), getppid());
	CHECK(stat_field(got, 22) == stat_field(want, 22),
	      "fd %d gives start time %lld, the restored process's is %lld (the dumped one's %lld)",
	      FD_STAT, stat_field(got, 22), stat_field(want, 22), start_before);
	same_inode(FD_STAT, "/proc/self/stat");

	CHECK(read_fd(FD_MAPS, got) > 0, "reading fd %d: %s", FD_MAPS, strerror(errno));
	CHECK(read_path("/proc/self/maps", want) > 0, "reading /proc/self/maps");
	CHECK(strcmp(got, want) == 0, "fd %d reads other maps than /proc/self/maps", FD_MAPS);
	same_inode(FD_MAPS, "/proc/self/maps");

	CHECK(read_fd(FD_CHILD_MAPS, got) > 0, "reading fd %d: %s", FD_CHILD_MAPS,
	      strerror(errno));
	CHECK(read_path(child_maps, want) > 0, "reading %s", child_maps);
	CHECK(strcmp(got, want) == 0, "fd %d reads other maps than %s", FD_CHILD_MAPS,
	      child_maps);
	same_inode(FD_CHILD_MAPS, child_maps);

	same_inode(FD_NET, "/proc/self/ns/net");

	same_inode(FD_SELF_DIR, "/proc/self");
	CHECK(read_path("/proc/self/stat", want) > 0, "reading /proc/self/stat");
	int st_fd = openat(FD_SELF_DIR, "stat", O_RDONLY | O_CLOEXEC);
	CHECK(st_fd >= 0 && read_fd(st_fd, got) > 0 && atoi(got) == getpid() &&
		      stat_field(got, 22) == stat_field(want, 22),
	      "stat under fd %d is not the restored process's", FD_SELF_DIR);
	if (st_fd >= 0)
		close(st_fd);
	same_inode(FD_FD_DIR, "/proc/self/fd");
	struct stat fd_st;
	CHECK(fstatat(FD_FD_DIR, "26", &fd_st, AT_SYMLINK_NOFOLLOW) == 0,
	      "fd %d does not list fd 26 of the restored process", FD_FD_DIR);

	close(hold[1]);
	victim_check_child(child, "the child whose maps are open");
	victim_finish();
}

static void gone(void)
{
	int hold[2];
	pid_t child = waiting_child(hold);
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/stat", child);
	open_proc(path, FD_GONE_STAT);
	close(hold[1]);
	victim_check_child(child, "the child");

	victim_ready_and_wait(NULL);

	char buf[64];
	CHECK(read(FD_GONE_STAT, buf, sizeof(buf)) < 0 && errno == ESRCH,
	      "fd %d of a reaped process's stat reads (%s)", FD_GONE_STAT, strerror(errno));
	victim_finish();
}

static void outside(void)
{
	open_proc("/proc/1/stat", FD_GONE_STAT);
	victim_ready_and_wait(NULL);
	char buf[64] = { 0 };
	CHECK(read(FD_GONE_STAT, buf, sizeof(buf) - 1) > 0 && atoi(buf) == 1,
	      "fd %d does not read pid 1's stat", FD_GONE_STAT);
	victim_finish();
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	const char *mode = argc > 2 ? argv[2] : "";
	if (strcmp(mode, "own") == 0)
		own();
	if (strcmp(mode, "gone") == 0)
		gone();
	if (strcmp(mode, "outside") == 0)
		outside();
	die("unknown mode");
}
