/*
 * Process-tree victim: the root forks A and B, A forks C. All four write
 * lines to one log file through a descriptor opened once before the forks
 * (one shared offset, no O_APPEND), each keeps its own 1 MiB memory pattern,
 * and children check their parent is still their parent. After go, children
 * report how many lines they wrote and exit; the root reaps them (which
 * needs the parent/child links restored), then checks every line is in the
 * log (a split offset would overwrite some).
 */
#include "victim.h"

#include <sys/wait.h>

static int logfd;

static unsigned long tick_loop(char who, const char *mem)
{
	unsigned long n = 0;
	char line[32];

	while (!victim_file_exists("go")) {
		int len = snprintf(line, sizeof(line), "%c tick %lu\n", who, n);
		victim_write_all(logfd, line, (size_t)len);
		n++;
		if (who == 'R')
			victim_poll_ping();
		victim_tick();
		if (victim_timespec_passed(&victim_deadline))
			_exit(90);
	}
	for (size_t i = 0; i < (1u << 20); i += 512)
		if (mem[i] != who)
			_exit(91);
	return n;
}

static void child(char who, pid_t parent, pid_t grandchild)
{
	char *mem = malloc(1u << 20);
	char line[32];
	int st = 0;

	memset(mem, who, 1u << 20);
	unsigned long n = tick_loop(who, mem);
	if (getppid() != parent)
		_exit(92);
	int len = snprintf(line, sizeof(line), "%c done %lu\n", who, n);
	victim_write_all(logfd, line, (size_t)len);
	if (grandchild > 0) {
		if (waitpid(grandchild, &st, 0) != grandchild)
			_exit(93);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			_exit(94);
	}
	_exit(0);
}

static unsigned long count_lines(const char *buf, char who, const char *what)
{
	unsigned long n = 0;
	char pat[16];

	snprintf(pat, sizeof(pat), "%c %s", who, what);
	for (const char *p = buf; (p = strstr(p, pat)); p++)
		if (p == buf || p[-1] == '\n')
			n++;
	return n;
}

int main(int argc, char **argv)
{
	char path[PATH_MAX];
	pid_t root = getpid(), a, b;

	victim_init(argc, argv);
	victim_path(path, sizeof(path), "tree.log");
	logfd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (logfd < 0)
		die("open tree.log");

	/* A says when C exists: "ready" must find the whole tree. */
	int forked[2];
	char token;

	if (pipe2(forked, O_CLOEXEC))
		die("pipe2");
	a = fork();
	if (a == 0) {
		pid_t me = getpid();
		pid_t c = fork();
		if (c == 0) {
			close(forked[0]);
			close(forked[1]);
			child('C', me, 0);
		}
		close(forked[0]);
		if (write(forked[1], "c", 1) != 1)
			_exit(3);
		close(forked[1]);
		child('A', root, c);
	}
	close(forked[1]);
	if (read(forked[0], &token, 1) != 1)
		die("read (A forked C)");
	close(forked[0]);
	b = fork();
	if (b == 0)
		child('B', root, 0);

	char *mem = malloc(1u << 20);
	memset(mem, 'R', 1u << 20);
	victim_signal_ready(NULL);
	unsigned long rn = tick_loop('R', mem);

	int st;
	CHECK(waitpid(a, &st, 0) == a, "waitpid A: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "A (and C) failed: status %#x", st);
	CHECK(waitpid(b, &st, 0) == b, "waitpid B: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "B failed: status %#x", st);

	static char buf[1 << 20];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t got = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
	CHECK(got > 0, "cannot read tree.log");
	buf[got > 0 ? got : 0] = 0;
	for (const char *w = "ABC"; *w; w++) {
		char pat[16];
		snprintf(pat, sizeof(pat), "%c done ", *w);
		const char *d = strstr(buf, pat);
		CHECK(d != NULL, "%c wrote no done line", *w);
		if (d) {
			unsigned long want = strtoul(d + strlen(pat), NULL, 10);
			unsigned long have = count_lines(buf, *w, "tick");
			CHECK(have == want, "%c: %lu tick lines in the log, wrote %lu", *w, have,
			      want);
		}
	}
	CHECK(count_lines(buf, 'R', "tick") == rn, "R: %lu tick lines, wrote %lu",
	      count_lines(buf, 'R', "tick"), rn);
	victim_finish();
}
