/*
 * Memory a process cannot read: guard regions (MADV_GUARD_INSTALL, Linux
 * 6.13+: pages inside a mapping that fault on any touch, as a thread
 * stack's guard or an allocator's red zone) and a PROT_NONE region that
 * holds data written before it was made inaccessible. After go: every
 * page around the guards keeps its bytes, each guard page still faults
 * (SIGSEGV) and the pages next to it do not, and the PROT_NONE region,
 * made readable again, holds its bytes.
 */
#include "victim.h"

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102
#endif

#define PG 4096UL
#define PAGES 8

/* Pages of the mapping made guards: one inside, one at the end. */
static const unsigned guards[] = { 2, 7 };

static unsigned char *area, *hidden;
static uint64_t page_hash[PAGES], hidden_hash;
static sigjmp_buf touched;

static void on_segv(int sig)
{
	(void)sig;
	siglongjmp(touched, 1);
}

/* Whether reading the byte at `p` faults. */
static int faults(volatile unsigned char *p)
{
	if (sigsetjmp(touched, 1))
		return 1;
	(void)*p;
	return 0;
}

static int is_guard(unsigned page)
{
	for (size_t i = 0; i < sizeof(guards) / sizeof(guards[0]); i++)
		if (guards[i] == page)
			return 1;
	return 0;
}

static void check(const char *when)
{
	for (unsigned i = 0; i < PAGES; i++) {
		unsigned char *page = area + i * PG;
		if (is_guard(i)) {
			if (!faults(page) || !faults(page + PG - 1))
				fail("%s: guard page %u can be read", when, i);
			continue;
		}
		if (faults(page))
			fail("%s: page %u faults", when, i);
		if (hash_bytes(page, PG, 0) != page_hash[i])
			fail("%s: page %u: contents changed", when, i);
	}
	if (!faults(hidden))
		fail("%s: the PROT_NONE region can be read", when);
	if (mprotect(hidden, PAGES * PG, PROT_READ) != 0)
		die("mprotect read");
	if (hash_bytes(hidden, PAGES * PG, 0) != hidden_hash)
		fail("%s: the PROT_NONE region's contents changed", when);
	if (mprotect(hidden, PAGES * PG, PROT_NONE) != 0)
		die("mprotect none");
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	struct sigaction sa = { .sa_handler = on_segv };
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, NULL) != 0)
		die("sigaction");

	area = mmap(NULL, PAGES * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (area == MAP_FAILED)
		die("mmap area");
	fill_pattern(area, PAGES * PG, 31);
	for (size_t i = 0; i < sizeof(guards) / sizeof(guards[0]); i++)
		if (madvise(area + guards[i] * PG, PG, MADV_GUARD_INSTALL) != 0)
			die("madvise MADV_GUARD_INSTALL");
	for (unsigned i = 0; i < PAGES; i++)
		if (!is_guard(i))
			page_hash[i] = hash_bytes(area + i * PG, PG, 0);

	hidden = mmap(NULL, PAGES * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
		      0);
	if (hidden == MAP_FAILED)
		die("mmap hidden");
	fill_pattern(hidden, PAGES * PG, 37);
	hidden_hash = hash_bytes(hidden, PAGES * PG, 0);
	if (mprotect(hidden, PAGES * PG, PROT_NONE) != 0)
		die("mprotect none");

	check("before the dump");
	victim_ready_and_wait("ready");
	check("after the restore");
	victim_finish();
}
