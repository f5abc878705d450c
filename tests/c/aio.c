/*
 * aio contexts (io_setup): two contexts read a file with io_submit (raw
 * syscalls). Each reaps some completions and leaves the others in its
 * ring; the second went round its ring first, so what it left straddles
 * the ring's end. After go: io_getevents returns exactly the completions
 * left (their data, obj and res, in order) on the old context ids, new
 * reads submitted there complete with the file's bytes, and io_destroy
 * succeeds.
 *
 * With argv[2] "inherited": a child forked after io_setup maps the ring
 * but has no context (the dump must refuse it by name); after go the
 * child's io_getevents still fails with EINVAL and the parent's context
 * still works.
 */
#include "victim.h"

#include <linux/aio_abi.h>
#include <sys/syscall.h>

#define BLOCK 512
#define BLOCKS 16
#define LEFT 4 /* completions left in each ring at the dump */

struct ring_header {
	unsigned id, nr, head, tail, magic, compat_features, incompat_features, header_length;
};

static int fd;
static struct iocb iocbs[BLOCKS];
static char bufs[BLOCKS][BLOCK];

static long io_setup(unsigned nr, aio_context_t *ctx) { return syscall(SYS_io_setup, nr, ctx); }
static long io_submit(aio_context_t ctx, long n, struct iocb **iocbs)
{
	return syscall(SYS_io_submit, ctx, n, iocbs);
}
static long io_getevents(aio_context_t ctx, long min, long max, struct io_event *ev)
{
	struct timespec none = { 0, 0 };
	return syscall(SYS_io_getevents, ctx, min, max, ev, min ? NULL : &none);
}

static char pattern(int block, int i) { return (char)('a' + (block * 7 + i) % 26); }

/* Reads of blocks first..first+n, tagged with tag + block. */
static void submit(aio_context_t ctx, int first, int n, uint64_t tag)
{
	struct iocb *p[BLOCKS];
	for (int i = 0; i < n; i++) {
		int b = first + i;
		memset(&iocbs[b], 0, sizeof(iocbs[b]));
		memset(bufs[b], 0, BLOCK);
		iocbs[b].aio_data = tag + (uint64_t)b;
		iocbs[b].aio_lio_opcode = IOCB_CMD_PREAD;
		iocbs[b].aio_fildes = (uint32_t)fd;
		iocbs[b].aio_buf = (uint64_t)(uintptr_t)bufs[b];
		iocbs[b].aio_nbytes = BLOCK;
		iocbs[b].aio_offset = (int64_t)b * BLOCK;
		p[i] = &iocbs[b];
	}
	if (io_submit(ctx, n, p) != n)
		die("io_submit");
}

/* Waits for n completions, which must be the reads of blocks first.. */
static void reap(const char *when, aio_context_t ctx, int first, int n, uint64_t tag)
{
	struct io_event ev[BLOCKS];
	long got = io_getevents(ctx, n, n, ev);
	CHECK(got == n, "%s: io_getevents: %ld of %d (%s)", when, got, n, strerror(errno));
	for (long i = 0; i < got; i++) {
		int b = first + (int)i;
		CHECK(ev[i].data == tag + (uint64_t)b && ev[i].obj == (uint64_t)(uintptr_t)&iocbs[b] &&
			      ev[i].res == BLOCK,
		      "%s: event %ld: data %#llx obj %#llx res %lld, want block %d", when, i,
		      (unsigned long long)ev[i].data, (unsigned long long)ev[i].obj,
		      (long long)ev[i].res, b);
		for (int j = 0; j < BLOCK; j++)
			if (bufs[b][j] != pattern(b, j)) {
				fail("%s: block %d byte %d wrong", when, b, j);
				break;
			}
	}
}

/* Nothing more to reap. */
static void empty(const char *when, aio_context_t ctx)
{
	struct io_event ev[1];
	long got = io_getevents(ctx, 0, 1, ev);
	CHECK(got == 0, "%s: %ld completions more than left", when, got);
}

static void inherited(void)
{
	aio_context_t ctx = 0;
	if (io_setup(4, &ctx))
		die("io_setup");
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		victim_child_wait_go(70);
		struct io_event ev[1];
		_exit(io_getevents(ctx, 0, 1, ev) == -1 && errno == EINVAL ? 0 : 71);
	}
	victim_ready_and_wait("ready");
	int st;
	CHECK(waitpid(child, &st, 0) == child && WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "child: status %#x", st);
	submit(ctx, 0, 2, 0x6000);
	reap("after the refused dump", ctx, 0, 2, 0x6000);
	CHECK(syscall(SYS_io_destroy, ctx) == 0, "io_destroy: %s", strerror(errno));
	victim_finish();
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	char path[PATH_MAX];
	victim_path(path, sizeof(path), "aio-data");
	fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (fd < 0)
		die("open data file");
	for (int b = 0; b < BLOCKS; b++) {
		char block[BLOCK];
		for (int j = 0; j < BLOCK; j++)
			block[j] = pattern(b, j);
		victim_write_all(fd, block, BLOCK);
	}
	if (argc > 2 && !strcmp(argv[2], "inherited"))
		inherited();

	aio_context_t plain = 0, wrapped = 0;
	if (io_setup(128, &plain) || io_setup(16, &wrapped))
		die("io_setup");
	/* plain: six reads, two reaped. */
	submit(plain, 0, LEFT + 2, 0x1000);
	reap("before the dump", plain, 0, 2, 0x1000);
	/* wrapped: round the ring until four slots before its end, then six
	 * reads, two reaped: the four left run past the end. */
	struct ring_header *w = (struct ring_header *)wrapped;
	unsigned nr = w->nr;
	while (w->tail != nr - 4) {
		unsigned n = nr - 4 - w->tail < BLOCKS ? nr - 4 - w->tail : BLOCKS;
		submit(wrapped, 0, (int)n, 0x2000);
		reap("going round", wrapped, 0, (int)n, 0x2000);
	}
	submit(wrapped, 0, LEFT + 2, 0x3000);
	reap("before the dump", wrapped, 0, 2, 0x3000);
	CHECK(w->tail < w->head, "wrapped ring did not wrap: head %u tail %u", w->head, w->tail);

	victim_ready_and_wait("ready");

	/* The completions left, and only them. */
	reap("after the restore", plain, 2, LEFT, 0x1000);
	empty("after the restore", plain);
	reap("after the restore", wrapped, 2, LEFT, 0x3000);
	empty("after the restore", wrapped);
	/* The contexts still take requests. */
	submit(plain, 8, 3, 0x4000);
	reap("new reads", plain, 8, 3, 0x4000);
	submit(wrapped, 0, BLOCKS, 0x5000);
	reap("new reads", wrapped, 0, BLOCKS, 0x5000);
	CHECK(syscall(SYS_io_destroy, plain) == 0, "io_destroy: %s", strerror(errno));
	CHECK(syscall(SYS_io_destroy, wrapped) == 0, "io_destroy: %s", strerror(errno));
	victim_finish();
}
