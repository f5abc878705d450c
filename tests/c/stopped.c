/*
 * Job-control-stopped children (state T).
 *
 * Default mode: child A leads its own process group, runs a second thread
 * and stops itself with SIGTSTP (the parent collects that stop with
 * waitpid(WUNTRACED)); child B stops itself with SIGSTOP (its stop is left
 * unreported to the parent). Ready content: "A B". After go the parent
 * checks both are still stopped (state T, from /proc), that B's stop is
 * reported by waitpid(WUNTRACED) with SIGSTOP (and A's, if reported again,
 * with SIGTSTP), then sends SIGCONT: waitpid(WCONTINUED) sees both
 * continue, and each exits with its own code once it checked from inside
 * that its memory (and A its thread) came through.
 *
 * "pending" mode: child C runs a second thread, blocks SIGUSR2 and
 * stops itself with SIGSTOP; the parent then sends it SIGUSR1 (handled,
 * to the process) and SIGUSR2 (blocked, to its main thread), which stay
 * pending while it is stopped, as does a second SIGSTOP. Ready content: "C". After go the parent
 * checks C is stopped with both still pending (from /proc), then sends
 * SIGCONT: C's handler runs exactly once, SIGUSR2 is still pending to it,
 * its thread runs on, and it exits with C_CODE.
 *
 * "traced" mode: child X is ptrace-attached by its sibling Y
 * ("stp-tracer"), a stand-in for a debugger. Ready content: "X Y". The
 * dump must be refused; after go Y detaches and both exit 0.
 */
#include "victim.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>

#define A_CODE 41
#define B_CODE 42
#define C_CODE 43
#define MAGIC 0x5eed1234u

static volatile unsigned long spins;
static volatile unsigned magic;

static void *spinner(void *arg)
{
	(void)arg;
	for (;;) {
		spins++;
		victim_tick();
	}
	return NULL;
}

static char state_of(pid_t pid)
{
	return proc_state(pid);
}

static int tracer_of(pid_t pid)
{
	char path[64], buf[2048];
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	char *p = strstr(buf, "TracerPid:");
	return p ? atoi(p + 10) : -1;
}

static void child_a(void)
{
	pthread_t th;
	if (setpgid(0, 0))
		_exit(10);
	if (pthread_create(&th, NULL, spinner, NULL))
		_exit(11);
	magic = MAGIC;
	raise(SIGTSTP);
	/* Continued: the memory and the other thread came through. */
	unsigned long before = spins;
	for (int i = 0; i < 200 && spins == before; i++)
		victim_tick();
	if (spins == before)
		_exit(12);
	_exit(magic == MAGIC ? A_CODE : 13);
}

static void child_b(void)
{
	magic = MAGIC ^ 1;
	raise(SIGSTOP);
	_exit(magic == (MAGIC ^ 1) ? B_CODE : 14);
}

static volatile sig_atomic_t usr1_taken;

static void on_usr1(int sig)
{
	(void)sig;
	usr1_taken++;
}

static void child_c(void)
{
	pthread_t th;
	sigset_t usr2;
	struct sigaction sa = { .sa_handler = on_usr1 };
	sigemptyset(&usr2);
	sigaddset(&usr2, SIGUSR2);
	if (sigaction(SIGUSR1, &sa, NULL))
		_exit(30);
	/* The spinner takes no signal: SIGUSR1 is the main thread's to take. */
	sigset_t both = usr2;
	sigaddset(&both, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &both, NULL);
	if (pthread_create(&th, NULL, spinner, NULL))
		_exit(31);
	pthread_sigmask(SIG_SETMASK, &usr2, NULL);
	magic = MAGIC ^ 2;
	raise(SIGSTOP);
	/* Continued: SIGUSR1 was handled on the way out of the stop. */
	if (usr1_taken != 1)
		_exit(32);
	sigset_t pending;
	if (sigpending(&pending) || !sigismember(&pending, SIGUSR2) ||
	    sigismember(&pending, SIGUSR1))
		_exit(33);
	unsigned long before = spins;
	for (int i = 0; i < 200 && spins == before; i++)
		victim_tick();
	if (spins == before)
		_exit(34);
	_exit(magic == (MAGIC ^ 2) ? C_CODE : 35);
}

/* Whether bit `sig` is set in the hex mask `field` of /proc/PID/status. */
static int status_mask_has(pid_t pid, const char *field, int sig)
{
	char path[64], buf[4096], key[32];
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	if (!read_small_file(path, buf, sizeof(buf)))
		return 0;
	snprintf(key, sizeof(key), "\n%s:", field);
	char *p = strstr(buf, key);
	if (!p)
		return 0;
	unsigned long long mask = strtoull(p + strlen(key), NULL, 16);
	return (mask >> (sig - 1)) & 1;
}

static void wait_state(pid_t pid, char want)
{
	while (state_of(pid) != want) {
		if (victim_timespec_passed(&victim_deadline))
			die("child never reached its state");
		victim_tick();
	}
}

static void check_continues(pid_t pid, int code, const char *name)
{
	int st;
	CHECK(kill(pid, SIGCONT) == 0, "SIGCONT %s: %s", name, strerror(errno));
	CHECK(waitpid(pid, &st, WCONTINUED) == pid && WIFCONTINUED(st),
	      "%s: waitpid(WCONTINUED) status %#x (%s)", name, st, strerror(errno));
	CHECK(waitpid(pid, &st, 0) == pid, "%s: waitpid: %s", name, strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == code,
	      "%s: after SIGCONT status %#x, want exit %d", name, st, code);
}

static void stopped_mode(void)
{
	int st;
	pid_t a = fork();
	if (a < 0)
		die("fork");
	if (a == 0)
		child_a();
	pid_t b = fork();
	if (b < 0)
		die("fork");
	if (b == 0)
		child_b();
	if (waitpid(a, &st, WUNTRACED) != a || !WIFSTOPPED(st) || WSTOPSIG(st) != SIGTSTP)
		die("child A did not stop with SIGTSTP");
	wait_state(b, 'T');

	char ready[64];
	snprintf(ready, sizeof(ready), "%d %d", a, b);
	victim_ready_and_wait(ready);

	CHECK(state_of(a) == 'T', "A is in state %c, not T (stopped)", state_of(a));
	CHECK(state_of(b) == 'T', "B is in state %c, not T (stopped)", state_of(b));
	CHECK(getpgid(a) == a, "A's group is %d, not its own", getpgid(a));
	CHECK(getpgid(b) == getpgid(0), "B left its parent's group");
	/* B's stop was never collected: the parent must be able to. */
	pid_t got = waitpid(b, &st, WUNTRACED | WNOHANG);
	CHECK(got == b && WIFSTOPPED(st) && WSTOPSIG(st) == SIGSTOP,
	      "B: waitpid(WUNTRACED) gave %d status %#x, want stopped by SIGSTOP", got, st);
	got = waitpid(a, &st, WUNTRACED | WNOHANG);
	CHECK(got == 0 || (got == a && WIFSTOPPED(st) && WSTOPSIG(st) == SIGTSTP),
	      "A: waitpid(WUNTRACED) gave %d status %#x", got, st);
	/* Still stopped a while later: nothing continued them behind our back. */
	for (int i = 0; i < 10; i++)
		victim_tick();
	CHECK(state_of(a) == 'T' && state_of(b) == 'T', "a child ran without SIGCONT");
	check_continues(a, A_CODE, "A");
	check_continues(b, B_CODE, "B");
	victim_finish();
}

static void pending_mode(void)
{
	pid_t c = fork();
	if (c < 0)
		die("fork");
	if (c == 0)
		child_c();
	wait_state(c, 'T');
	CHECK(kill(c, SIGUSR1) == 0, "SIGUSR1 to C: %s", strerror(errno));
	CHECK(syscall(SYS_tgkill, c, c, SIGUSR2) == 0, "SIGUSR2 to C: %s", strerror(errno));
	/* A second stop while stopped stays pending too, until SIGCONT drops it. */
	CHECK(kill(c, SIGSTOP) == 0, "SIGSTOP to C: %s", strerror(errno));
	while (!status_mask_has(c, "ShdPnd", SIGUSR1) || !status_mask_has(c, "SigPnd", SIGUSR2) ||
	       !status_mask_has(c, "ShdPnd", SIGSTOP)) {
		if (victim_timespec_passed(&victim_deadline))
			die("signals never pending to C");
		victim_tick();
	}

	char ready[64];
	snprintf(ready, sizeof(ready), "%d", c);
	victim_ready_and_wait(ready);

	CHECK(state_of(c) == 'T', "C is in state %c, not T (stopped)", state_of(c));
	CHECK(status_mask_has(c, "ShdPnd", SIGUSR1), "C lost its pending SIGUSR1");
	CHECK(status_mask_has(c, "SigPnd", SIGUSR2), "C lost its thread's pending SIGUSR2");
	for (int i = 0; i < 10; i++)
		victim_tick();
	CHECK(state_of(c) == 'T', "C ran without SIGCONT");
	check_continues(c, C_CODE, "C");
	victim_finish();
}

static void traced_mode(void)
{
	int st;
	pid_t x = fork();
	if (x < 0)
		die("fork");
	if (x == 0) {
		victim_child_wait_go(20);
		_exit(0);
	}
	pid_t y = fork();
	if (y < 0)
		die("fork");
	if (y == 0) {
		prctl(PR_SET_NAME, "stp-tracer", 0, 0, 0);
		if (ptrace(PTRACE_ATTACH, x, 0, 0))
			_exit(21);
		if (waitpid(x, &st, __WALL) != x)
			_exit(22);
		victim_child_wait_go(23);
		if (ptrace(PTRACE_DETACH, x, 0, 0))
			_exit(24);
		_exit(0);
	}
	while (tracer_of(x) != y) {
		if (victim_timespec_passed(&victim_deadline))
			die("tracer never attached");
		victim_tick();
	}
	char ready[64];
	snprintf(ready, sizeof(ready), "%d %d", x, y);
	victim_ready_and_wait(ready);
	CHECK(waitpid(y, &st, 0) == y && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "tracer: status %#x", st);
	CHECK(waitpid(x, &st, 0) == x && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "traced child: status %#x", st);
	victim_finish();
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	if (argc > 2 && strcmp(argv[2], "traced") == 0)
		traced_mode();
	if (argc > 2 && strcmp(argv[2], "pending") == 0)
		pending_mode();
	stopped_mode();
	return 0;
}
