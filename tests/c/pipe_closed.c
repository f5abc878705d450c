/*
 * Pipes whose other end is closed everywhere, as make's jobserver pipe
 * once its writer exited or a child's stdin after its parent closed its
 * end. Before the dump:
 *   - DRAINING: a pipe holding "hello" whose write end every process closed;
 *   - STDIN: the same kind of pipe on fd 0, holding "in";
 *   - BROKEN: a pipe whose read end every process closed (SIGPIPE ignored).
 * After go: DRAINING reads "hello" then EOF; fd 0 reads "in" then EOF;
 * writing BROKEN fails with EPIPE.
 */
#include "victim.h"

#include <errno.h>
#include <signal.h>

#define DRAINING_FD 20
#define BROKEN_FD 21

/* A pipe holding `text` whose write end is closed; its read end at `at`. */
static void draining(const char *text, int at)
{
	int p[2];
	if (pipe(p) < 0)
		die("pipe");
	victim_write_all(p[1], text, strlen(text));
	close(p[1]);
	victim_fd_at(p[0], at);
}

/* Reads all of fd until EOF; checks it was `want`. */
static void drain(int fd, const char *want, const char *what)
{
	char buf[64] = { 0 };
	size_t got = 0;
	for (;;) {
		ssize_t n = read(fd, buf + got, sizeof buf - 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		CHECK(n >= 0, "%s: read: %s", what, strerror(errno));
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	CHECK(strcmp(buf, want) == 0, "%s: read %s, want %s then EOF", what, buf, want);
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	signal(SIGPIPE, SIG_IGN);
	draining("hello", DRAINING_FD);
	draining("in", 0);
	int p[2];
	if (pipe(p) < 0)
		die("pipe");
	close(p[0]);
	victim_fd_at(p[1], BROKEN_FD);

	victim_ready_and_wait(NULL);

	drain(DRAINING_FD, "hello", "draining pipe");
	drain(0, "in", "stdin pipe");
	ssize_t n = write(BROKEN_FD, "x", 1);
	CHECK(n < 0 && errno == EPIPE, "write to a pipe without reader: %zd (%s)", n,
	      strerror(errno));
	victim_finish();
}
