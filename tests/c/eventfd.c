/*
 * eventfd victim. Before the dump:
 *   - A = eventfd(7, NONBLOCK|CLOEXEC), then 2^40 written to it, so the
 *     counter (7 + 2^40) does not fit eventfd2's 32-bit initial value;
 *     fd 20 = dup(A) without CLOEXEC: one description, two fds.
 *   - S = eventfd(3, SEMAPHORE|NONBLOCK), inherited by a child.
 * After go the child reads S once (semaphore: must get 1, leaving 2), adds
 * 10 and exits; the parent reaps it, then checks: both fds are eventfds with
 * their fd flags; reading fd 20 gives 7 + 2^40 and then A is empty (shared
 * counter); S yields exactly 12 reads of 1 (the child's changes are seen:
 * shared across fork) and then EAGAIN (non-blocking kept).
 */
#include "victim.h"

#include <sys/eventfd.h>
#include <sys/wait.h>

#define BIG (1ULL << 40)
#define DUP_FD 20

static void child(int s)
{
	eventfd_t v = 0;
	while (!victim_file_exists("go")) {
		victim_tick();
		if (victim_timespec_passed(&victim_deadline))
			_exit(90);
	}
	if (eventfd_read(s, &v) != 0)
		_exit(91);
	if (v != 1)
		_exit(92);
	if (eventfd_write(s, 10) != 0)
		_exit(93);
	_exit(0);
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	int a = eventfd(7, EFD_NONBLOCK | EFD_CLOEXEC);
	if (a < 0)
		die("eventfd A");
	if (eventfd_write(a, BIG) != 0)
		die("eventfd_write A");
	if (dup2(a, DUP_FD) != DUP_FD)
		die("dup2");
	int s = eventfd(3, EFD_SEMAPHORE | EFD_NONBLOCK);
	if (s < 0)
		die("eventfd S");
	pid_t kid = fork();
	if (kid < 0)
		die("fork");
	if (kid == 0)
		child(s);

	victim_ready_and_wait(NULL);

	victim_check_child(kid, "child");

	CHECK(victim_fd_is_anon(a, "eventfd") && victim_fd_is_anon(DUP_FD, "eventfd") && victim_fd_is_anon(s, "eventfd"), "not eventfds any more");
	CHECK(fcntl(a, F_GETFD) == FD_CLOEXEC, "fd %d lost FD_CLOEXEC", a);
	CHECK(fcntl(DUP_FD, F_GETFD) == 0, "fd %d gained FD_CLOEXEC", DUP_FD);
	CHECK(fcntl(a, F_GETFL) & O_NONBLOCK, "A lost O_NONBLOCK");

	eventfd_t v = 0;
	CHECK(eventfd_read(DUP_FD, &v) == 0, "read fd %d: %s", DUP_FD, strerror(errno));
	CHECK(v == 7 + BIG, "counter %llu, want %llu", (unsigned long long)v,
	      (unsigned long long)(7 + BIG));
	CHECK(eventfd_read(a, &v) != 0 && errno == EAGAIN,
	      "A not empty after reading its dup: fds no longer share one eventfd");

	int reads = 0;
	while (eventfd_read(s, &v) == 0) {
		CHECK(v == 1, "semaphore read gave %llu", (unsigned long long)v);
		if (++reads > 100)
			break;
	}
	CHECK(errno == EAGAIN, "S read ended with %s, want EAGAIN", strerror(errno));
	CHECK(reads == 12, "S gave %d reads, want 12 (3 - 1 by the child + 10)", reads);
	victim_finish();
}
