/*
 * Clock victim: calls every time function glibc routes through the vDSO
 * (clock_gettime on several clocks, clock_getres, gettimeofday, time,
 * getcpu) before ready and again after go, so a restore on another kernel
 * (tests/vdso_proxy.rs) exercises the vDSO proxy: glibc keeps calling the
 * entry points it found at startup, in the dumped vDSO.
 *
 * After go it checks that every call succeeds, that the readings agree with
 * each other and move forwards (monotonic never backwards, a 50 ms sleep
 * seen as 50 ms), and that the wall clock went on from the one at ready.
 * CLOCK_MONOTONIC itself is not compared across the restore: another
 * machine's boot started at another time.
 *
 * A child forked before ready runs the same checks and reports by its exit
 * status, so the restore is of a two-process tree.
 *
 * It also writes WORKDIR/vdso: "ehdr=ADDR named=N", N being 1 when the
 * vDSO image glibc uses (AT_SYSINFO_EHDR) is the kernel's [vdso] mapping,
 * 0 when it is something else (the proxy: an anonymous mapping holding the
 * dumped vDSO).
 */
#include "victim.h"

#include <sched.h>
#include <sys/auxv.h>
#include <sys/time.h>

static char maps_buf[1 << 16];

static int64_t ns_of(const struct timespec *t)
{
	return (int64_t)t->tv_sec * 1000000000LL + t->tv_nsec;
}

/* Whether the /proc/self/maps line starting at `addr` is [vdso]. */
static int is_named_vdso(unsigned long addr)
{
	char prefix[32];
	size_t len = read_small_file("/proc/self/maps", maps_buf, sizeof(maps_buf) - 1);
	char *line, *end;

	if (len == (size_t)-1)
		return -1;
	maps_buf[len] = '\0';
	snprintf(prefix, sizeof(prefix), "%lx-", addr);
	for (line = maps_buf; *line; line = end + 1) {
		end = strchr(line, '\n');
		if (!end)
			end = line + strlen(line);
		if (strncmp(line, prefix, strlen(prefix)) == 0) {
			*end = '\0';
			return strstr(line, "[vdso]") != NULL;
		}
		if (!*end)
			break;
	}
	return -1;
}

/* One round of every call; failures are recorded. Returns monotonic ns. */
static int64_t round_of_calls(int64_t *prev_mono)
{
	static const clockid_t clocks[] = { CLOCK_MONOTONIC, CLOCK_REALTIME,
					    CLOCK_BOOTTIME, CLOCK_MONOTONIC_COARSE,
					    CLOCK_REALTIME_COARSE, CLOCK_TAI,
					    CLOCK_MONOTONIC_RAW };
	struct timespec ts, mono, real, res;
	struct timeval tv;
	unsigned cpu = ~0u, node = ~0u;
	time_t t;
	size_t i;

	for (i = 0; i < sizeof(clocks) / sizeof(clocks[0]); i++) {
		CHECK(clock_gettime(clocks[i], &ts) == 0, "clock_gettime(%d): %s", (int)clocks[i],
		      strerror(errno));
		CHECK(clock_getres(clocks[i], &res) == 0, "clock_getres(%d): %s", (int)clocks[i],
		      strerror(errno));
		CHECK(res.tv_sec == 0 && res.tv_nsec > 0, "clock_getres(%d) = %ld.%09ld",
		      (int)clocks[i], (long)res.tv_sec, res.tv_nsec);
	}
	CHECK(clock_gettime(CLOCK_MONOTONIC, &mono) == 0, "clock_gettime(MONOTONIC)");
	CHECK(ns_of(&mono) >= *prev_mono, "CLOCK_MONOTONIC went back: %lld after %lld",
	      (long long)ns_of(&mono), (long long)*prev_mono);
	*prev_mono = ns_of(&mono);
	CHECK(clock_gettime(CLOCK_REALTIME, &real) == 0, "clock_gettime(REALTIME)");
	CHECK(gettimeofday(&tv, NULL) == 0, "gettimeofday: %s", strerror(errno));
	t = time(NULL);
	CHECK(real.tv_sec > 1600000000, "CLOCK_REALTIME %ld is before 2020", (long)real.tv_sec);
	CHECK(tv.tv_sec >= real.tv_sec && tv.tv_sec - real.tv_sec <= 1,
	      "gettimeofday %ld vs CLOCK_REALTIME %ld", (long)tv.tv_sec, (long)real.tv_sec);
	CHECK(t >= real.tv_sec - 1 && t - real.tv_sec <= 1, "time() %ld vs CLOCK_REALTIME %ld",
	      (long)t, (long)real.tv_sec);
	CHECK(getcpu(&cpu, &node) == 0, "getcpu: %s", strerror(errno));
	CHECK(cpu < 4096 && node < 4096, "getcpu gave cpu %u node %u", cpu, node);
	return *prev_mono;
}

static struct timespec ready_real;

/* After go: every call many times, the wall clock went on, time passes. */
static void check_after_go(void)
{
	struct timespec real, nap = { 0, 50 * 1000 * 1000 };
	int64_t mono = 0, before, after, real_before;
	int i;

	for (i = 0; i < 1000; i++)
		round_of_calls(&mono);
	clock_gettime(CLOCK_REALTIME, &real);
	CHECK(real.tv_sec >= ready_real.tv_sec - 2,
	      "the wall clock went back over the restore: %ld after %ld", (long)real.tv_sec,
	      (long)ready_real.tv_sec);
	CHECK(real.tv_sec - ready_real.tv_sec < 3600,
	      "the wall clock jumped an hour over the restore: %ld after %ld", (long)real.tv_sec,
	      (long)ready_real.tv_sec);

	before = round_of_calls(&mono);
	clock_gettime(CLOCK_REALTIME, &real);
	real_before = ns_of(&real);
	nanosleep(&nap, NULL);
	after = round_of_calls(&mono);
	clock_gettime(CLOCK_REALTIME, &real);
	CHECK(after - before >= 45000000LL && after - before < 10000000000LL,
	      "a 50 ms sleep took %lld ns of CLOCK_MONOTONIC", (long long)(after - before));
	CHECK(ns_of(&real) - real_before >= 45000000LL &&
		      ns_of(&real) - real_before < 10000000000LL,
	      "a 50 ms sleep took %lld ns of CLOCK_REALTIME",
	      (long long)(ns_of(&real) - real_before));
}

int main(int argc, char **argv)
{
	int64_t mono = 0;
	unsigned long ehdr;
	char line[96];
	pid_t child;
	int i, status;

	victim_init(argc, argv);
	for (i = 0; i < 100; i++)
		round_of_calls(&mono);
	clock_gettime(CLOCK_REALTIME, &ready_real);
	/* A child does the same, so the restore is of a tree: each process
	 * gets its own proxy. */
	child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		victim_child_wait_go(90);
		check_after_go();
		_exit(victim_failures ? 1 : 0);
	}
	victim_ready_and_wait(NULL);

	check_after_go();
	CHECK(waitpid(child, &status, 0) == child, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "the child failed its clock checks (status %#x)", status);

	ehdr = getauxval(AT_SYSINFO_EHDR);
	snprintf(line, sizeof(line), "ehdr=%lx named=%d\n", ehdr, ehdr ? is_named_vdso(ehdr) : -1);
	victim_write_file("vdso", line);
	victim_finish();
}
