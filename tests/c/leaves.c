/*
 * A wide tree of leaves, each with memory of its own: the root forks
 * NCHILD children, then each child maps MIB MiB of private anonymous
 * memory and fills it with a pattern of its own (the first half random
 * words, stored raw; the second half repetitive, stored compressed), so no
 * page is shared with the root or a sibling and a restore copies every
 * leaf's pages separately, several at once. After go, each child checks
 * every word of its region against the pattern it wrote and exits with 0,
 * or with the number of the first wrong MiB + 1 (at most 100); the root
 * checks each child's status.
 *
 *   leaves WORKDIR [NCHILD] [MIB]   defaults: 6 children of 8 MiB
 */
#include "victim.h"

#include <sys/mman.h>
#include <sys/wait.h>

#define MAX_CHILDREN 64
#define MIB (1ul << 20)

/* Children that have written their region (in a shared page). */
static volatile int *filled;

/* Word `i` of child `k`'s region of `words` words. */
static uint64_t word(int k, size_t i, size_t words)
{
	if (i < words / 2) {
		uint64_t x = (uint64_t)(k + 1) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)i;
		x ^= x >> 33;
		x *= 0xFF51AFD7ED558CCDULL;
		x ^= x >> 33;
		return x;
	}
	return ((uint64_t)(k + 1) << 48) | (uint64_t)(i / 512);
}

static int leaf(int k, size_t len)
{
	size_t words = len / 8;
	uint64_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return 101;
	for (size_t i = 0; i < words; i++)
		m[i] = word(k, i, words);
	__atomic_add_fetch(filled, 1, __ATOMIC_SEQ_CST);
	victim_child_wait_go(102);
	for (size_t i = 0; i < words; i++)
		if (m[i] != word(k, i, words))
			return 1 + (int)((i * 8 / MIB) % 100);
	return 0;
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	int n = argc > 2 ? atoi(argv[2]) : 6;
	size_t len = (argc > 3 ? (size_t)atol(argv[3]) : 8) * MIB;
	if (n < 1 || n > MAX_CHILDREN || len == 0)
		die("arguments");
	filled = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (filled == MAP_FAILED)
		die("mmap");
	pid_t kids[MAX_CHILDREN];
	for (int k = 0; k < n; k++) {
		kids[k] = fork();
		if (kids[k] < 0)
			die("fork");
		if (kids[k] == 0)
			_exit(leaf(k, len));
	}
	while (*filled < n) {
		victim_tick();
		if (victim_timespec_passed(&victim_deadline))
			die("children not filled");
	}
	victim_ready_and_wait(NULL);
	for (int k = 0; k < n; k++) {
		int st;
		CHECK(waitpid(kids[k], &st, 0) == kids[k], "waitpid: %s", strerror(errno));
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: status %#x", k, st);
	}
	victim_finish();
}
