/*
 * File locks victim. Before the dump:
 *   - fd 10: WORKDIR/flocked, flock(LOCK_EX); a child of the tree inherits
 *     fd 10 (one open file description, one flock);
 *   - fd 11: WORKDIR/ranged, a POSIX write lock on bytes 100-199; fd 13 is
 *     dup(11);
 *   - fd 12: WORKDIR/shared, an OFD read lock on bytes 0-49.
 * After go the child exits (the flock stays: the parent holds the
 * description), and a checker process forked now (a new open of each file,
 * so a conflicting owner) must find every lock held: flock LOCK_EX|LOCK_NB
 * fails, F_GETLK names this process (its pid from before the dump) for
 * bytes 100-199 and nothing from 200 on, F_OFD_GETLK finds the read lock
 * against a write and a read lock is still granted. Then the victim drops
 * all three, a second checker takes them all, and the victim takes them
 * back again without waiting.
 */
#include "victim.h"
#include <sys/file.h>
#include <sys/wait.h>

#define FD_FLOCK 10
#define FD_POSIX 11
#define FD_OFD 12
#define FD_POSIX_DUP 13
#define POSIX_START 100
#define POSIX_LEN 100
#define OFD_LEN 50

/* Checker failures, as bits of its exit status. */
#define BAD_FLOCK 1
#define BAD_POSIX 2
#define BAD_POSIX_OUTSIDE 4
#define BAD_OFD 8
#define BAD_OFD_SHARED 16
#define BAD_OPEN 32

static pid_t me;

static int open_work(const char *name)
{
	char p[PATH_MAX];

	victim_path(p, sizeof(p), name);
	return open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
}

static int range_lock(int fd, int cmd, short type, off_t start, off_t len)
{
	struct flock fl = { .l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = len };

	return fcntl(fd, cmd, &fl);
}

/* A checker with its own open files: held = the victim's locks must hold. */
static int check_from_outside(int held)
{
	pid_t kid = fork();
	int st;

	if (kid < 0)
		die("fork checker");
	if (kid == 0) {
		int bad = 0;
		int a = open_work("flocked"), b = open_work("ranged"), c = open_work("shared");
		struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET,
				    .l_start = POSIX_START, .l_len = POSIX_LEN };

		if (a < 0 || b < 0 || c < 0)
			_exit(BAD_OPEN);
		if ((flock(a, LOCK_EX | LOCK_NB) == 0) == held)
			bad |= BAD_FLOCK;
		if (fcntl(b, F_GETLK, &fl))
			bad |= BAD_POSIX;
		else if (held && (fl.l_type != F_WRLCK || fl.l_pid != me ||
				  fl.l_start != POSIX_START || fl.l_len != POSIX_LEN))
			bad |= BAD_POSIX;
		else if (!held && fl.l_type != F_UNLCK)
			bad |= BAD_POSIX;
		if (range_lock(b, F_SETLK, F_WRLCK, POSIX_START + POSIX_LEN, 10))
			bad |= BAD_POSIX_OUTSIDE;
		fl = (struct flock){ .l_type = F_WRLCK, .l_whence = SEEK_SET, .l_len = OFD_LEN };
		if (fcntl(c, F_OFD_GETLK, &fl))
			bad |= BAD_OFD;
		else if ((fl.l_type == F_RDLCK) != held)
			bad |= BAD_OFD;
		if (range_lock(c, F_OFD_SETLK, F_RDLCK, 0, OFD_LEN))
			bad |= BAD_OFD_SHARED;
		_exit(bad);
	}
	if (waitpid(kid, &st, 0) != kid || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	me = getpid();
	victim_fd_at(open_work("flocked"), FD_FLOCK);
	victim_fd_at(open_work("ranged"), FD_POSIX);
	victim_fd_at(open_work("shared"), FD_OFD);
	if (flock(FD_FLOCK, LOCK_EX))
		die("flock");
	if (range_lock(FD_POSIX, F_SETLK, F_WRLCK, POSIX_START, POSIX_LEN))
		die("F_SETLK");
	if (dup2(FD_POSIX, FD_POSIX_DUP) != FD_POSIX_DUP)
		die("dup2 posix");
	if (range_lock(FD_OFD, F_OFD_SETLK, F_RDLCK, 0, OFD_LEN))
		die("F_OFD_SETLK");
	pid_t kid = fork();
	if (kid < 0)
		die("fork");
	if (kid == 0) {
		while (!victim_file_exists("go")) {
			victim_tick();
			if (victim_timespec_passed(&victim_deadline))
				_exit(90);
		}
		_exit(fcntl(FD_FLOCK, F_GETFD) < 0 ? 91 : 0);
	}

	victim_ready_and_wait(NULL);

	int st, bad;
	CHECK(waitpid(kid, &st, 0) == kid, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tree child failed: status %#x", st);
	CHECK(getpid() == me, "pid %d, was %d", getpid(), me);
	bad = check_from_outside(1);
	CHECK(bad == 0, "locks not held after restore (checker bits %#x: 1 flock, 2 posix, "
			"4 posix outside range, 8 ofd, 16 ofd shared)", bad);

	CHECK(flock(FD_FLOCK, LOCK_UN) == 0, "flock LOCK_UN: %s", strerror(errno));
	CHECK(range_lock(FD_POSIX, F_SETLK, F_UNLCK, POSIX_START, POSIX_LEN) == 0,
	      "POSIX unlock: %s", strerror(errno));
	CHECK(range_lock(FD_OFD, F_OFD_SETLK, F_UNLCK, 0, OFD_LEN) == 0, "OFD unlock: %s",
	      strerror(errno));
	bad = check_from_outside(0);
	CHECK(bad == 0, "locks still held after unlocking (checker bits %#x)", bad);

	CHECK(flock(FD_FLOCK, LOCK_EX | LOCK_NB) == 0, "flock relock: %s", strerror(errno));
	CHECK(range_lock(FD_POSIX_DUP, F_SETLK, F_WRLCK, POSIX_START, POSIX_LEN) == 0,
	      "POSIX relock: %s", strerror(errno));
	CHECK(range_lock(FD_OFD, F_OFD_SETLK, F_RDLCK, 0, OFD_LEN) == 0, "OFD relock: %s",
	      strerror(errno));
	victim_finish();
}
