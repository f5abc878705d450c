/*
 * Private memory shared copy-on-write after fork. The root fills 256 MiB
 * of private anonymous memory and forks three children; child 0 forks a
 * grandchild. Then each changes a little of its copy (see below) and
 * records a hash of the whole region as it sees it. After go, every
 * process checks that its region hashes the same: its own writes, the
 * pages it dropped (zeros) and the untouched pages it still shared are all
 * where they were. The test checks from outside that the tree's memory
 * (sum of PSS) stays near one copy of the region after restore.
 *
 *   cow WORKDIR        the region is private anonymous memory
 *   cow WORKDIR file   the region is a private mapping of a file of zeros
 *                      (WORKDIR/cow.bin), every page written before the
 *                      fork: the copies the processes share are of the
 *                      file's pages (a dropped page reads the file again)
 */
#include "victim.h"

#include <sys/mman.h>
#include <sys/wait.h>

#define LEN (256ul << 20)
#define PAGE 4096ul
#define NCHILD 3

/* Processes that finished changing their copy (in a shared page). */
static volatile int *settled;

static void fill(uint64_t *w, size_t words, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
	for (size_t i = 0; i < words; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		w[i] = x + i;
	}
}

static uint64_t region_hash(const unsigned char *m)
{
	return hash_bytes(m, LEN, 1469598103934665603ULL);
}

/* Writes `n` pages starting at page `first`, every `step` pages. */
static void scribble(unsigned char *m, size_t first, size_t n, size_t step, uint64_t seed)
{
	for (size_t i = 0; i < n; i++)
		fill((uint64_t *)(m + (first + i * step) * PAGE), PAGE / 8, seed + i);
}

/* Settle, wait for go, and check the region is as it was. Exit code 0 = ok. */
static int settle_and_check(unsigned char *m)
{
	uint64_t before = region_hash(m);
	__atomic_add_fetch(settled, 1, __ATOMIC_SEQ_CST);
	while (!victim_file_exists("go")) {
		victim_tick();
		if (victim_timespec_passed(&victim_deadline))
			return 70;
	}
	return region_hash(m) == before ? 0 : 71;
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	settled = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	unsigned char *m;
	if (argc > 2 && strcmp(argv[2], "file") == 0) {
		char path[PATH_MAX];
		victim_path(path, sizeof(path), "cow.bin");
		int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (fd < 0 || ftruncate(fd, LEN) != 0)
			die("cow.bin");
		m = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
		close(fd);
	} else {
		m = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	}
	if (m == MAP_FAILED || settled == MAP_FAILED)
		die("mmap");
	fill((uint64_t *)m, LEN / 8, 42);

	pid_t kids[NCHILD];
	for (int k = 0; k < NCHILD; k++) {
		kids[k] = fork();
		if (kids[k] < 0)
			die("fork");
		if (kids[k] > 0)
			continue;
		switch (k) {
		case 0: {
			/* Writes nothing; its child writes nothing either: three
			 * generations share the same pages. */
			pid_t g = fork();
			if (g < 0)
				_exit(72);
			if (g == 0)
				_exit(settle_and_check(m));
			int rc = settle_and_check(m);
			int st;
			if (waitpid(g, &st, 0) != g || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
				_exit(73);
			_exit(rc);
		}
		case 1:
			/* 100 pages of its own, spread out. */
			scribble(m, 10, 100, 613, 1000);
			_exit(settle_and_check(m));
		default:
			/* Drops 1000 pages (they read as zeros now) and writes 10. */
			if (madvise(m + 5000 * PAGE, 1000 * PAGE, MADV_DONTNEED) != 0)
				_exit(74);
			scribble(m, 40000, 10, 7, 2000);
			_exit(settle_and_check(m));
		}
	}
	/* The root writes after the fork: its children keep the old pages. */
	scribble(m, 20000, 50, 3, 3000);
	uint64_t before = region_hash(m);
	__atomic_add_fetch(settled, 1, __ATOMIC_SEQ_CST);
	while (*settled < NCHILD + 2)
		victim_tick();
	victim_signal_ready(NULL);
	while (!victim_file_exists("go")) {
		victim_poll_ping();
		victim_tick();
		if (victim_timespec_passed(&victim_deadline)) {
			fail("timed out waiting for go");
			victim_finish();
		}
	}
	CHECK(region_hash(m) == before, "the root's memory changed");
	for (int k = 0; k < NCHILD; k++) {
		int st;
		CHECK(waitpid(kids[k], &st, 0) == kids[k], "waitpid: %s", strerror(errno));
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d failed: status %#x", k, st);
	}
	victim_finish();
}
