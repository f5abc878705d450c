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
	_exit(victim_fd_is_anon(s, "signalfd") && victim_fdinfo_has(s, S_MASK_LINE) ? 0 : 91);
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

	victim_check_child(kid, "child");

	CHECK(victim_fd_is_anon(s, "signalfd") && victim_fd_is_anon(DUP_FD, "signalfd") && victim_fd_is_anon(t, "signalfd"), "not signalfds any more");
	CHECK(fcntl(s, F_GETFD) == FD_CLOEXEC, "fd %d lost FD_CLOEXEC", s);
	CHECK(fcntl(DUP_FD, F_GETFD) == 0, "fd %d gained FD_CLOEXEC", DUP_FD);
	CHECK(fcntl(s, F_GETFL) & O_NONBLOCK, "S lost O_NONBLOCK");
	CHECK(!(fcntl(t, F_GETFL) & O_NONBLOCK), "T gained O_NONBLOCK");
	CHECK(victim_fdinfo_has(s, S_MASK_LINE), "S's mask is not SIGUSR1 only");
	CHECK(victim_fdinfo_has(DUP_FD, S_MASK_LINE), "S's dup's mask is not SIGUSR1 only");
	CHECK(victim_fdinfo_has(t, T_MASK_LINE), "T's mask is not SIGUSR2 only");

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
