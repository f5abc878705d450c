/*
 * Pipe victim: the root writes numbered lines into a pipe faster than its
 * child reads them, so data sits in the pipe at dump time. After go the
 * root closes its end; the child must have read every line, in order, up
 * to EOF, and the root reaps it.
 */
#include "victim.h"

#include <sys/wait.h>

static void reader(int fd)
{
	char buf[4096];
	size_t have = 0;
	unsigned long want = 0, ticks = 0;

	for (;;) {
		/* Read at a third of the writer's pace. */
		if (ticks++ % 3 == 0) {
			ssize_t n = read(fd, buf + have, 64);
			if (n == 0)
				break;
			if (n < 0) {
				if (errno == EINTR)
					continue;
				_exit(80);
			}
			have += (size_t)n;
			char *nl;
			while ((nl = memchr(buf, '\n', have))) {
				*nl = 0;
				if (strtoul(buf, NULL, 10) != want)
					_exit(81);
				want++;
				size_t used = (size_t)(nl - buf) + 1;
				memmove(buf, nl + 1, have - used);
				have -= used;
			}
		}
		victim_tick();
		if (victim_timespec_passed(&victim_deadline))
			_exit(82);
	}
	/* The last line the writer sent is its count. */
	_exit(want > 10 ? 0 : 83);
}

int main(int argc, char **argv)
{
	int p[2];
	unsigned long n = 0;
	char line[32];

	victim_init(argc, argv);
	if (pipe2(p, O_CLOEXEC))
		die("pipe2");
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		close(p[1]);
		reader(p[0]);
	}
	close(p[0]);
	for (;;) {
		int len = snprintf(line, sizeof(line), "%lu\n", n++);
		victim_write_all(p[1], line, (size_t)len);
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
	close(p[1]);
	int st;
	CHECK(waitpid(child, &st, 0) == child, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "reader lost or reordered pipe data (status %#x)", st);
	victim_finish();
}
