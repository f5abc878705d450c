/*
 * Memfds and /dev/zero at their edges, each checked from inside after
 * restore:
 *   - a memfd sealed F_SEAL_WRITE, mapped shared read-only, its fd kept:
 *     the seal still refuses writes, the mapping holds the bytes;
 *   - a memfd mapped shared writable, then sealed F_SEAL_FUTURE_WRITE, its
 *     fd kept: the fd refuses writes, the old mapping still writes, and
 *     what it writes is read through the fd;
 *   - a memfd mapped shared, its fd closed: the mapping keeps its bytes
 *     and its name, and is still the one object after restore (a write
 *     shows through a second mapping of it);
 *   - /dev/zero mapped shared with its fd kept open: the fd is still
 *     /dev/zero and the mapping still holds what was written in it.
 */
#include "victim.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>

#define PG 4096ul
#define FD_SEALED 30
#define FD_FUTURE 31
#define FD_ZERO 32

static char pattern[2 * PG];
static const unsigned char *sealed_map;
static unsigned char *future_map;
static unsigned char *closed_a, *closed_b;
static unsigned char *zero_map;

static int make_memfd(const char *name, int want_fd)
{
	int fd = memfd_create(name, MFD_ALLOW_SEALING);

	if (fd < 0 || write(fd, pattern, sizeof(pattern)) != (ssize_t)sizeof(pattern))
		die("memfd_create");
	if (want_fd < 0)
		return fd;
	victim_fd_at(fd, want_fd);
	return want_fd;
}

static void setup(void)
{
	fill_pattern(pattern, sizeof(pattern), 61);

	make_memfd("sealed", FD_SEALED);
	if (fcntl(FD_SEALED, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW))
		die("F_SEAL_WRITE");
	sealed_map = mmap(NULL, sizeof(pattern), PROT_READ, MAP_SHARED, FD_SEALED, 0);
	if (sealed_map == MAP_FAILED)
		die("mmap sealed");

	make_memfd("future", FD_FUTURE);
	future_map = mmap(NULL, sizeof(pattern), PROT_READ | PROT_WRITE, MAP_SHARED, FD_FUTURE, 0);
	if (future_map == MAP_FAILED)
		die("mmap future");
	if (fcntl(FD_FUTURE, F_ADD_SEALS, F_SEAL_FUTURE_WRITE))
		die("F_SEAL_FUTURE_WRITE");

	int fd = make_memfd("closed", -1);
	closed_a = mmap(NULL, sizeof(pattern), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	closed_b = mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, PG);
	if (closed_a == MAP_FAILED || closed_b == MAP_FAILED)
		die("mmap closed");
	close(fd);

	victim_fd_at(open("/dev/zero", O_RDWR), FD_ZERO);
	zero_map = mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_SHARED, FD_ZERO, 0);
	if (zero_map == MAP_FAILED)
		die("mmap /dev/zero");
	memcpy(zero_map, "zero page written", 17);
}

static int seals_of(int fd)
{
	return fcntl(fd, F_GET_SEALS);
}

static void check_sealed(void)
{
	int seals = seals_of(FD_SEALED);

	CHECK(seals == (F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW), "sealed memfd: seals %#x",
	      seals);
	CHECK(!memcmp(sealed_map, pattern, sizeof(pattern)), "sealed memfd: mapping lost its bytes");
	CHECK(pwrite(FD_SEALED, "x", 1, 0) < 0 && errno == EPERM,
	      "sealed memfd: a write through the fd is allowed");
	void *w = mmap(NULL, PG, PROT_READ | PROT_WRITE, MAP_SHARED, FD_SEALED, 0);
	CHECK(w == MAP_FAILED, "sealed memfd: a writable shared mapping is allowed");
}

static void check_future(void)
{
	unsigned char c = 0;

	CHECK(seals_of(FD_FUTURE) & F_SEAL_FUTURE_WRITE, "future-write memfd: seals %#x",
	      seals_of(FD_FUTURE));
	CHECK(!memcmp(future_map, pattern, sizeof(pattern)),
	      "future-write memfd: mapping lost its bytes");
	CHECK(pwrite(FD_FUTURE, "x", 1, 0) < 0 && errno == EPERM,
	      "future-write memfd: a write through the fd is allowed");
	future_map[100] ^= 0x5a;
	CHECK(pread(FD_FUTURE, &c, 1, 100) == 1 && c == future_map[100],
	      "future-write memfd: the mapping made before the seal is no longer the file");
}

static void check_closed(void)
{
	char line[512];
	int named = 0;
	FILE *maps = fopen("/proc/self/maps", "re");

	CHECK(!memcmp(closed_a, pattern, sizeof(pattern)), "closed memfd: mapping lost its bytes");
	closed_a[PG + 7] ^= 0x33;
	CHECK(closed_b[7] == closed_a[PG + 7], "closed memfd: its two mappings are no longer one object");
	while (maps && fgets(line, sizeof(line), maps))
		named |= strstr(line, "/memfd:closed (deleted)") != NULL;
	if (maps)
		fclose(maps);
	CHECK(named, "closed memfd: its mapping is no longer named /memfd:closed");
}

static void check_zero(void)
{
	struct stat st;

	CHECK(fstat(FD_ZERO, &st) == 0 && S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 5),
	      "fd %d is no longer /dev/zero", FD_ZERO);
	CHECK(!memcmp(zero_map, "zero page written", 17),
	      "shared /dev/zero mapping lost what was written in it");
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	setup();
	victim_ready_and_wait(NULL);
	check_sealed();
	check_future();
	check_closed();
	check_zero();
	victim_finish();
}
