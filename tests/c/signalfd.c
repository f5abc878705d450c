/*
 * signalfd victim. Before the dump: SIGUSR1 and SIGUSR2 blocked;
 * S = signalfd(SIGUSR1, NONBLOCK|CLOEXEC), fd 20 = dup(S) without CLOEXEC;
 * T = signalfd(SIGUSR2) blocking; a child inherits both.
 * After go (the harness sends SIGUSR1 to the restored parent first) the
 * child checks its copy of S's mask and exits; the parent checks types, fd
 * and status flags, both masks in fdinfo, that S delivers exactly the
 * SIGUSR1 the harness sent (and then EAGAIN: non-blocking kept), and that T
 * has nothing (its mask was not widened).
 */
#include "victim.h"

#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/wait.h>

#define DUP_FD 20
/* How long the harness's SIGUSR1 may take to show up. */
#define SIGNAL_WAIT_MS 5000
/* fdinfo's sigmask lines: bit N-1 for signal N. */
#define S_MASK_LINE "sigmask:\t0000000000000200\n"
#define T_MASK_LINE "sigmask:\t0000000000000800\n"

static int is_signalfd(int fd)
{
	char link[64], path[64];
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(path, link, sizeof(link) - 1);
	if (n < 0)
		return 0;
	link[n] = 0;
	return strcmp(link, "anon_inode:[signalfd]") == 0;
}

static int fdinfo_has(int fd, const char *line)
{
	char path[64], buf[1024];
	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	if (read_small_file(path, buf, sizeof(buf)) == (size_t)-1)
		return 0;
	return strstr(buf, line) != NULL;
}

static int signalfd_of(int sig, int flags)
{
	sigset_t m;
	sigemptyset(&m);
	sigaddset(&m, sig);
	int fd = signalfd(-1, &m, flags);
	if (fd < 0)
		die("signalfd");
	return fd;
}

static void child(int s)
{
	while (!victim_file_exists("go")) {
		victim_tick();
		if (victim_timespec_passed(&victim_deadline))
			_exit(90);
	}
	_exit(is_signalfd(s) && fdinfo_has(s, S_MASK_LINE) ? 0 : 91);
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	sigset_t block;
	sigemptyset(&block);
	sigaddset(&block, SIGUSR1);
	sigaddset(&block, SIGUSR2);
	if (sigprocmask(SIG_BLOCK, &block, NULL) != 0)
		die("sigprocmask");
	int s = signalfd_of(SIGUSR1, SFD_NONBLOCK | SFD_CLOEXEC);
	if (dup2(s, DUP_FD) != DUP_FD)
		die("dup2");
	int t = signalfd_of(SIGUSR2, 0);
	pid_t kid = fork();
	if (kid < 0)
		die("fork");
	if (kid == 0)
		child(s);

	victim_ready_and_wait(NULL);

	int st;
	CHECK(waitpid(kid, &st, 0) == kid, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed: status %#x", st);

	CHECK(is_signalfd(s) && is_signalfd(DUP_FD) && is_signalfd(t), "not signalfds any more");
	CHECK(fcntl(s, F_GETFD) == FD_CLOEXEC, "fd %d lost FD_CLOEXEC", s);
	CHECK(fcntl(DUP_FD, F_GETFD) == 0, "fd %d gained FD_CLOEXEC", DUP_FD);
	CHECK(fcntl(s, F_GETFL) & O_NONBLOCK, "S lost O_NONBLOCK");
	CHECK(!(fcntl(t, F_GETFL) & O_NONBLOCK), "T gained O_NONBLOCK");
	CHECK(fdinfo_has(s, S_MASK_LINE), "S's mask is not SIGUSR1 only");
	CHECK(fdinfo_has(DUP_FD, S_MASK_LINE), "S's dup's mask is not SIGUSR1 only");
	CHECK(fdinfo_has(t, T_MASK_LINE), "T's mask is not SIGUSR2 only");

	struct pollfd p = { DUP_FD, POLLIN, 0 };
	int n;
	do
		n = poll(&p, 1, SIGNAL_WAIT_MS);
	while (n < 0 && errno == EINTR);
	CHECK(n == 1, "no SIGUSR1 on S within %d ms", SIGNAL_WAIT_MS);
	struct signalfd_siginfo si;
	CHECK(read(s, &si, sizeof(si)) == sizeof(si), "read S: %s", strerror(errno));
	CHECK(si.ssi_signo == SIGUSR1, "S gave signal %u, want SIGUSR1", si.ssi_signo);
	CHECK(read(s, &si, sizeof(si)) < 0 && errno == EAGAIN,
	      "S not empty after one SIGUSR1 (or lost non-blocking): %s", strerror(errno));
	p.fd = t;
	CHECK(poll(&p, 1, 0) == 0, "T reports a signal: its mask widened");
	victim_finish();
}
