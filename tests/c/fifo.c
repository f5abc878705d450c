/*
 * FIFO victim: the root makes WORKDIR/fifo, forks a reader, and writes
 * numbered lines into the FIFO faster than the reader takes them, so data
 * sits in the FIFO at dump time. The reader's end is non-blocking, the
 * writer's blocking, the capacity is set to FIFO_CAPACITY. After go the
 * root checks its end and closes it; the reader must have read every line,
 * in order, up to EOF, and finds its own end as it was.
 * `fifo WORKDIR ghost`: see ghost() (a FIFO unlinked while open).
 */
#include "victim.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* Not the default (16 pages), so a restore that forgot it shows. */
#define FIFO_CAPACITY (4 * 4096)
/* Bytes the reader takes per read, and how many ticks it lets pass. */
#define READ_CHUNK 4
#define READ_EVERY 3

/* Exit codes of the reader, one per check. */
enum {
	READER_READ_ERROR = 80,
	READER_OUT_OF_ORDER,
	READER_TIMED_OUT,
	READER_TOO_FEW,
	READER_BAD_FLAGS,
	READER_BAD_CAPACITY,
	READER_NOT_THE_FIFO,
};

static char fifo_path[PATH_MAX];

static int same_fifo(int fd)
{
	struct stat a, b;

	return fstat(fd, &a) == 0 && stat(fifo_path, &b) == 0 &&
	       S_ISFIFO(a.st_mode) && a.st_ino == b.st_ino &&
	       a.st_dev == b.st_dev;
}

static void reader(void)
{
	char buf[4096];
	size_t have = 0;
	unsigned long want = 0, ticks = 0;
	/* Blocks until the writer opens its end. */
	int fd = open(fifo_path, O_RDONLY | O_CLOEXEC);

	if (fd < 0 || fcntl(fd, F_SETFL, O_NONBLOCK) < 0)
		_exit(READER_READ_ERROR);
	for (;;) {
		if (ticks++ % READ_EVERY == 0) {
			ssize_t n = read(fd, buf + have, READ_CHUNK);
			if (n == 0)
				break;
			if (n < 0 && errno != EINTR && errno != EAGAIN)
				_exit(READER_READ_ERROR);
			have += n > 0 ? (size_t)n : 0;
			char *nl;
			while ((nl = memchr(buf, '\n', have))) {
				*nl = 0;
				if (strtoul(buf, NULL, 10) != want)
					_exit(READER_OUT_OF_ORDER);
				want++;
				size_t used = (size_t)(nl - buf) + 1;
				memmove(buf, nl + 1, have - used);
				have -= used;
			}
		}
		victim_tick();
		if (victim_timespec_passed(&victim_deadline))
			_exit(READER_TIMED_OUT);
	}
	int fl = fcntl(fd, F_GETFL);
	if ((fl & O_ACCMODE) != O_RDONLY || !(fl & O_NONBLOCK))
		_exit(READER_BAD_FLAGS);
	if (fcntl(fd, F_GETPIPE_SZ) != FIFO_CAPACITY)
		_exit(READER_BAD_CAPACITY);
	if (!same_fifo(fd))
		_exit(READER_NOT_THE_FIFO);
	_exit(want > 30 ? 0 : READER_TOO_FEW);
}

/* Waits for go (the child of `ghost`), exiting 90 past the deadline. */
static void child_wait_go(void)
{
	while (!victim_file_exists("go")) {
		victim_tick();
		if (victim_timespec_passed(&victim_deadline))
			_exit(90);
	}
}

/* Reads exactly `want` from `fd`, waiting for it (non-blocking fd). */
static int read_exactly(int fd, const char *want)
{
	char buf[64];
	size_t len = strlen(want), got = 0;
	for (int i = 0; i < 500 && got < len; i++) {
		ssize_t n = read(fd, buf + got, len - got);
		if (n > 0)
			got += (size_t)n;
		else if (n < 0 && errno != EAGAIN)
			return 0;
		else
			usleep(10000);
	}
	return got == len && memcmp(buf, want, len) == 0;
}

/* No file is left in WORKDIR whose name starts with `prefix`. */
static int no_leftover(const char *prefix)
{
	char dir[PATH_MAX];
	victim_path(dir, sizeof(dir), "");
	DIR *d = opendir(dir);
	if (!d)
		return 0;
	struct dirent *e;
	int clean = 1;
	while ((e = readdir(d)))
		clean &= strncmp(e->d_name, prefix, strlen(prefix)) != 0;
	closedir(d);
	return clean;
}

/* `fifo WORKDIR ghost`: a FIFO the root holds O_RDWR and O_RDONLY and its
 * child O_WRONLY, unlinked while open with "buffered" in it; and a linked
 * FIFO held only O_RDWR with "kept" in it. After go the
 * path is still gone and nothing was left in the directory; each end has
 * its access mode, the root's two are one FIFO (mode 0640, no link), the
 * root reads "buffered", then what the child and its own O_RDWR end write. */
static void ghost(void)
{
	victim_path(fifo_path, sizeof(fifo_path), "ghost.fifo");
	if (mkfifo(fifo_path, 0640))
		die("mkfifo");
	int rw = open(fifo_path, O_RDWR | O_CLOEXEC);
	int rd = open(fifo_path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (rw < 0 || rd < 0)
		die("open ghost fifo");
	/* A FIFO still linked, held only O_RDWR, with data in it. */
	char linked_path[PATH_MAX];
	victim_path(linked_path, sizeof(linked_path), "linked.fifo");
	int both = -1;
	if (mkfifo(linked_path, 0600) || (both = open(linked_path, O_RDWR | O_NONBLOCK | O_CLOEXEC)) < 0 ||
	    write(both, "kept", 4) != 4)
		die("linked fifo");
	int sync[2];
	if (pipe(sync))
		die("pipe");
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		int wr = open(fifo_path, O_WRONLY | O_CLOEXEC);
		if (wr < 0 || write(wr, "buffered", 8) != 8 || write(sync[1], "x", 1) != 1)
			_exit(81);
		child_wait_go();
		struct stat st;
		int fl = fcntl(wr, F_GETFL);
		if ((fl & O_ACCMODE) != O_WRONLY || fstat(wr, &st) || !S_ISFIFO(st.st_mode) || st.st_nlink != 0)
			_exit(82);
		if (write(wr, "from-child", 10) != 10)
			_exit(83);
		_exit(0);
	}
	char c;
	if (read(sync[0], &c, 1) != 1 || unlink(fifo_path))
		die("ghost fifo setup");

	victim_ready_and_wait(NULL);

	struct stat a, b, gone;
	CHECK(lstat(fifo_path, &gone) != 0 && errno == ENOENT, "the unlinked FIFO's path exists again");
	CHECK(no_leftover(".ckpt-fifo-"), "a temporary FIFO name was left in the directory");
	CHECK(fstat(rw, &a) == 0 && fstat(rd, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev,
	      "the O_RDWR and O_RDONLY ends are no longer one FIFO");
	CHECK(S_ISFIFO(a.st_mode) && (a.st_mode & 07777) == 0640 && a.st_nlink == 0,
	      "the FIFO's type, mode %o or links %lu", a.st_mode & 07777, (unsigned long)a.st_nlink);
	CHECK((fcntl(rw, F_GETFL) & O_ACCMODE) == O_RDWR, "the O_RDWR end's access mode");
	CHECK((fcntl(rd, F_GETFL) & O_ACCMODE) == O_RDONLY, "the O_RDONLY end's access mode");
	CHECK(read_exactly(rd, "buffered"), "the data buffered in the unlinked FIFO");
	victim_check_child(child, "the writer child");
	CHECK(read_exactly(rd, "from-child"), "what the child wrote after restore");
	CHECK(write(rw, "self", 4) == 4 && read_exactly(rd, "self"), "the O_RDWR end writing to the reader");
	struct stat l;
	CHECK(fstat(both, &a) == 0 && stat(linked_path, &l) == 0 && a.st_ino == l.st_ino &&
	      (fcntl(both, F_GETFL) & O_ACCMODE) == O_RDWR,
	      "the linked FIFO's O_RDWR end is not the FIFO at its path, or not O_RDWR");
	CHECK(read_exactly(both, "kept"), "the data in the linked FIFO held O_RDWR");
	victim_finish();
}

int main(int argc, char **argv)
{
	unsigned long n = 0;
	char line[32];

	victim_init(argc, argv);
	if (argc > 2 && strcmp(argv[2], "ghost") == 0)
		ghost();
	victim_path(fifo_path, sizeof(fifo_path), "fifo");
	if (mkfifo(fifo_path, 0640))
		die("mkfifo");
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0)
		reader();
	/* Blocks until the reader opens its end. */
	int fd = open(fifo_path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		die("open fifo");
	if (fcntl(fd, F_SETPIPE_SZ, FIFO_CAPACITY) != FIFO_CAPACITY)
		die("F_SETPIPE_SZ");
	for (;;) {
		int len = snprintf(line, sizeof(line), "%06lu\n", n++);
		victim_write_all(fd, line, (size_t)len);
		if (n == 30)
			victim_signal_ready(NULL);
		if (n > 30 && victim_file_exists("go"))
			break;
		victim_poll_ping();
		victim_tick();
		if (victim_timespec_passed(&victim_deadline)) {
			fail("timed out waiting for go");
			victim_finish();
		}
	}
	int fl = fcntl(fd, F_GETFL);
	CHECK((fl & O_ACCMODE) == O_WRONLY && !(fl & O_NONBLOCK),
	      "writer's flags %#x, want O_WRONLY, blocking", fl);
	CHECK(fcntl(fd, F_GETPIPE_SZ) == FIFO_CAPACITY, "capacity %d, want %d",
	      fcntl(fd, F_GETPIPE_SZ), FIFO_CAPACITY);
	CHECK(same_fifo(fd), "writer's fd is not the FIFO at %s", fifo_path);
	close(fd);
	int st;
	CHECK(waitpid(child, &st, 0) == child, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "reader lost, reordered or found its end changed (status %#x)",
	      st);
	victim_finish();
}
