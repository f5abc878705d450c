/*
 * Victim for incremental dumps (`ckpt dump --pre-dump`, then `--prev`).
 *
 * Memory: 64 MiB written once (every page tagged with its index and a
 * value), a 1 MiB region a thread keeps rewriting, and two 4 MiB regions
 * used to change the address space between the pre-dump and the dump.
 * After WORKDIR/stage1 (the pre-dump is done) the victim changes, then
 * writes WORKDIR/mutated:
 *  - every 16th page of the first 8 MiB gets a new value (written since);
 *  - region A is mremap()ed elsewhere (its pages move, now untracked);
 *  - region B is madvise(MADV_DONTNEED)ed and its first page read (zero).
 * After go it checks every page of all of it, as it must be at the dump.
 *
 *   incremental WORKDIR
 */
#include "victim.h"

#include <pthread.h>
#include <sys/mman.h>

#define PAGE 4096
#define WORDS (PAGE / 8)
#define BIG_PAGES 16384 /* 64 MiB */
#define CHANGED_PAGES 2048 /* 8 MiB */
#define HOT_PAGES 256 /* 1 MiB */
#define SIDE_BYTES (4ul << 20)

static uint64_t *big, *hot, *side_a, *side_b;
static volatile uint64_t hot_gen;
static volatile int stop;

static uint64_t value(uint64_t page, uint64_t round)
{
	return (page * 0x9e3779b97f4a7c15ull) ^ (round << 40) ^ 0x1234;
}

static void fill(uint64_t *p, uint64_t page, uint64_t round)
{
	for (int j = 0; j < WORDS; j += 64)
		p[j] = value(page, round) + (uint64_t)j;
}

static int holds(const uint64_t *p, uint64_t page, uint64_t round)
{
	for (int j = 0; j < WORDS; j += 64)
		if (p[j] != value(page, round) + (uint64_t)j)
			return 0;
	return 1;
}

static void *hot_loop(void *arg)
{
	(void)arg;
	while (!stop) {
		uint64_t g = hot_gen + 1;

		for (uint64_t i = 0; i < HOT_PAGES; i++)
			hot[i * WORDS] = g;
		hot_gen = g;
		victim_tick();
	}
	return NULL;
}

static void *map(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		die("mmap");
	return p;
}

int main(int argc, char **argv)
{
	pthread_t hot_thread;

	victim_init(argc, argv);
	big = map((size_t)BIG_PAGES * PAGE);
	hot = map((size_t)HOT_PAGES * PAGE);
	side_a = map(SIDE_BYTES);
	side_b = map(SIDE_BYTES);
	for (uint64_t i = 0; i < BIG_PAGES; i++)
		fill(big + i * WORDS, i, 0);
	for (uint64_t i = 0; i < SIDE_BYTES / PAGE; i++) {
		fill(side_a + i * WORDS, 100000 + i, 0);
		fill(side_b + i * WORDS, 200000 + i, 0);
	}
	if (pthread_create(&hot_thread, NULL, hot_loop, NULL))
		die("pthread_create");

	victim_signal_ready("ready");
	victim_wait_for("stage1");

	for (uint64_t i = 0; i < CHANGED_PAGES; i += 16)
		fill(big + i * WORDS, i, 1);
	/* Moved somewhere else: the same bytes at another address. */
	void *moved = mremap(side_a, SIDE_BYTES, SIDE_BYTES * 2, MREMAP_MAYMOVE);

	if (moved == MAP_FAILED)
		die("mremap");
	side_a = moved;
	if (madvise(side_b, SIDE_BYTES, MADV_DONTNEED))
		die("madvise");
	CHECK(side_b[0] == 0, "region B not zero after MADV_DONTNEED");
	victim_write_file("mutated", "mutated");

	victim_wait_for("go");
	stop = 1;
	pthread_join(hot_thread, NULL);
	long bad = 0, first = -1;

	for (uint64_t i = 0; i < BIG_PAGES; i++)
		if (!holds(big + i * WORDS, i, i < CHANGED_PAGES && i % 16 == 0) && bad++ == 0)
			first = (long)i;
	CHECK(bad == 0, "%ld of %d pages wrong, first %ld", bad, BIG_PAGES, first);
	for (uint64_t i = 0; i < SIDE_BYTES / PAGE; i++)
		CHECK(holds(side_a + i * WORDS, 100000 + i, 0), "moved region page %lu wrong",
		      (unsigned long)i);
	for (uint64_t i = 0; i < SIDE_BYTES / 8; i++)
		if (side_b[i] != 0) {
			fail("dropped region word %lu is %#lx, not 0", (unsigned long)i,
			     (unsigned long)side_b[i]);
			break;
		}
	uint64_t g = hot[0];

	for (uint64_t i = 0; i < HOT_PAGES; i++)
		CHECK(hot[i * WORDS] == g, "hot page %lu at generation %lu, page 0 at %lu",
		      (unsigned long)i, (unsigned long)hot[i * WORDS], (unsigned long)g);
	victim_finish();
	return 0;
}
