/*
 * Adjacent anonymous mappings the kernel keeps apart: same protection and
 * flags, side by side, but each with its own anon_vma (each was written
 * before it was moved next to the other with mremap), so /proc/self/maps
 * shows them as separate entries. A restore that maps them side by side
 * naively gets one merged VMA. Three chains: read-write, read-only (written,
 * then mprotect), and one whose middle part was never touched after the
 * move (only its first page is resident). After go, each region's bytes
 * and the maps entries of the whole arena must be as they were.
 */
#include "victim.h"

#include <sys/mman.h>

#define PG 4096UL
#define PARTS 3
#define PART_PAGES 4
#define ARENA_PAGES (PARTS * PART_PAGES + 2)

static char maps_after[2048];

/* The maps lines of the chain at `chain`, concatenated. */
static void chain_maps(const unsigned char *chain, char *out, size_t cap)
{
	static char buf[1 << 20];
	char *line, *save = NULL;
	size_t used = 0;
	if (read_small_file("/proc/self/maps", buf, sizeof(buf)) == (size_t)-1)
		die("read maps");
	out[0] = '\0';
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		unsigned long s, e;
		if (sscanf(line, "%lx-%lx", &s, &e) != 2)
			continue;
		if (s < (unsigned long)chain || e > (unsigned long)chain + PARTS * PART_PAGES * PG)
			continue;
		used += snprintf(out + used, cap - used, "%.32s\n", line);
		if (used >= cap)
			die("arena maps too long");
	}
}

/* One chain: PARTS parts of PART_PAGES pages at `at`, each written elsewhere
 * first and moved into place, then given `prot`. */
static void chain(unsigned char *at, int prot, uint64_t seed, int touch_all)
{
	for (int i = 0; i < PARTS; i++) {
		unsigned char *p = mmap(NULL, PART_PAGES * PG, PROT_READ | PROT_WRITE,
					MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			die("mmap part");
		if (touch_all || i != 1)
			fill_pattern(p, PART_PAGES * PG, seed + (uint64_t)i);
		else
			p[0] = 0x5a;
		if (mremap(p, PART_PAGES * PG, PART_PAGES * PG, MREMAP_MAYMOVE | MREMAP_FIXED,
			   at + (size_t)i * PART_PAGES * PG) == MAP_FAILED)
			die("mremap part");
	}
	if (mprotect(at, PARTS * PART_PAGES * PG, prot) != 0)
		die("mprotect chain");
}

static uint64_t chain_hash(unsigned char *at)
{
	return hash_bytes(at, PARTS * PART_PAGES * PG, 0);
}

int main(int argc, char **argv)
{
	unsigned char *chains[3];
	uint64_t hashes[3];
	victim_init(argc, argv);
	/* Three arenas of their own, reserved PROT_NONE so no other mapping
	 * lands there; the parts replace the reservation, which stays as a
	 * guard page on either side. */
	for (int c = 0; c < 3; c++) {
		unsigned char *arena = mmap(NULL, ARENA_PAGES * PG, PROT_NONE,
					    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (arena == MAP_FAILED)
			die("reserve arena");
		chains[c] = arena + PG;
		chain(chains[c], c == 1 ? PROT_READ : PROT_READ | PROT_WRITE, 100 * (uint64_t)c,
		      c != 2);
		hashes[c] = chain_hash(chains[c]);
	}
	char before[3][2048];
	for (int c = 0; c < 3; c++) {
		chain_maps(chains[c], before[c], sizeof(before[c]));
		int lines = 0;
		for (char *p = before[c]; *p; p++)
			lines += *p == '\n';
		if (lines != PARTS)
			fail("chain %d: the kernel shows %d entries before the dump, not %d:\n%s", c,
			     lines, PARTS, before[c]);
	}
	victim_ready_and_wait("ready");
	for (int c = 0; c < 3; c++) {
		chain_maps(chains[c], maps_after, sizeof(maps_after));
		if (strcmp(before[c], maps_after) != 0)
			fail("chain %d: maps entries changed:\n--- before\n%s--- after\n%s", c,
			     before[c], maps_after);
		if (chain_hash(chains[c]) != hashes[c])
			fail("chain %d: contents changed", c);
	}
	victim_finish();
}
