/*
 * FIFO victim: the root makes WORKDIR/fifo, forks a reader, and writes
 * numbered lines into the FIFO faster than the reader takes them, so data
 * sits in the FIFO at dump time. The reader's end is non-blocking, the
 * writer's blocking, the capacity is set to FIFO_CAPACITY. After go the
 * root checks its end and closes it; the reader must have read every line,
 * in order, up to EOF, and finds its own end as it was.
 */
#include "victim.h"

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

int main(int argc, char **argv)
{
	unsigned long n = 0;
	char line[32];

	victim_init(argc, argv);
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
