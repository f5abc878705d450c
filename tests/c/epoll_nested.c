/*
 * Nested epoll victim, as libraries such as UCX build them: an outer
 * epoll OUTER (the lowest fd number, so it comes before its targets in the
 * fd table) registers two inner epolls: INNER_PIPE, which watches a pipe
 * holding data, and INNER_EVENT, which watches an eventfd at zero. Before
 * the dump OUTER reports INNER_PIPE only. After go: OUTER still reports
 * INNER_PIPE (tag 1) and not INNER_EVENT; writing the eventfd makes OUTER
 * report INNER_EVENT (tag 2) too; INNER_PIPE itself reports the pipe (tag
 * 11) with its byte, INNER_EVENT the eventfd (tag 12) with its count.
 */
#include "victim.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>

#define TAG_INNER_PIPE 1
#define TAG_INNER_EVENT 2
#define TAG_PIPE 11
#define TAG_EVENT 12

/* The tags one non-blocking epoll_wait reports, as a mask of 1 << tag. */
static unsigned long long ready(int ep)
{
	struct epoll_event ev[4];
	int n = epoll_wait(ep, ev, 4, 0);
	if (n < 0)
		die("epoll_wait");
	unsigned long long mask = 0;
	for (int i = 0; i < n; i++)
		mask |= 1ULL << ev[i].data.u64;
	return mask;
}

static void add(int ep, int fd, unsigned long long tag)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = tag };
	if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0)
		die("epoll_ctl");
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	int outer = epoll_create1(EPOLL_CLOEXEC);
	int inner_pipe = epoll_create1(EPOLL_CLOEXEC);
	int inner_event = epoll_create1(0);
	int p[2];
	if (outer < 0 || inner_pipe < 0 || inner_event < 0 || pipe(p) < 0)
		die("create");
	int efd = eventfd(0, EFD_NONBLOCK);
	if (efd < 0)
		die("eventfd");
	if (write(p[1], "x", 1) != 1)
		die("write");
	add(inner_pipe, p[0], TAG_PIPE);
	add(inner_event, efd, TAG_EVENT);
	add(outer, inner_pipe, TAG_INNER_PIPE);
	add(outer, inner_event, TAG_INNER_EVENT);
	unsigned long long got = ready(outer);
	CHECK(got == 1ULL << TAG_INNER_PIPE, "before: outer reports %#llx", got);

	victim_ready_and_wait(NULL);

	got = ready(outer);
	CHECK(got == 1ULL << TAG_INNER_PIPE, "after: outer reports %#llx", got);
	uint64_t one = 1;
	if (write(efd, &one, sizeof one) != sizeof one)
		die("write eventfd");
	got = ready(outer);
	CHECK(got == ((1ULL << TAG_INNER_PIPE) | (1ULL << TAG_INNER_EVENT)),
	      "after the eventfd write: outer reports %#llx", got);
	got = ready(inner_pipe);
	CHECK(got == 1ULL << TAG_PIPE, "inner pipe epoll reports %#llx", got);
	got = ready(inner_event);
	CHECK(got == 1ULL << TAG_EVENT, "inner eventfd epoll reports %#llx", got);
	char c = 0;
	CHECK(read(p[0], &c, 1) == 1 && c == 'x', "pipe byte %c", c);
	uint64_t count = 0;
	CHECK(read(efd, &count, sizeof count) == sizeof count && count == 1,
	      "eventfd count %llu", (unsigned long long)count);
	got = ready(outer);
	CHECK(got == 0, "outer still reports %#llx once both are read", got);
	victim_finish();
}
