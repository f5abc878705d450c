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
 * "traced" mode: child X is ptrace-attached by its sibling Y
 * ("stp-tracer"), a stand-in for a debugger. Ready content: "X Y". The
 * dump must be refused; after go Y detaches and both exit 0.
 */
#include "victim.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>

#define A_CODE 41
#define B_CODE 42
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
	stopped_mode();
	return 0;
}
