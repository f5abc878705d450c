/*
 * Lazy restore victim: a large block of patterned private memory, used
 * while the page server is still filling it.
 *
 *   lazy WORKDIR [MIB] [THREADS]
 *
 * Before ready: MIB MiB (default 256) of private anonymous memory, every
 * 64-bit word a function of its index (compressible: words of one group of
 * 8 share their high bytes), plus a PROT_NONE reservation for mremap.
 * After go, at once (the top of the block is filled last by the server's
 * address-order background fill), in the top 16 MiB:
 *   DROP   madvise(MADV_DONTNEED): must read as zeros from now on;
 *   UNMAP  munmap, then mapped afresh: must read as zeros, never image data;
 *   WRITE  the first word of every page overwritten: must survive the fill;
 *   REMAP  mremap'ed onto the reservation: its data must follow it.
 * and below them two pages in the middle of a piece of page data are made
 * read-only (the VMA split in three): their data must still arrive.
 * Then a forked child checks all of the memory, while THREADS threads
 * (default 4) check their slices of it concurrently, then the parent checks
 * the top regions. Every word is compared with what it must hold.
 */
#include "victim.h"

#include <pthread.h>
#include <sys/mman.h>

#define MIB (1UL << 20)
#define PG 4096UL
#define WORDS_PER_PAGE (PG / 8)
#define MAX_THREADS 16

/* The special regions, from the top of the block down, each this long. */
#define REGION (4 * MIB)

static unsigned char *big;
static size_t big_len;
static unsigned char *reserve;
static uint64_t seed;

static uint64_t mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

/* The saved content of word `i` of the block. */
static uint64_t pattern(size_t i)
{
	return (mix((i >> 3) ^ seed) & ~0xffffULL) | (i & 0xffff);
}

static size_t drop_off(void) { return big_len - 4 * REGION; }
static size_t unmap_off(void) { return big_len - 3 * REGION; }
static size_t write_off(void) { return big_len - 2 * REGION; }
static size_t remap_off(void) { return big_len - REGION; }
/* Inside the region below the special ones, away from any 1 MiB boundary. */
static size_t protect_off(void) { return big_len - 5 * REGION + MIB + 3 * PG; }
#define PROTECT_LEN (2 * PG)

/* What word `i` of the block (by its original index) must hold now. */
static uint64_t expected(size_t i)
{
	size_t off = i * 8;

	if (off >= drop_off() && off < unmap_off())
		return 0;
	if (off >= unmap_off() && off < write_off())
		return 0;
	if (off >= write_off() && off < remap_off() && i % WORDS_PER_PAGE == 0)
		return ~pattern(i);
	return pattern(i);
}

/* The address word `i` is at now (the REMAP region moved). */
static const uint64_t *word_at(size_t i)
{
	size_t off = i * 8;

	if (off >= remap_off())
		return (const uint64_t *)(reserve + (off - remap_off()));
	return (const uint64_t *)(big + off);
}

struct slice {
	size_t from, to; /* word indexes */
	size_t bad;
	size_t first_bad;
};

static void check_slice(struct slice *s)
{
	s->bad = 0;
	for (size_t i = s->from; i < s->to; i++) {
		if (*word_at(i) != expected(i)) {
			if (s->bad++ == 0)
				s->first_bad = i;
		}
	}
}

static void *check_thread(void *arg)
{
	check_slice(arg);
	return NULL;
}

static void report(const char *who, const struct slice *s)
{
	if (s->bad)
		fail("%s: %zu words wrong, the first at offset %#zx (%#llx, expected %#llx)",
		     who, s->bad, s->first_bad * 8,
		     (unsigned long long)*word_at(s->first_bad),
		     (unsigned long long)expected(s->first_bad));
}

int main(int argc, char **argv)
{
	size_t mib = 256, nthreads = 4;

	victim_init(argc, argv);
	if (argc > 2)
		mib = strtoul(argv[2], NULL, 10);
	if (argc > 3)
		nthreads = strtoul(argv[3], NULL, 10);
	if (mib < 32 || nthreads < 1 || nthreads > MAX_THREADS)
		die("usage: lazy WORKDIR [MIB>=32] [THREADS 1-16]");
	big_len = mib * MIB;
	if (getrandom(&seed, sizeof(seed), 0) != sizeof(seed))
		die("getrandom");
	big = mmap(NULL, big_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (big == MAP_FAILED)
		die("mmap block");
	reserve = mmap(NULL, REGION, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (reserve == MAP_FAILED)
		die("mmap reservation");
	for (size_t i = 0; i < big_len / 8; i++)
		((uint64_t *)big)[i] = pattern(i);

	victim_ready_and_wait("ready");

	/* At once, while the server has most of the block still to fill. */
	if (madvise(big + drop_off(), REGION, MADV_DONTNEED) != 0)
		fail("madvise(MADV_DONTNEED): %s", strerror(errno));
	if (munmap(big + unmap_off(), REGION) != 0)
		fail("munmap: %s", strerror(errno));
	if (mmap(big + unmap_off(), REGION, PROT_READ | PROT_WRITE,
		 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0) != big + unmap_off())
		fail("mmap over the unmapped region: %s", strerror(errno));
	for (size_t off = write_off(); off < remap_off(); off += PG) {
		size_t i = off / 8;

		((uint64_t *)big)[i] = ~pattern(i);
	}
	if (mremap(big + remap_off(), REGION, REGION, MREMAP_MAYMOVE | MREMAP_FIXED,
		   reserve) != reserve)
		fail("mremap: %s", strerror(errno));
	if (mprotect(big + protect_off(), PROTECT_LEN, PROT_READ) != 0)
		fail("mprotect: %s", strerror(errno));

	pid_t child = fork();
	if (child < 0)
		fail("fork: %s", strerror(errno));
	if (child == 0) {
		struct slice all = { 0, big_len / 8, 0, 0 };

		check_slice(&all);
		_exit(all.bad ? 1 : 0);
	}

	/* The block below the special regions, in slices, concurrently. */
	struct slice slices[MAX_THREADS];
	pthread_t threads[MAX_THREADS];
	size_t lower = drop_off() / 8, per = lower / nthreads;

	for (size_t t = 0; t < nthreads; t++) {
		slices[t].from = t * per;
		slices[t].to = t + 1 == nthreads ? lower : (t + 1) * per;
		if (pthread_create(&threads[t], NULL, check_thread, &slices[t]) != 0)
			fail("pthread_create");
	}
	struct slice top = { lower, big_len / 8, 0, 0 };

	check_slice(&top);
	report("top regions", &top);
	for (size_t t = 0; t < nthreads; t++) {
		char who[64];

		pthread_join(threads[t], NULL);
		snprintf(who, sizeof(who), "thread %zu", t);
		report(who, &slices[t]);
	}
	if (child > 0) {
		int status;

		if (waitpid(child, &status, 0) != child)
			fail("waitpid: %s", strerror(errno));
		else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
			fail("the forked child found wrong memory (status %#x)", status);
	}
	victim_finish();
}
