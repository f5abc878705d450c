/*
 * timerfd victim. Before the dump:
 *   - P = timerfd(MONOTONIC, NONBLOCK|CLOEXEC) armed relative for 1 s with a
 *     1 s interval, ~0.5 s before ready; fd 20 = dup(P) without CLOEXEC.
 *   - O = timerfd(BOOTTIME) one-shot, 2 s, armed just before ready.
 *   - R = timerfd(REALTIME, NONBLOCK) with an absolute deadline 6 s after
 *     setup, TFD_TIMER_ABSTIME|TFD_TIMER_CANCEL_ON_SET; the deadline goes to
 *     the ready file's neighbour "deadline" for the record.
 *   - X = timerfd(MONOTONIC, NONBLOCK) one-shot 1 ms, expired: 1 tick pending.
 *   - A child inherits all of them.
 * After go the child reads X (must get exactly 1 tick) and exits; the parent
 * checks: types, fd and status flags, clocks and settime flags (fdinfo);
 * X is then empty (shared across fork); R's deadline is the same point on
 * CLOCK_REALTIME (the harness waits between dump and restore, so a deadline
 * taken as relative would move); O is still armed and fires; P fires within
 * one period of go, then twice more one period apart (interval kept); R
 * fires, not before its deadline.
 */
#include "victim.h"

#include <poll.h>
#include <sys/timerfd.h>
#include <sys/wait.h>

#define DUP_FD 20
#define NSEC_PER_SEC 1000000000LL
#define PERIOD_NS NSEC_PER_SEC
#define ARMED_BEFORE_READY_NS (NSEC_PER_SEC / 2)
#define ONESHOT_NS (2 * NSEC_PER_SEC)
#define ABS_AHEAD_NS (6 * NSEC_PER_SEC)
#define EXPIRED_NS 1000000LL
/* How far a timer may be late (scheduling, a loaded test machine). */
#define SLACK_NS (NSEC_PER_SEC / 4)
/* How far R's deadline may drift (the dump reads fdinfo and the clock apart). */
#define DEADLINE_SLACK_NS (NSEC_PER_SEC / 10)

static int64_t now_ns(clockid_t c)
{
	struct timespec ts;
	clock_gettime(c, &ts);
	return (int64_t)ts.tv_sec * NSEC_PER_SEC + ts.tv_nsec;
}

static struct timespec ts_of(int64_t ns)
{
	struct timespec ts = { ns / NSEC_PER_SEC, ns % NSEC_PER_SEC };
	return ts;
}

static int64_t ns_of(struct timespec ts)
{
	return (int64_t)ts.tv_sec * NSEC_PER_SEC + ts.tv_nsec;
}

static void arm(int fd, int flags, int64_t value_ns, int64_t interval_ns)
{
	struct itimerspec its = { ts_of(interval_ns), ts_of(value_ns) };
	if (timerfd_settime(fd, flags, &its, NULL) != 0)
		die("timerfd_settime");
}

/* Waits up to timeout_ns for fd to expire; returns its ticks (0: timeout). */
static uint64_t wait_fire(int fd, int64_t timeout_ns)
{
	struct pollfd p = { fd, POLLIN, 0 };
	int64_t end = now_ns(CLOCK_MONOTONIC) + timeout_ns;
	for (;;) {
		int64_t left = end - now_ns(CLOCK_MONOTONIC);
		if (left < 0)
			left = 0;
		int n = poll(&p, 1, (int)(left / 1000000));
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return 0;
		uint64_t ticks = 0;
		if (read(fd, &ticks, sizeof(ticks)) != sizeof(ticks))
			return 0;
		return ticks;
	}
}

static void child(int x)
{
	while (!victim_file_exists("go")) {
		victim_tick();
		if (victim_timespec_passed(&victim_deadline))
			_exit(90);
	}
	uint64_t ticks = 0;
	if (read(x, &ticks, sizeof(ticks)) != sizeof(ticks))
		_exit(91);
	if (ticks != 1)
		_exit(92);
	_exit(0);
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	int p = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (p < 0)
		die("timerfd P");
	int64_t p_armed = now_ns(CLOCK_MONOTONIC);
	arm(p, 0, PERIOD_NS, PERIOD_NS);
	if (dup2(p, DUP_FD) != DUP_FD)
		die("dup2");
	int o = timerfd_create(CLOCK_BOOTTIME, 0);
	if (o < 0)
		die("timerfd O");
	int r = timerfd_create(CLOCK_REALTIME, TFD_NONBLOCK);
	if (r < 0)
		die("timerfd R");
	int64_t deadline = now_ns(CLOCK_REALTIME) + ABS_AHEAD_NS;
	arm(r, TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, deadline, 0);
	int x = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK);
	if (x < 0)
		die("timerfd X");
	arm(x, 0, EXPIRED_NS, 0);
	while (!victim_fdinfo_has(x, "ticks: 1"))
		victim_tick();

	pid_t kid = fork();
	if (kid < 0)
		die("fork");
	if (kid == 0)
		child(x);

	while (now_ns(CLOCK_MONOTONIC) - p_armed < ARMED_BEFORE_READY_NS)
		victim_tick();
	arm(o, 0, ONESHOT_NS, 0);
	victim_ready_and_wait(NULL);
	int64_t go = now_ns(CLOCK_MONOTONIC);

	/* R first: its deadline must not have moved. */
	struct itimerspec cur;
	CHECK(timerfd_gettime(r, &cur) == 0, "gettime R: %s", strerror(errno));
	int64_t r_deadline = now_ns(CLOCK_REALTIME) + ns_of(cur.it_value);
	CHECK(ns_of(cur.it_value) > 0, "R disarmed or expired early");
	CHECK(llabs(r_deadline - deadline) < DEADLINE_SLACK_NS,
	      "R deadline moved by %lld ns", (long long)(r_deadline - deadline));

	int st;
	CHECK(waitpid(kid, &st, 0) == kid, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "child failed: status %#x (92: X did not hold exactly 1 tick)", st);
	uint64_t ticks = 0;
	CHECK(read(x, &ticks, sizeof(ticks)) < 0 && errno == EAGAIN,
	      "X still has ticks after the child read it: not shared across fork");

	CHECK(victim_fd_is_anon(p, "timerfd") && victim_fd_is_anon(DUP_FD, "timerfd") && victim_fd_is_anon(o, "timerfd") && victim_fd_is_anon(r, "timerfd") &&
		      victim_fd_is_anon(x, "timerfd"),
	      "not timerfds any more");
	CHECK(fcntl(p, F_GETFD) == FD_CLOEXEC, "fd %d lost FD_CLOEXEC", p);
	CHECK(fcntl(DUP_FD, F_GETFD) == 0, "fd %d gained FD_CLOEXEC", DUP_FD);
	CHECK(fcntl(p, F_GETFL) & O_NONBLOCK, "P lost O_NONBLOCK");
	CHECK(!(fcntl(o, F_GETFL) & O_NONBLOCK), "O gained O_NONBLOCK");
	CHECK(victim_fdinfo_has(p, "clockid: 1\n"), "P is not on CLOCK_MONOTONIC");
	CHECK(victim_fdinfo_has(o, "clockid: 7\n"), "O is not on CLOCK_BOOTTIME");
	CHECK(victim_fdinfo_has(r, "clockid: 0\n"), "R is not on CLOCK_REALTIME");
	CHECK(victim_fdinfo_has(r, "settime flags: 03\n"), "R lost ABSTIME|CANCEL_ON_SET");
	CHECK(victim_fdinfo_has(p, "settime flags: 00\n"), "P is not relative any more");

	CHECK(timerfd_gettime(o, &cur) == 0, "gettime O: %s", strerror(errno));
	CHECK(ns_of(cur.it_value) > 0 && ns_of(cur.it_value) <= ONESHOT_NS,
	      "O not armed within its 2 s: %lld ns left", (long long)ns_of(cur.it_value));
	CHECK(ns_of(cur.it_interval) == 0, "O gained an interval");

	CHECK(timerfd_gettime(DUP_FD, &cur) == 0, "gettime P: %s", strerror(errno));
	CHECK(ns_of(cur.it_interval) == PERIOD_NS, "P interval %lld ns, want 1 s",
	      (long long)ns_of(cur.it_interval));
	/* Fires within one period of go (it had ~0.5 s left at the dump). */
	CHECK(wait_fire(p, PERIOD_NS - (now_ns(CLOCK_MONOTONIC) - go) + SLACK_NS) >= 1,
	      "P did not fire within its period after restore");
	int64_t t1 = 0, t2 = 0;
	CHECK(wait_fire(p, PERIOD_NS + SLACK_NS) == 1, "P did not fire again");
	t1 = now_ns(CLOCK_MONOTONIC);
	CHECK(wait_fire(DUP_FD, PERIOD_NS + SLACK_NS) == 1, "P (via its dup) did not fire again");
	t2 = now_ns(CLOCK_MONOTONIC);
	CHECK(llabs(t2 - t1 - PERIOD_NS) < SLACK_NS, "P period %lld ns, want 1 s",
	      (long long)(t2 - t1));

	CHECK(wait_fire(o, ONESHOT_NS + SLACK_NS) == 1, "O did not fire once");

	CHECK(wait_fire(r, deadline - now_ns(CLOCK_REALTIME) + SLACK_NS) == 1, "R did not fire");
	CHECK(now_ns(CLOCK_REALTIME) >= deadline, "R fired before its deadline");
	victim_finish();
}
