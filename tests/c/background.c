/*
 * Victim for `ckpt dump --background`: writer threads rewrite their own
 * memory as fast as they can, page after page, one generation after the
 * other, while the tree is dumped.
 *
 * Before writing generation g into a page, a writer checks that the page
 * still holds generation g-1 (in its first, middle and last word). A
 * snapshot that is the memory of one instant passes this forever after a
 * restore; a page saved later than the freeze (already holding the next
 * generation) or torn fails it when its writer comes by. After go, main
 * lets every writer complete two more generations, stops them and reports.
 *
 *   background WORKDIR [unmapper]
 * With `unmapper`, one more thread keeps a filled 32 MiB mapping and
 * munmaps it when WORKDIR/unmap appears (then writes WORKDIR/unmapped):
 * the test makes a background dump lose memory on purpose.
 */
#include "victim.h"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>

#define NWRITERS 3
#define REGION_PAGES 6144 /* 24 MiB per writer */
#define PAGE 4096
#define WORDS (PAGE / 8)
#define UNMAP_BYTES (32ul << 20)

struct writer {
	int idx;
	uint64_t *mem;
	volatile uint64_t gen; /* generation being written */
	volatile long bad;
	char fail[200];
};

static struct writer writers[NWRITERS];
static volatile int stop;

static uint64_t mix(uint64_t gen, uint64_t page)
{
	return (gen * 0x9e3779b97f4a7c15ull) ^ (page << 17) ^ 0x5bd1e995ull;
}

static void *write_loop(void *arg)
{
	struct writer *w = arg;

	while (!stop) {
		uint64_t g = w->gen + 1;

		for (uint64_t i = 0; i < REGION_PAGES && !stop; i++) {
			uint64_t *p = w->mem + i * WORDS;
			uint64_t want = g - 1;

			if ((p[0] != want || p[WORDS / 2] != mix(want, i) || p[WORDS - 1] != want) &&
			    w->bad++ == 0)
				snprintf(w->fail, sizeof(w->fail),
					 "writer %d page %lu: generation %lu/%lu/%lu, expected %lu", w->idx,
					 (unsigned long)i, (unsigned long)p[0],
					 (unsigned long)(p[WORDS / 2] == mix(want, i)),
					 (unsigned long)p[WORDS - 1], (unsigned long)want);
			p[0] = g;
			p[WORDS / 2] = mix(g, i);
			p[WORDS - 1] = g;
			if ((i & 63) == 63)
				sched_yield();
		}
		if (!stop)
			w->gen = g;
	}
	return NULL;
}

static void *unmapper(void *arg)
{
	char *region = arg;

	while (!stop && !victim_file_exists("unmap"))
		usleep(1000);
	if (!stop) {
		if (munmap(region, UNMAP_BYTES) != 0)
			die("munmap");
		victim_write_file("unmapped", "unmapped");
	}
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t threads[NWRITERS + 1];
	int with_unmapper = argc > 2 && strcmp(argv[2], "unmapper") == 0;

	victim_init(argc, argv);
	for (int t = 0; t < NWRITERS; t++) {
		struct writer *w = &writers[t];

		w->idx = t;
		w->mem = mmap(NULL, (size_t)REGION_PAGES * PAGE, PROT_READ | PROT_WRITE,
			      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (w->mem == MAP_FAILED)
			die("mmap");
		for (uint64_t i = 0; i < REGION_PAGES; i++) {
			uint64_t *p = w->mem + i * WORDS;

			/* Generation 0, the rest of the page random-ish so LZ4 works. */
			for (int j = 0; j < WORDS; j++)
				p[j] = mix(i, (uint64_t)j);
			p[0] = 0;
			p[WORDS / 2] = mix(0, i);
			p[WORDS - 1] = 0;
		}
		if (pthread_create(&threads[t], NULL, write_loop, w))
			die("pthread_create");
	}
	if (with_unmapper) {
		char *region = mmap(NULL, UNMAP_BYTES, PROT_READ | PROT_WRITE,
				    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (region == MAP_FAILED)
			die("mmap");
		memset(region, 0x5a, UNMAP_BYTES);
		if (pthread_create(&threads[NWRITERS], NULL, unmapper, region))
			die("pthread_create");
	}

	victim_ready_and_wait("writing");

	/* Two more full generations of every writer, bounded. */
	uint64_t start[NWRITERS];
	struct timespec limit;

	clock_gettime(CLOCK_MONOTONIC, &limit);
	limit.tv_sec += 60;
	for (int t = 0; t < NWRITERS; t++)
		start[t] = writers[t].gen;
	for (int t = 0; t < NWRITERS; t++)
		while (writers[t].gen < start[t] + 2 && !victim_timespec_passed(&limit))
			usleep(1000);
	stop = 1;
	for (int t = 0; t < NWRITERS; t++)
		pthread_join(threads[t], NULL);
	if (with_unmapper)
		pthread_join(threads[NWRITERS], NULL);
	for (int t = 0; t < NWRITERS; t++) {
		CHECK(writers[t].gen >= start[t] + 2, "writer %d stuck at generation %lu", t,
		      (unsigned long)writers[t].gen);
		CHECK(writers[t].bad == 0, "%s (%ld bad pages)", writers[t].fail, writers[t].bad);
	}
	victim_finish();
	return 0;
}
