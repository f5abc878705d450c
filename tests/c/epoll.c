/*
 * epoll victim. Before the dump, one epoll E (CLOEXEC) registers:
 *   - FIRED: a pipe read end with EPOLLONESHOT that already fired (one
 *     epoll_wait reported it), so it is disarmed; data stays in the pipe;
 *   - ARMED: an empty pipe read end with EPOLLONESHOT, not fired;
 *   - PIPE: a pipe read end holding data (level-triggered);
 *   - EVENTFD: an eventfd with counter 5;
 *   - EDGE: a pipe read end holding data, EPOLLET, edge not yet consumed;
 *   - MOVED: a pipe read end registered as fd Q, then dup'ed to fd 40 and
 *     Q closed: the registration refers to the file, not the number;
 *   - SOCKET: a UNIX stream socket with a byte queued (level-triggered);
 *   - TIMER: a timerfd that has expired once, not read.
 * Then it forks: the child shares E.
 * After go: the first epoll_wait reports exactly PIPE, EVENTFD, SOCKET,
 * TIMER and EDGE with their data; the second all of them but EDGE (the
 * edge is consumed);
 * writing to ARMED reports it once; writing to MOVED's pipe reports MOVED;
 * FIRED stays silent; a new write re-arms EDGE. Then the child removes
 * PIPE from the shared E (EPOLL_CTL_DEL) and exits; the parent's E no
 * longer reports PIPE.
 */
#include "victim.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/wait.h>

#define MOVED_FD 40
#define MAX_EVENTS 16

/* Registration data, one bit each so a wait's result is a mask. */
enum target {
	FIRED = 1 << 0,
	ARMED = 1 << 1,
	PIPE = 1 << 2,
	EVENTFD = 1 << 3,
	EDGE = 1 << 4,
	MOVED = 1 << 5,
	SOCKET = 1 << 6,
	TIMER = 1 << 7,
};

/* The level-triggered targets that stay ready until read. */
#define LEVEL (PIPE | EVENTFD | SOCKET | TIMER)

/* Data values far from small integers, so a lost or truncated one shows. */
#define DATA(t) (0xda7a000000000000ULL | ((uint64_t)(t) << 16) | 0xbeef)

static void add(int ep, int fd, uint32_t events, enum target t)
{
	struct epoll_event ev = { .events = events, .data.u64 = DATA(t) };
	if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0)
		die("epoll_ctl ADD");
}

/* The targets one non-blocking epoll_wait reports, as a mask. */
static unsigned ready(int ep)
{
	struct epoll_event evs[MAX_EVENTS];
	int n = epoll_wait(ep, evs, MAX_EVENTS, 0);
	unsigned mask = 0;
	if (n < 0) {
		fail("epoll_wait: %s", strerror(errno));
		return 0;
	}
	for (int i = 0; i < n; i++) {
		uint64_t d = evs[i].data.u64;
		unsigned t = (unsigned)(d >> 16) & 0xffff;
		if (d != DATA(t) || t == 0 || (t & (t - 1)) != 0)
			fail("epoll_wait gave unknown data %#llx", (unsigned long long)d);
		else if (evs[i].events != EPOLLIN)
			fail("target %#x: events %#x, want EPOLLIN", t, evs[i].events);
		mask |= t;
	}
	return mask;
}

static void pipe_or_die(int p[2])
{
	if (pipe(p) != 0)
		die("pipe");
}

static void put(int fd)
{
	if (write(fd, "x", 1) != 1)
		die("write");
}

static void child(int ep, int pipe_fd)
{
	/* Not victim_wait_for: a child must not write the result files. */
	while (!victim_file_exists("child-go")) {
		victim_tick();
		if (victim_timespec_passed(&victim_deadline))
			_exit(90);
	}
	_exit(epoll_ctl(ep, EPOLL_CTL_DEL, pipe_fd, NULL) == 0 ? 0 : 91);
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	int ep = epoll_create1(EPOLL_CLOEXEC);
	if (ep < 0)
		die("epoll_create1");
	int fired[2], armed[2], pipe_[2], edge[2], moved[2];
	pipe_or_die(fired);
	add(ep, fired[0], EPOLLIN | EPOLLONESHOT, FIRED);
	put(fired[1]);
	if (ready(ep) != FIRED)
		die("ONESHOT target did not fire before the dump");

	pipe_or_die(armed);
	add(ep, armed[0], EPOLLIN | EPOLLONESHOT, ARMED);
	pipe_or_die(pipe_);
	put(pipe_[1]);
	add(ep, pipe_[0], EPOLLIN, PIPE);
	int efd = eventfd(5, EFD_NONBLOCK);
	if (efd < 0)
		die("eventfd");
	add(ep, efd, EPOLLIN, EVENTFD);
	pipe_or_die(edge);
	put(edge[1]);
	add(ep, edge[0], EPOLLIN | EPOLLET, EDGE);
	pipe_or_die(moved);
	add(ep, moved[0], EPOLLIN, MOVED);
	if (dup2(moved[0], MOVED_FD) != MOVED_FD)
		die("dup2");
	close(moved[0]);
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
		die("socketpair");
	put(sv[1]);
	add(ep, sv[0], EPOLLIN, SOCKET);
	int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	struct itimerspec once = { .it_value = { .tv_nsec = 1 } };
	if (tfd < 0 || timerfd_settime(tfd, 0, &once, NULL) != 0)
		die("timerfd");
	add(ep, tfd, EPOLLIN, TIMER);
	while (!(ready(ep) & TIMER))
		victim_tick();
	/* Waiting for the timer consumed the edge of EDGE: make a new one. */
	put(edge[1]);

	pid_t kid = fork();
	if (kid < 0)
		die("fork");
	if (kid == 0)
		child(ep, pipe_[0]);

	victim_ready_and_wait(NULL);

	unsigned got = ready(ep);
	CHECK(got == (LEVEL | EDGE), "first wait: targets %#x, want %#x", got, LEVEL | EDGE);
	got = ready(ep);
	CHECK(got == LEVEL, "second wait: targets %#x, want %#x", got, LEVEL);
	put(armed[1]);
	got = ready(ep);
	CHECK(got == (LEVEL | ARMED), "ARMED not reported once written: %#x", got);
	got = ready(ep);
	CHECK(!(got & ARMED), "ONESHOT target ARMED reported twice: %#x", got);
	put(moved[1]);
	put(fired[1]);
	got = ready(ep);
	CHECK(got & MOVED, "target registered by a closed fd number lost: %#x", got);
	CHECK(!(got & FIRED), "disarmed ONESHOT target FIRED re-armed: %#x", got);
	put(edge[1]);
	got = ready(ep);
	CHECK(got & EDGE, "EPOLLET target not reported on a new write: %#x", got);

	char c = 0;
	uint64_t expirations = 0;
	CHECK(read(sv[0], &c, 1) == 1 && c == 'x', "socket byte lost");
	CHECK(read(tfd, &expirations, 8) == 8 && expirations == 1, "timer expirations: %llu",
	      (unsigned long long)expirations);
	got = ready(ep);
	CHECK(!(got & (SOCKET | TIMER)), "SOCKET or TIMER still ready once read: %#x", got);

	victim_write_file("child-go", "");
	victim_check_child(kid, "child");
	got = ready(ep);
	CHECK(!(got & PIPE) && (got & EVENTFD),
	      "child's EPOLL_CTL_DEL not seen: epoll not shared across fork (%#x)", got);
	victim_finish();
}
