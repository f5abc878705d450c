/*
 * Memory victim: every kind of mapping a simple process has, with content
 * checksums and /proc/self/maps entries recorded before "ready" and compared
 * after "go".
 *
 * All arena regions are placed with MAP_FIXED_NOREPLACE inside one reserved
 * range, separated by unmapped one-page holes, so that the kernel never merges
 * two of them into one VMA: each region is exactly one maps entry, before and
 * after restore.
 */
#include "victim.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define PG 4096UL

enum kind {
	ANON,
	FILE_PRIVATE,
	FILE_SHARED,
	SHARED_ANON,
	RESERVED, /* PROT_NONE, never touched */
	RO_AFTER_WRITE,
	NONE_AFTER_WRITE,
};

struct region {
	const char *name;
	enum kind kind;
	size_t pages;
	size_t arena_page; /* filled in by layout() */
	unsigned char *addr;
	uint64_t hash;
};

static struct region regions[] = {
	{ "anon-1page", ANON, 1 },
	{ "anon-17pages-some-untouched", ANON, 17 },
	{ "anon-8MiB-sparse", ANON, 2048 },
	{ "file-private-cow", FILE_PRIVATE, 12 },
	{ "file-shared", FILE_SHARED, 8 },
	{ "shared-anon", SHARED_ANON, 5 },
	{ "prot-none-reserved", RESERVED, 32 },
	{ "written-then-read-only", RO_AFTER_WRITE, 6 },
	{ "written-then-prot-none", NONE_AFTER_WRITE, 3 },
};
#define NREGIONS (sizeof(regions) / sizeof(regions[0]))

/* Size of the private file and the offset (in pages) the mapping starts at. */
#define PRIV_FILE_PAGES 16
#define PRIV_FILE_OFF 2
#define SHARED_FILE_PAGES 8

static unsigned char *arena;
static size_t arena_len;
static char priv_path[PATH_MAX], shared_path[PATH_MAX];
static int shared_fd = -1;

/* Heap state. */
#define NSMALL 2000
static unsigned char *small_allocs[NSMALL];
static size_t small_sizes[NSMALL];
static uint64_t small_hash;
static unsigned char *big_alloc;
#define BIG_ALLOC_LEN (6UL << 20)
static uint64_t big_hash;
static unsigned char *sbrk_area;
#define SBRK_LEN (300UL << 10)
static uint64_t sbrk_hash;
static void *brk_before;

/* Parsed /proc/self/maps entries. */
struct mapent {
	unsigned long start, end, offset, inode;
	char perms[5];
	char path[256];
};
#define MAXENT 512
static struct mapent arena_before[MAXENT], arena_after[MAXENT];
static int n_arena_before, n_arena_after;
static struct mapent heap_before, heap_after;
static int have_heap_before, have_heap_after;
static char maps_buf[1 << 20];

static int parse_line(const char *line, struct mapent *e)
{
	int pathpos = 0;
	unsigned int maj, min;

	memset(e, 0, sizeof(*e));
	if (sscanf(line, "%lx-%lx %4s %lx %x:%x %lu %n", &e->start, &e->end, e->perms,
		   &e->offset, &maj, &min, &e->inode, &pathpos) < 7)
		return -1;
	if (pathpos > 0) {
		const char *p = line + pathpos;
		size_t n = strcspn(p, "\n");
		if (n >= sizeof(e->path))
			n = sizeof(e->path) - 1;
		memcpy(e->path, p, n);
		e->path[n] = '\0';
	}
	return 0;
}

/* Adjacent entries that are one logical mapping split in two VMAs. */
static int mergeable(const struct mapent *a, const struct mapent *b)
{
	if (a->end != b->start || strcmp(a->perms, b->perms) || strcmp(a->path, b->path))
		return 0;
	if (a->path[0] == '\0')
		return 1;
	return b->offset == a->offset + (a->end - a->start);
}

/* Snapshot the (merged) maps entries inside the arena, and the [heap] entry. */
static void snapshot_maps(struct mapent *out, int *n, struct mapent *heap, int *have_heap)
{
	char *line, *save = NULL;
	unsigned long lo = (unsigned long)arena, hi = lo + arena_len;

	*n = 0;
	*have_heap = 0;
	if (read_small_file("/proc/self/maps", maps_buf, sizeof(maps_buf)) == (size_t)-1)
		die("read /proc/self/maps");
	for (line = strtok_r(maps_buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		struct mapent e;

		if (parse_line(line, &e))
			continue;
		if (strcmp(e.path, "[heap]") == 0) {
			*heap = e;
			*have_heap = 1;
		}
		if (e.end <= lo || e.start >= hi)
			continue;
		if (*n > 0 && mergeable(&out[*n - 1], &e)) {
			out[*n - 1].end = e.end;
			continue;
		}
		if (*n < MAXENT)
			out[(*n)++] = e;
	}
}

static void fmt_ent(char *buf, size_t len, const struct mapent *e)
{
	snprintf(buf, len, "%lx-%lx %s %lx ino=%lu '%s'", e->start, e->end, e->perms,
		 e->offset, e->inode, e->path);
}

static int same_ent(const struct mapent *a, const struct mapent *b)
{
	/*
	 * The inode identifies the file for real file mappings; shmem objects
	 * (shared anon, "(deleted)") legitimately get a new inode on restore.
	 */
	int cmp_inode = a->path[0] == '/' && !strstr(a->path, "(deleted)");

	return a->start == b->start && a->end == b->end && !strcmp(a->perms, b->perms) &&
	       a->offset == b->offset && !strcmp(a->path, b->path) &&
	       (!cmp_inode || a->inode == b->inode);
}

static void compare_maps(void)
{
	char x[400], y[400];

	CHECK(n_arena_before == n_arena_after,
	      "arena has %d maps entries after restore, %d before", n_arena_after,
	      n_arena_before);
	for (int i = 0; i < n_arena_before && i < n_arena_after; i++) {
		if (!same_ent(&arena_before[i], &arena_after[i])) {
			fmt_ent(x, sizeof(x), &arena_before[i]);
			fmt_ent(y, sizeof(y), &arena_after[i]);
			fail("maps entry %d changed: before [%s] after [%s]", i, x, y);
		}
	}
	CHECK(have_heap_before == have_heap_after, "[heap] entry presence changed");
	if (have_heap_before && have_heap_after && !same_ent(&heap_before, &heap_after)) {
		fmt_ent(x, sizeof(x), &heap_before);
		fmt_ent(y, sizeof(y), &heap_after);
		fail("[heap] changed: before [%s] after [%s]", x, y);
	}
}

static void make_file(const char *path, size_t pages, uint64_t seed)
{
	static unsigned char page[PG];
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

	if (fd < 0)
		die("create mapped file");
	for (size_t i = 0; i < pages; i++) {
		fill_pattern(page, PG, seed + i);
		if (pwrite(fd, page, PG, (off_t)(i * PG)) != (ssize_t)PG)
			die("write mapped file");
	}
	close(fd);
}

static void layout(void)
{
	size_t next = 1;

	for (size_t i = 0; i < NREGIONS; i++) {
		regions[i].arena_page = next;
		next += regions[i].pages + 1; /* one-page hole after each region */
	}
	arena_len = (next + 1) * PG;
	arena = mmap(NULL, arena_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		     -1, 0);
	if (arena == MAP_FAILED)
		die("reserve arena");
	/* Only the address range was wanted: free it so holes stay unmapped. */
	munmap(arena, arena_len);
}

static void map_regions(void)
{
	for (size_t i = 0; i < NREGIONS; i++) {
		struct region *r = &regions[i];
		void *want = arena + r->arena_page * PG;
		size_t len = r->pages * PG;
		int prot = PROT_READ | PROT_WRITE;
		int flags = MAP_FIXED_NOREPLACE;
		int fd = -1;
		off_t off = 0;

		switch (r->kind) {
		case ANON:
		case RO_AFTER_WRITE:
		case NONE_AFTER_WRITE:
			flags |= MAP_PRIVATE | MAP_ANONYMOUS;
			break;
		case RESERVED:
			prot = PROT_NONE;
			flags |= MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
			break;
		case SHARED_ANON:
			flags |= MAP_SHARED | MAP_ANONYMOUS;
			break;
		case FILE_PRIVATE:
			fd = open(priv_path, O_RDONLY | O_CLOEXEC);
			flags |= MAP_PRIVATE;
			off = PRIV_FILE_OFF * PG;
			break;
		case FILE_SHARED:
			fd = open(shared_path, O_RDWR | O_CLOEXEC);
			flags |= MAP_SHARED;
			break;
		}
		if (r->kind == FILE_PRIVATE || r->kind == FILE_SHARED) {
			if (fd < 0)
				die("open mapped file");
		}
		r->addr = mmap(want, len, prot, flags, fd, off);
		if (r->addr == MAP_FAILED || r->addr != want)
			die(r->name);
		/* The mapping keeps the file referenced; the fd is not needed. */
		if (fd >= 0)
			close(fd);
	}
}

static void populate_regions(void)
{
	for (size_t i = 0; i < NREGIONS; i++) {
		struct region *r = &regions[i];
		size_t len = r->pages * PG;

		switch (r->kind) {
		case ANON:
			if (r->pages == 17) {
				/* Pages 3, 4 and 16 stay untouched (never faulted). */
				for (size_t p = 0; p < r->pages; p++)
					if (p != 3 && p != 4 && p != 16)
						fill_pattern(r->addr + p * PG, PG, 100 + p);
			} else if (r->pages == 2048) {
				for (size_t p = 0; p < r->pages; p += 97)
					fill_pattern(r->addr + p * PG, PG, 200 + p);
			} else {
				fill_pattern(r->addr, len, 7);
			}
			break;
		case FILE_PRIVATE: {
			/* Pages 1 and 5 become private copies (COW); 0-8 read; 9-11 untouched. */
			volatile unsigned char sink = 0;
			for (size_t p = 0; p <= 8; p++)
				sink ^= r->addr[p * PG + 17];
			(void)sink;
			fill_pattern(r->addr + 1 * PG, PG, 301);
			fill_pattern(r->addr + 5 * PG + 100, 1000, 305);
			break;
		}
		case FILE_SHARED:
			fill_pattern(r->addr + 0 * PG, PG, 400);
			fill_pattern(r->addr + 2 * PG, 2 * PG, 402);
			if (msync(r->addr, len, MS_SYNC))
				die("msync shared file");
			break;
		case SHARED_ANON:
			fill_pattern(r->addr, 4 * PG, 500);
			break;
		case RESERVED:
			break;
		case RO_AFTER_WRITE:
		case NONE_AFTER_WRITE:
			fill_pattern(r->addr, len, 600 + r->pages);
			break;
		}
		if (r->kind != RESERVED)
			r->hash = hash_bytes(r->addr, len, 0xcbf29ce484222325ULL);
		if (r->kind == RO_AFTER_WRITE && mprotect(r->addr, len, PROT_READ))
			die("mprotect read-only");
		if (r->kind == NONE_AFTER_WRITE && mprotect(r->addr, len, PROT_NONE))
			die("mprotect none");
	}
}

static uint64_t hash_small(void)
{
	uint64_t h = 0xcbf29ce484222325ULL;

	for (int i = 0; i < NSMALL; i++)
		h = hash_bytes(small_allocs[i], small_sizes[i], h);
	return h;
}

static void populate_heap(void)
{
	for (int i = 0; i < NSMALL; i++) {
		small_sizes[i] = 16 + (size_t)(i * 37) % 400;
		small_allocs[i] = malloc(small_sizes[i]);
		if (!small_allocs[i])
			die("malloc small");
		fill_pattern(small_allocs[i], small_sizes[i], 700 + (uint64_t)i);
	}
	small_hash = hash_small();

	/* Above the mmap threshold: malloc serves it from its own mapping. */
	big_alloc = malloc(BIG_ALLOC_LEN);
	if (!big_alloc)
		die("malloc big");
	fill_pattern(big_alloc, BIG_ALLOC_LEN, 800);
	big_hash = hash_bytes(big_alloc, BIG_ALLOC_LEN, 1);

	/* Explicit brk growth on top of what malloc did. */
	sbrk_area = sbrk(SBRK_LEN);
	if (sbrk_area == (void *)-1)
		die("sbrk");
	fill_pattern(sbrk_area, SBRK_LEN, 900);
	sbrk_hash = hash_bytes(sbrk_area, SBRK_LEN, 2);
}

static void verify_heap(void)
{
	CHECK(hash_small() == small_hash, "small malloc'ed blocks changed");
	CHECK(hash_bytes(big_alloc, BIG_ALLOC_LEN, 1) == big_hash, "big malloc'ed block changed");
	CHECK(hash_bytes(sbrk_area, SBRK_LEN, 2) == sbrk_hash, "sbrk'ed area changed");
}

static void verify_regions(void)
{
	for (size_t i = 0; i < NREGIONS; i++) {
		struct region *r = &regions[i];
		size_t len = r->pages * PG;

		if (r->kind == RESERVED)
			continue;
		if (r->kind == NONE_AFTER_WRITE && mprotect(r->addr, len, PROT_READ)) {
			fail("%s: mprotect back to PROT_READ: %s", r->name, strerror(errno));
			continue;
		}
		CHECK(hash_bytes(r->addr, len, 0xcbf29ce484222325ULL) == r->hash,
		      "%s: content checksum changed", r->name);
	}
}

static struct region *find_kind(enum kind k)
{
	for (size_t i = 0; i < NREGIONS; i++)
		if (regions[i].kind == k)
			return &regions[i];
	return NULL;
}

/* The semantics of the mappings, not just their bytes, must survive. */
static void verify_semantics(void)
{
	struct region *r;
	unsigned char byte, file_byte;
	struct stat shared_st;

	/* Reserved PROT_NONE range must still be real zero-filled memory. */
	r = find_kind(RESERVED);
	if (mprotect(r->addr, r->pages * PG, PROT_READ | PROT_WRITE)) {
		fail("reserved: mprotect rw: %s", strerror(errno));
	} else {
		for (size_t i = 0; i < r->pages * PG; i++)
			if (r->addr[i] != 0) {
				fail("reserved: byte %zu is %u, want 0", i, r->addr[i]);
				break;
			}
		r->addr[5] = 1;
	}

	/* Shared file mapping: both directions must reach the file. */
	r = find_kind(FILE_SHARED);
	shared_fd = open(shared_path, O_RDWR | O_CLOEXEC);
	if (shared_fd < 0 || fstat(shared_fd, &shared_st) != 0) {
		fail("open %s: %s", shared_path, strerror(errno));
	} else {
		byte = r->addr[2 * PG + 9];
		r->addr[2 * PG + 9] = (unsigned char)(byte ^ 0x5a);
		msync(r->addr, r->pages * PG, MS_SYNC);
		CHECK(pread(shared_fd, &file_byte, 1, 2 * PG + 9) == 1 && file_byte == (byte ^ 0x5a),
		      "shared file mapping: store through mapping not visible in file");
		/* Put the original byte back so the same images can be restored again. */
		r->addr[2 * PG + 9] = byte;
		msync(r->addr, r->pages * PG, MS_SYNC);

		byte = r->addr[6 * PG + 3];
		file_byte = (unsigned char)(byte ^ 0xa5);
		CHECK(pwrite(shared_fd, &file_byte, 1, 6 * PG + 3) == 1, "pwrite shared file");
		CHECK(r->addr[6 * PG + 3] == file_byte,
		      "shared file mapping: write to file not visible in mapping");
		CHECK(pwrite(shared_fd, &byte, 1, 6 * PG + 3) == 1, "pwrite shared file back");
		/*
		 * Content is back to what was dumped; put the mtime back too, so
		 * images taken by a leave-running dump stay restorable (a
		 * restorer may rightly refuse a mapped file changed since dump).
		 */
		msync(r->addr, r->pages * PG, MS_SYNC);
		{
			struct timespec times[2] = { shared_st.st_atim, shared_st.st_mtim };
			CHECK(futimens(shared_fd, times) == 0, "futimens shared file: %s",
			      strerror(errno));
		}
		close(shared_fd);
	}

	/* Private file mapping: the COW'ed pages must not have reached the file. */
	r = find_kind(FILE_PRIVATE);
	{
		int fd = open(priv_path, O_RDONLY | O_CLOEXEC);
		static unsigned char page[PG], want[PG];

		if (fd < 0 || pread(fd, page, PG, (PRIV_FILE_OFF + 1) * PG) != (ssize_t)PG) {
			fail("read %s: %s", priv_path, strerror(errno));
		} else {
			fill_pattern(want, PG, 1000 + PRIV_FILE_OFF + 1);
			CHECK(memcmp(page, want, PG) == 0,
			      "private file mapping: COW page leaked into the file");
		}
		if (fd >= 0)
			close(fd);
	}

	/* Shared anonymous memory must still be shared with a forked child. */
	r = find_kind(SHARED_ANON);
	{
		unsigned char old = r->addr[3 * PG];
		pid_t child = fork();
		int status = 0;

		if (child == 0) {
			r->addr[3 * PG] = (unsigned char)(old + 1);
			_exit(0);
		}
		if (child < 0 || waitpid(child, &status, 0) != child) {
			fail("fork/wait for shared-anon check: %s", strerror(errno));
		} else {
			CHECK(r->addr[3 * PG] == (unsigned char)(old + 1),
			      "shared anonymous mapping is no longer shared (child store not seen)");
		}
		r->addr[3 * PG] = old;
	}
}

/* The restored process must be able to keep allocating. */
static void verify_growth(void)
{
	unsigned char *more = sbrk(1 << 20);
	static unsigned char *blocks[100];
	unsigned char *huge;

	if (more == (void *)-1) {
		fail("sbrk growth after restore failed: %s", strerror(errno));
	} else {
		CHECK(more == brk_before, "sbrk returned %p, expected old break %p", (void *)more,
		      brk_before);
		memset(more, 0x11, 1 << 20);
	}
	for (int i = 0; i < 100; i++) {
		blocks[i] = malloc(50 << 10);
		if (!blocks[i]) {
			fail("malloc after restore failed");
			return;
		}
		memset(blocks[i], i, 50 << 10);
	}
	huge = malloc(32UL << 20);
	if (!huge) {
		fail("32 MiB malloc after restore failed");
		return;
	}
	memset(huge, 0x22, 32UL << 20);
	for (int i = 0; i < 100; i++)
		CHECK(blocks[i][(50 << 10) - 1] == (unsigned char)i, "malloc block %d corrupted", i);
	CHECK(huge[12345] == 0x22, "huge block corrupted");
}

#define STACK_BUF (256 << 10)

/*
 * Keeps a big frame live on the stack for the whole wait, so the stack
 * contents (not just the VMA) must be restored.  noinline so the frame is
 * real; volatile so the compiler cannot drop or cache the buffer.
 */
static __attribute__((noinline)) void stack_frame_and_wait(void)
{
	volatile unsigned char buf[STACK_BUF];
	uint64_t h;

	fill_pattern(buf, sizeof(buf), 1234);
	h = hash_bytes(buf, sizeof(buf), 3);

	brk_before = sbrk(0);
	snapshot_maps(arena_before, &n_arena_before, &heap_before, &have_heap_before);

	victim_ready_and_wait(NULL);

	/* First things first: nothing below may move the break before we look. */
	CHECK(sbrk(0) == brk_before, "brk changed: %p, was %p", sbrk(0), brk_before);
	snapshot_maps(arena_after, &n_arena_after, &heap_after, &have_heap_after);
	compare_maps();
	CHECK(hash_bytes(buf, sizeof(buf), 3) == h, "stack buffer changed");
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	snprintf(priv_path, sizeof(priv_path), "%s/private.bin", victim_workdir);
	snprintf(shared_path, sizeof(shared_path), "%s/shared.bin", victim_workdir);
	make_file(priv_path, PRIV_FILE_PAGES, 1000);
	make_file(shared_path, SHARED_FILE_PAGES, 2000);

	layout();
	map_regions();
	populate_regions();
	populate_heap();

	stack_frame_and_wait();

	verify_regions();
	verify_heap();
	verify_semantics();
	verify_growth();
	victim_finish();
}
