/*
 * Memory advice that changes what a process sees: a region advised
 * MADV_DONTFORK is not in a child, one advised MADV_WIPEONFORK is zero in
 * a child, MADV_DONTDUMP keeps a region out of a core dump,
 * MADV_HUGEPAGE / MADV_NOHUGEPAGE steer transparent huge pages. Each is a
 * region of its own, written with its own pattern. After go, each region
 * still has its bytes and its flag in /proc/self/smaps (VmFlags dc, wf,
 * dd, hg, nh), and a child forked then sees the DONTFORK region unmapped
 * and the WIPEONFORK one zeroed while the others are copied.
 */
#include "victim.h"

#include <sys/mman.h>
#include <sys/wait.h>

#define PG 4096UL
#define PAGES 4
#define REGIONS 5

struct region {
	const char *name;
	int advice;
	const char *vmflag;
	unsigned char *at;
	uint64_t hash;
};

static struct region regions[REGIONS] = {
	{ "dontfork", MADV_DONTFORK, "dc", NULL, 0 },
	{ "wipeonfork", MADV_WIPEONFORK, "wf", NULL, 0 },
	{ "dontdump", MADV_DONTDUMP, "dd", NULL, 0 },
	{ "hugepage", MADV_HUGEPAGE, "hg", NULL, 0 },
	{ "nohugepage", MADV_NOHUGEPAGE, "nh", NULL, 0 },
};

/* Whether the smaps entry starting at `at` lists `flag` in its VmFlags. */
static int has_vmflag(const unsigned char *at, const char *flag)
{
	static char buf[1 << 20];
	char head[32], *entry, *flags, *eol;
	if (read_small_file("/proc/self/smaps", buf, sizeof(buf)) == (size_t)-1)
		die("read smaps");
	snprintf(head, sizeof(head), "%lx-", (unsigned long)at);
	entry = strstr(buf, head);
	if (!entry || (entry != buf && entry[-1] != '\n'))
		return 0;
	flags = strstr(entry, "VmFlags:");
	if (!flags)
		return 0;
	eol = strchr(flags, '\n');
	if (eol)
		*eol = '\0';
	for (char *tok = strtok(flags + 8, " "); tok; tok = strtok(NULL, " "))
		if (strcmp(tok, flag) == 0)
			return 1;
	return 0;
}

static int all_zero(const unsigned char *p, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (p[i])
			return 0;
	return 1;
}

/* In a child: 0 when it sees what fork promises, else which check failed. */
static int child_sees(void)
{
	unsigned char vec[PAGES];
	/* Not mapped at all: mincore says ENOMEM. */
	if (mincore(regions[0].at, PAGES * PG, vec) == 0 || errno != ENOMEM)
		return 10;
	if (!all_zero(regions[1].at, PAGES * PG))
		return 11;
	for (int i = 2; i < REGIONS; i++)
		if (hash_bytes(regions[i].at, PAGES * PG, 0) != regions[i].hash)
			return 12 + i;
	return 0;
}

static void check(const char *when)
{
	for (int i = 0; i < REGIONS; i++) {
		struct region *r = &regions[i];
		if (hash_bytes(r->at, PAGES * PG, 0) != r->hash)
			fail("%s: region %s: contents changed", when, r->name);
		if (!has_vmflag(r->at, r->vmflag))
			fail("%s: region %s: VmFlags without %s", when, r->name, r->vmflag);
	}
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0)
		_exit(child_sees());
	int status;
	if (waitpid(child, &status, 0) != child)
		die("waitpid");
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		fail("%s: a child sees the advice broken (status %#x)", when, status);
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	for (int i = 0; i < REGIONS; i++) {
		struct region *r = &regions[i];
		r->at = mmap(NULL, PAGES * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			     -1, 0);
		if (r->at == MAP_FAILED)
			die("mmap region");
		fill_pattern(r->at, PAGES * PG, 7 + (uint64_t)i);
		r->hash = hash_bytes(r->at, PAGES * PG, 0);
		if (madvise(r->at, PAGES * PG, r->advice) != 0)
			die("madvise");
	}
	check("before the dump");
	victim_ready_and_wait("ready");
	check("after the restore");
	victim_finish();
}
