/* Benchmark workloads for scripts/bench-dump.sh. Each sets up its memory,
 * prints "ready PID" on stdout, then sleeps; on SIGUSR1 (sent after a restore)
 * it checks its memory against the checksum taken at setup and prints
 * "verify ok" or "verify BAD" (one line per process).
 *
 *   benchload mem MIB mixed|random    one process
 *   benchload tree N MIB mixed|random N processes (the root and N-1 children)
 *   benchload vmas N                  N one-page VMAs of alternating protections
 *   benchload threads N               one process of N threads (each asleep, with a
 *                                     word of its own on its stack that it checks)
 *   benchload memcpy MIB              prints the seconds memcpy takes for MIB
 *
 * "mixed": 1/4 mapped but never written, 1/4 repetitive text, 1/2 random
 * (xorshift, incompressible); "random": all random.
 *
 * On SIGUSR2 (mem and tree) each process rewrites 1/REWRITE_PART (5 %) of
 * its written memory with new random data: one stretch from the start of
 * the written part when BENCHLOAD_SCATTER is unset, else one page in
 * REWRITE_PART throughout. It takes its checksum again and prints
 * "rewrote" (for the incremental dump: pre-dump, rewrite, dump). */
#define _GNU_SOURCE
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { MIB_SHIFT = 20, MAX_PROCS = 1024, MEMCPY_CHUNK_MIB = 256, REWRITE_PART = 20, PAGE = 4096 };

static const char TEXT[] = "ckpt benchmark: the quick brown fox jumps over the lazy dog 0123456789\n";

static volatile sig_atomic_t verify_asked, rewrite_asked;
/* threads mode: how many threads the process must have, and how many of
 * its workers found their stack word changed. */
static size_t expected_threads;
static volatile size_t threads_bad;

static void on_usr1(int sig) { (void)sig; verify_asked = 1; }
static void on_usr2(int sig) { (void)sig; rewrite_asked = 1; }

struct region {
	uint64_t *p;
	size_t bytes;
	size_t untouched; /* leading bytes never written: must read as zero */
	uint64_t sum;
};

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static uint64_t checksum(const uint64_t *p, size_t words)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < words; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

static void fill_random(uint64_t *p, size_t words, uint64_t seed)
{
	uint64_t x = seed | 1;
	for (size_t i = 0; i < words; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		p[i] = x;
	}
}

static void fill_text(char *p, size_t bytes)
{
	size_t n = sizeof(TEXT) - 1;
	for (size_t off = 0; off < bytes; off += n)
		memcpy(p + off, TEXT, bytes - off < n ? bytes - off : n);
}

static struct region setup_mem(size_t mib, int mixed, uint64_t seed)
{
	struct region r = { .bytes = mib << MIB_SHIFT };
	r.p = mmap(NULL, r.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (r.p == MAP_FAILED)
		die("mmap");
	char *c = (char *)r.p;
	if (mixed) {
		size_t q = r.bytes / 4;
		r.untouched = q;
		fill_text(c + q, q);
		fill_random((uint64_t *)(c + 2 * q), (r.bytes - 2 * q) / 8, seed);
	} else {
		fill_random(r.p, r.bytes / 8, seed);
	}
	r.sum = checksum((uint64_t *)(c + r.untouched), (r.bytes - r.untouched) / 8);
	return r;
}

static int region_ok(const struct region *r)
{
	const uint64_t *z = r->p;
	for (size_t i = 0; i < r->untouched / 8; i++)
		if (z[i])
			return 0;
	const char *c = (const char *)r->p;
	return checksum((const uint64_t *)(c + r->untouched), (r->bytes - r->untouched) / 8) == r->sum;
}

/* Rewrites 1/REWRITE_PART of the written memory with new random data. */
static void rewrite_some(struct region *r, uint64_t seed)
{
	char *c = (char *)r->p;
	size_t written = r->bytes - r->untouched;
	if (getenv("BENCHLOAD_SCATTER")) {
		for (size_t off = r->untouched; off + PAGE <= r->bytes; off += (size_t)REWRITE_PART * PAGE)
			fill_random((uint64_t *)(c + off), PAGE / 8, seed + off);
	} else {
		fill_random((uint64_t *)(c + r->untouched), written / REWRITE_PART / 8, seed);
	}
	r->sum = checksum((uint64_t *)(c + r->untouched), written / 8);
}

static void say_ready(void)
{
	printf("ready %d\n", (int)getpid());
	fflush(stdout);
}

static void say(const char *line)
{
	/* One write per line: the processes of a tree share stdout. */
	if (write(1, line, strlen(line)) < 0)
		exit(1);
}

/* The entries of /proc/self/task. */
static size_t count_threads(void)
{
	DIR *d = opendir("/proc/self/task");
	size_t n = 0;
	if (!d)
		return 0;
	for (struct dirent *e; (e = readdir(d));)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

/* A worker: a word of its own on its stack, checked after every wakeup. */
static void *worker(void *arg)
{
	volatile uint64_t mine = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull;
	for (;;) {
		struct timespec t = { .tv_sec = 1 };
		nanosleep(&t, NULL);
		if (mine != (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull)
			threads_bad++;
	}
	return NULL;
}

/* Sleeps; each SIGUSR1 checks the regions, each SIGUSR2 rewrites 5 % of
 * them (both passed on to children). */
static void serve(struct region *rs, size_t n, const pid_t *kids, size_t nkids)
{
	for (;;) {
		while (!verify_asked && !rewrite_asked)
			pause();
		if (rewrite_asked) {
			rewrite_asked = 0;
			for (size_t i = 0; i < nkids; i++)
				kill(kids[i], SIGUSR2);
			for (size_t i = 0; i < n; i++)
				rewrite_some(&rs[i], (uint64_t)getpid() * 7919);
			say("rewrote\n");
			continue;
		}
		verify_asked = 0;
		for (size_t i = 0; i < nkids; i++)
			kill(kids[i], SIGUSR1);
		int ok = 1;
		for (size_t i = 0; i < n; i++)
			ok &= region_ok(&rs[i]);
		if (expected_threads)
			ok &= count_threads() == expected_threads && !threads_bad;
		say(ok ? "verify ok\n" : "verify BAD\n");
	}
}

static int mixed_arg(const char *s)
{
	if (!strcmp(s, "mixed"))
		return 1;
	if (!strcmp(s, "random"))
		return 0;
	fprintf(stderr, "benchload: content must be mixed or random, not %s\n", s);
	exit(2);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void usage(void)
{
	fprintf(stderr, "usage: benchload mem MIB mixed|random | tree N MIB mixed|random | vmas N | threads N | memcpy MIB\n");
	exit(2);
}

int main(int argc, char **argv)
{
	/* Stray fds would be part of the checkpoint (and CRIU refuses some). */
	syscall(SYS_close_range, 3, ~0u, 0);
	struct sigaction sa = { .sa_handler = on_usr1 };
	sigaction(SIGUSR1, &sa, NULL);
	struct sigaction sa2 = { .sa_handler = on_usr2 };
	sigaction(SIGUSR2, &sa2, NULL);
	if (argc < 3)
		usage();
	const char *mode = argv[1];

	if (!strcmp(mode, "memcpy")) {
		size_t total = strtoull(argv[2], NULL, 10) << MIB_SHIFT;
		size_t chunk = (size_t)MEMCPY_CHUNK_MIB << MIB_SHIFT;
		char *a = malloc(chunk), *b = malloc(chunk);
		if (!a || !b)
			die("malloc");
		memset(a, 1, chunk);
		memset(b, 2, chunk);
		double t0 = now();
		for (size_t done = 0; done < total; done += chunk)
			memcpy(b, a, total - done < chunk ? total - done : chunk);
		double t1 = now();
		printf("%.6f %d\n", t1 - t0, b[chunk - 1]);
		return 0;
	}
	if (!strcmp(mode, "mem") && argc == 4) {
		struct region r = setup_mem(strtoull(argv[2], NULL, 10), mixed_arg(argv[3]), getpid());
		say_ready();
		serve(&r, 1, NULL, 0);
	}
	if (!strcmp(mode, "tree") && argc == 5) {
		size_t n = strtoull(argv[2], NULL, 10), mib = strtoull(argv[3], NULL, 10);
		int mixed = mixed_arg(argv[4]);
		if (n < 1 || n > MAX_PROCS)
			usage();
		static pid_t kids[MAX_PROCS];
		int ready[2];
		if (pipe(ready))
			die("pipe");
		for (size_t i = 0; i + 1 < n; i++) {
			pid_t k = fork();
			if (k < 0)
				die("fork");
			if (k == 0) {
				close(ready[0]);
				struct region r = setup_mem(mib, mixed, getpid());
				if (write(ready[1], "r", 1) != 1)
					die("write");
				close(ready[1]);
				serve(&r, 1, NULL, 0);
			}
			kids[i] = k;
		}
		close(ready[1]);
		struct region r = setup_mem(mib, mixed, getpid());
		char c;
		for (size_t i = 0; i + 1 < n; i++)
			if (read(ready[0], &c, 1) != 1)
				die("read");
		close(ready[0]);
		say_ready();
		serve(&r, 1, kids, n - 1);
	}
	if (!strcmp(mode, "vmas") && argc == 3) {
		size_t n = strtoull(argv[2], NULL, 10), page = sysconf(_SC_PAGESIZE);
		char *p = mmap(NULL, n * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (p == MAP_FAILED)
			die("mmap");
		fill_random((uint64_t *)p, n * page / 8, getpid());
		/* Every other page read-only: neighbours differ, so none merge. */
		for (size_t i = 1; i < n; i += 2)
			if (mprotect(p + i * page, page, PROT_READ))
				die("mprotect");
		struct region r = { .p = (uint64_t *)p, .bytes = n * page };
		r.sum = checksum(r.p, r.bytes / 8);
		say_ready();
		serve(&r, 1, NULL, 0);
	}
	if (!strcmp(mode, "threads") && argc == 3) {
		size_t n = strtoull(argv[2], NULL, 10);
		if (n < 1)
			usage();
		/* Signals go to the main thread, which serves them. */
		sigset_t block, old;
		sigemptyset(&block);
		sigaddset(&block, SIGUSR1);
		sigaddset(&block, SIGUSR2);
		pthread_sigmask(SIG_BLOCK, &block, &old);
		pthread_attr_t attr;
		pthread_attr_init(&attr);
		pthread_attr_setstacksize(&attr, 64 << 10);
		for (size_t i = 1; i < n; i++) {
			pthread_t t;
			if (pthread_create(&t, &attr, worker, (void *)(uintptr_t)i))
				die("pthread_create");
		}
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		expected_threads = n;
		struct region r = setup_mem(4, 1, getpid());
		say_ready();
		serve(&r, 1, NULL, 0);
	}
	usage();
}
