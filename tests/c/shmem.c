/*
 * Shared anonymous memory across fork: the root maps 4 MiB
 * MAP_SHARED|MAP_ANONYMOUS, fills the first half, forks a child that fills
 * the second half. Both keep counting in their own slot. After go, the
 * child writes a token the root must see (the mapping is still one object,
 * not two copies), both check both halves, the root reaps the child.
 */
#include "victim.h"

#include <sys/mman.h>
#include <sys/wait.h>

#define LEN (4u << 20)

struct shared {
	volatile unsigned long root_ticks, child_ticks;
	volatile unsigned long token;
};

static int check_pattern(const unsigned char *m, size_t from, size_t to, unsigned char seed)
{
	for (size_t i = from; i < to; i += 4096)
		if (m[i] != (unsigned char)(seed + i / 4096))
			return 0;
	return 1;
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	unsigned char *m = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		die("mmap");
	struct shared *s = (struct shared *)m;
	for (size_t i = 4096; i < LEN / 2; i += 4096)
		m[i] = (unsigned char)(1 + i / 4096);

	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		for (size_t i = LEN / 2; i < LEN; i += 4096)
			m[i] = (unsigned char)(7 + i / 4096);
		while (!victim_file_exists("go")) {
			s->child_ticks++;
			victim_tick();
			if (victim_timespec_passed(&victim_deadline))
				_exit(70);
		}
		s->token = 0xfeedface;
		if (!check_pattern(m, 4096, LEN / 2, 1) || !check_pattern(m, LEN / 2, LEN, 7))
			_exit(71);
		_exit(0);
	}
	/* Ready once the child's half is visible here: it is shared. */
	while (m[LEN - 4096] != (unsigned char)(7 + (LEN - 4096) / 4096))
		victim_tick();
	victim_signal_ready(NULL);
	while (!victim_file_exists("go")) {
		s->root_ticks++;
		victim_poll_ping();
		victim_tick();
		if (victim_timespec_passed(&victim_deadline)) {
			fail("timed out waiting for go");
			victim_finish();
		}
	}
	int st;
	CHECK(waitpid(child, &st, 0) == child, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed: status %#x", st);
	CHECK(s->token == 0xfeedface, "the child's write is not visible: the memory is no longer shared");
	CHECK(check_pattern(m, 4096, LEN / 2, 1), "first half changed");
	CHECK(check_pattern(m, LEN / 2, LEN, 7), "second half changed");
	CHECK(s->child_ticks > 0 && s->root_ticks > 0, "counters lost");
	victim_finish();
}
