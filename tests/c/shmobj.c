/*
 * Shared memory objects mapped by a parent and its child, one mode each
 * (argv[2]):
 *   partial  shared anonymous memory with its middle unmapped: two VMAs of
 *            one object at different offsets;
 *   memfd    a memfd (odd size, seals) mapped shared twice at different
 *            offsets and once private with a written page; its fd kept
 *            open when argv[3] is "fd" (name, offset, seals checked),
 *            next to a memfd made without MFD_ALLOW_SEALING;
 *   deleted  a file unlinked while mapped shared and private (its fd kept
 *            open when argv[3] is "fd": after restore a write through
 *            the fd shows in the shared mapping and back, at the fd's
 *            offset as it was);
 *   devzero  /dev/zero mapped shared and private;
 *   posix    a POSIX shm object (shm_open NAME = argv[3], in /dev/shm)
 *            mapped shared, its fd closed.
 * After go the parent and the child each write a token the other must see
 * (the object is still one object, not copies), and both check every
 * byte of the saved patterns.
 */
#include "victim.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define PG 4096ul
#define PARENT_TOKEN 0x5041524eul
#define CHILD_TOKEN 0x4348494cul

struct view {
	const char *what;
	volatile unsigned char *p; /* the mapping */
	size_t len;
	size_t obj_off;            /* its offset in the object */
};

/* Shared views of one object (all alias), and private ones. */
static struct view shared[3];
static int nshared;
static volatile unsigned char *priv;
static size_t priv_len;
static unsigned char expect_priv[4 * PG];
static unsigned char *object; /* expected object contents, for checks */
static size_t object_len;
static int memfd = -1, unsealable = -1;

static void add_shared(const char *what, void *p, size_t len, size_t off)
{
	if (p == MAP_FAILED)
		die(what);
	shared[nshared++] = (struct view){ what, p, len, off };
}

/*
 * Maps the first four pages of `fd` private, as `priv`, and writes pattern
 * `seed` into its page `cow_page` (a private COW page); `expect_priv` is
 * `contents` (zeros if NULL) with that page. Dies with `what` if it cannot
 * map.
 */
static void map_private(int fd, const char *what, const unsigned char *contents,
			size_t cow_page, uint64_t seed)
{
	priv_len = 4 * PG;
	priv = mmap(NULL, priv_len, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
	if (priv == MAP_FAILED)
		die(what);
	if (contents)
		memcpy(expect_priv, contents, priv_len);
	else
		memset(expect_priv, 0, priv_len);
	fill_pattern(expect_priv + cow_page * PG, PG, seed);
	fill_pattern((void *)(priv + cow_page * PG), PG, seed);
}

/* The shared word at object offset `off`, through view v (if it covers it). */
static volatile unsigned long *word(struct view *v, size_t off)
{
	if (off < v->obj_off || off + 8 > v->obj_off + v->len)
		return NULL;
	return (volatile unsigned long *)(v->p + (off - v->obj_off));
}

static void setup_memfd(int keep_fd)
{
	object_len = 8 * PG + 100;
	object = malloc(object_len);
	fill_pattern(object, object_len, 11);
	int fd = memfd_create("ckpt test memfd", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		die("memfd_create");
	if (write(fd, object, object_len) != (ssize_t)object_len)
		die("write memfd");
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) < 0)
		die("F_ADD_SEALS");
	add_shared("memfd whole", mmap(NULL, 9 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), 9 * PG, 0);
	add_shared("memfd at page 4", mmap(NULL, 2 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 4 * PG), 2 * PG, 4 * PG);
	map_private(fd, "mmap private", object, 1, 99);
	if (keep_fd) {
		if (lseek(fd, 1234, SEEK_SET) != 1234)
			die("lseek");
		memfd = fd;
		/* Made without MFD_ALLOW_SEALING: it must stay unsealable. */
		unsealable = memfd_create("ckpt unsealable", MFD_CLOEXEC);
		if (unsealable < 0 || write(unsealable, "hello", 5) != 5)
			die("memfd unsealable");
	} else {
		close(fd);
	}
}

/* The deleted file's fd, when kept, and its offset at the dump. */
static int deleted_fd = -1;
#define DELETED_POS 777

static void setup_deleted(int keep_fd)
{
	char path[PATH_MAX];
	victim_path(path, sizeof(path), "deleted.bin");
	object_len = 8 * PG;
	object = malloc(object_len);
	fill_pattern(object, object_len, 21);
	int fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0 || write(fd, object, object_len) != (ssize_t)object_len)
		die("deleted.bin");
	add_shared("deleted shared", mmap(NULL, 4 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 4 * PG), 4 * PG, 4 * PG);
	map_private(fd, "mmap private", object, 3, 98);
	unlink(path);
	if (!keep_fd) {
		close(fd);
		return;
	}
	deleted_fd = fd;
	if (lseek(fd, DELETED_POS, SEEK_SET) != DELETED_POS)
		die("lseek deleted.bin");
}

/* The deleted file's fd and its shared mapping are still one file. */
static void check_deleted_fd(void)
{
	CHECK(lseek(deleted_fd, 0, SEEK_CUR) == DELETED_POS, "deleted file's offset lost");
	unsigned char b = (unsigned char)(object[4 * PG + 300] ^ 0x33);
	CHECK(pwrite(deleted_fd, &b, 1, 4 * PG + 300) == 1, "pwrite deleted file: %s", strerror(errno));
	CHECK(shared[0].p[300] == b, "a write through the fd does not show in the mapping");
	shared[0].p[301] ^= 0x44;
	unsigned char c = 0;
	CHECK(pread(deleted_fd, &c, 1, 4 * PG + 301) == 1 && c == shared[0].p[301],
	      "a write through the mapping does not show through the fd");
}

static void setup_posix(const char *name)
{
	object_len = 5 * PG + 300;
	object = malloc(object_len);
	fill_pattern(object, object_len, 41);
	int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0640);
	if (fd < 0)
		die("shm_open");
	if (write(fd, object, object_len) != (ssize_t)object_len)
		die("write shm");
	add_shared("posix shm", mmap(NULL, 6 * PG, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), 6 * PG, 0);
	close(fd);
}

static void setup_anon(int devzero, int partial)
{
	object_len = 16 * PG;
	object = malloc(object_len);
	fill_pattern(object, object_len, 31);
	int fd = -1;
	if (devzero && (fd = open("/dev/zero", O_RDWR | O_CLOEXEC)) < 0)
		die("/dev/zero");
	unsigned char *m = mmap(NULL, object_len, PROT_READ | PROT_WRITE,
				MAP_SHARED | (devzero ? 0 : MAP_ANONYMOUS), fd, 0);
	if (m == MAP_FAILED)
		die("mmap shared");
	memcpy(m, object, object_len);
	if (partial) {
		/* Unmap the middle: two VMAs of one object, offsets 0 and 8 pages. */
		if (munmap(m + 4 * PG, 4 * PG))
			die("munmap");
		add_shared("anon head", m, 4 * PG, 0);
		add_shared("anon tail", m + 8 * PG, 8 * PG, 8 * PG);
	} else {
		add_shared("shared", m, object_len, 0);
	}
	if (devzero) {
		map_private(fd, "mmap private /dev/zero", NULL, 2, 97);
		close(fd);
	}
}

/* Object offsets where the tokens go: in the last shared view. */
static size_t parent_off(void) { return shared[nshared - 1].obj_off + 8; }
static size_t child_off(void) { return shared[nshared - 1].obj_off + PG + 16; }

/* Every shared view shows the object (tokens aside); returns a reason or NULL. */
static const char *check_views(void)
{
	static char why[256];
	unsigned long pt = PARENT_TOKEN, ct = CHILD_TOKEN;
	memcpy(object + parent_off(), &pt, 8);
	memcpy(object + child_off(), &ct, 8);
	for (int i = 0; i < nshared; i++) {
		struct view *v = &shared[i];
		size_t n = v->len;
		if (v->obj_off + n > object_len)
			n = object_len - v->obj_off;
		if (memcmp((const void *)v->p, object + v->obj_off, n)) {
			snprintf(why, sizeof(why), "%s differs from the object", v->what);
			return why;
		}
	}
	if (priv && memcmp((const void *)priv, expect_priv, priv_len))
		return "the private mapping lost its own page or the object's";
	return NULL;
}

/* Waits until the word at object offset `off` reads `token` in every view covering it. */
static int wait_token(size_t off, unsigned long token)
{
	struct timespec limit;
	clock_gettime(CLOCK_MONOTONIC, &limit);
	limit.tv_sec += 10;
	for (;;) {
		int seen = 0, views = 0;
		for (int i = 0; i < nshared; i++) {
			volatile unsigned long *w = word(&shared[i], off);
			if (w) {
				views++;
				seen += *w == token;
			}
		}
		if (views && seen == views)
			return 1;
		if (victim_timespec_passed(&limit))
			return 0;
		victim_tick();
	}
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	const char *mode = argc > 2 ? argv[2] : "";
	if (!strcmp(mode, "partial"))
		setup_anon(0, 1);
	else if (!strcmp(mode, "devzero"))
		setup_anon(1, 0);
	else if (!strcmp(mode, "memfd"))
		setup_memfd(argc > 3 && !strcmp(argv[3], "fd"));
	else if (!strcmp(mode, "deleted"))
		setup_deleted(argc > 3 && !strcmp(argv[3], "fd"));
	else if (!strcmp(mode, "posix") && argc > 3)
		setup_posix(argv[3]);
	else
		die("unknown mode");

	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		victim_child_wait_go(70);
		if (!wait_token(parent_off(), PARENT_TOKEN))
			_exit(71);
		*word(&shared[nshared - 1], child_off()) = CHILD_TOKEN;
		if (check_views())
			_exit(72);
		_exit(0);
	}
	if (nshared > 1 && shared[0].obj_off == 0 && shared[1].obj_off == 4 * PG) {
		/* Two views of one memfd alias: a write through one shows in the other. */
		shared[0].p[4 * PG + 100] ^= 0xff;
		CHECK(shared[1].p[100] == (unsigned char)(object[4 * PG + 100] ^ 0xff), "memfd views do not alias before dump");
		shared[0].p[4 * PG + 100] ^= 0xff;
	}
	victim_ready_and_wait(NULL);

	*word(&shared[nshared - 1], parent_off()) = PARENT_TOKEN;
	CHECK(wait_token(child_off(), CHILD_TOKEN), "the child's write is not visible: the memory is no longer shared");
	int st;
	CHECK(waitpid(child, &st, 0) == child, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed: status %#x", st);
	const char *why = check_views();
	CHECK(!why, "%s", why ? why : "");
	if (deleted_fd >= 0)
		check_deleted_fd();
	if (nshared > 1 && shared[1].obj_off == 4 * PG) {
		shared[1].p[200] ^= 0x5a;
		CHECK(shared[0].p[4 * PG + 200] == (unsigned char)(object[4 * PG + 200] ^ 0x5a),
		      "the two memfd mappings are no longer one object");
	}
	if (memfd >= 0) {
		char link[64], name[PATH_MAX];
		snprintf(link, sizeof(link), "/proc/self/fd/%d", memfd);
		ssize_t n = readlink(link, name, sizeof(name) - 1);
		name[n > 0 ? n : 0] = 0;
		CHECK(!strcmp(name, "/memfd:ckpt test memfd (deleted)"), "memfd name is %s", name);
		CHECK(lseek(memfd, 0, SEEK_CUR) == 1234, "memfd offset lost");
		int seals = fcntl(memfd, F_GET_SEALS);
		CHECK(seals == (F_SEAL_SHRINK | F_SEAL_GROW), "memfd seals are %#x", seals);
		CHECK(fcntl(memfd, F_GETFD) == FD_CLOEXEC, "memfd lost FD_CLOEXEC");
		struct stat sb;
		CHECK(fstat(memfd, &sb) == 0 && sb.st_size == (off_t)object_len, "memfd size changed");
		CHECK(ftruncate(memfd, PG) < 0 && errno == EPERM, "F_SEAL_SHRINK not enforced");
		unsigned char b[100];
		CHECK(pread(memfd, b, sizeof(b), object_len - 100) == 100 &&
		      !memcmp(b, object + object_len - 100, 100), "memfd tail differs through the fd");
		CHECK(fcntl(unsealable, F_GET_SEALS) == F_SEAL_SEAL, "unsealable memfd seals are %#x",
		      fcntl(unsealable, F_GET_SEALS));
		CHECK(fcntl(unsealable, F_ADD_SEALS, F_SEAL_GROW) < 0 && errno == EPERM,
		      "a memfd made without MFD_ALLOW_SEALING accepts seals");
		CHECK(pread(unsealable, b, 5, 0) == 5 && !memcmp(b, "hello", 5) &&
		      lseek(unsealable, 0, SEEK_CUR) == 5, "unsealable memfd contents or offset lost");
	}
	victim_finish();
}
