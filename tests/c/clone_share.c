/*
 * Processes that share an fd table or fs info without being threads: the
 * root P clones, with raw clone(2), F (CLONE_FILES: P's fd table), S
 * (CLONE_FS: P's cwd, root and umask) and B (both). The four then take
 * turns (a step counter in shared memory): an fd one opens, dup2s or
 * closes must show in every process of its table and in no other, a chdir
 * or umask in one in every process of its fs and in no other. The same
 * turns run before the ready file and again after go, so a restore must
 * have brought back both the fds and cwd/umask each process had and the
 * sharing itself.
 *
 *   clone_share WORKDIR            ready file: "P F S B" (the four pids)
 *   clone_share WORKDIR siblings   P clones A and C with CLONE_FILES and
 *                                  CLONE_FS, then unshares both: A and C
 *                                  share with each other, not with their
 *                                  parent. Ready file: "P A C".
 *   clone_share WORKDIR vm         P clones M with CLONE_VM only: M runs
 *                                  on its own stack in P's address space.
 *                                  Ready file: "P M". After go M writes a
 *                                  word P must see, then both end.
 */
#include "victim.h"

#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>

/* High fd numbers: the lowest free ones are taken by passing opens (the
 * victim's result files), which every process of a table would see. */
enum { FD_FILE = 61, FD_ZERO = 62, FD_DUP = 64, FD_DUP2 = 65, FD_NULL = 66 };

enum role { ROLE_P, ROLE_F, ROLE_S, ROLE_B };
/* The step before the first turn: P is still cloning the others. */
enum { STEP_CLONING = -1 };
static const char *const role_names[] = { "P", "F", "S", "B" };

/* Turn taking between the four processes, in memory they all share. */
struct turns {
	volatile int step;
	volatile int abort;
	char first_failure[256];
};
static struct turns *turns;
static enum role me;
static char workdir_abs[PATH_MAX];
/* The ready file's content: the four pids. */
static char ready_line[64];

/* Records the first failure of any process and stops every one. */
static void share_fail(const char *fmt, ...)
{
	char msg[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (!turns->abort) {
		snprintf(turns->first_failure, sizeof(turns->first_failure), "%s: %s",
			 role_names[me], msg);
		turns->abort = 1;
	}
}

#define SHARE_CHECK(cond, ...)                 \
	do {                                   \
		if (!(cond))                   \
			share_fail(__VA_ARGS__); \
	} while (0)

/* Waits for turn `step`; 0 when it came, -1 when a process failed. */
static int await_step(int step)
{
	while (turns->step != step) {
		if (turns->abort)
			return -1;
		if (me == ROLE_P)
			victim_poll_ping();
		victim_tick();
		if (victim_timespec_passed(&victim_deadline)) {
			share_fail("timed out waiting for step %d", step);
			return -1;
		}
	}
	return turns->abort ? -1 : 0;
}

static void next_step(void)
{
	__sync_synchronize();
	turns->step++;
}

static int fd_is_open(int fd)
{
	return fcntl(fd, F_GETFD) >= 0;
}

/* Whether `fd` is open on the file at `path`. */
static int fd_is_file(int fd, const char *path)
{
	struct stat a, b;

	return fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev &&
	       a.st_ino == b.st_ino;
}

static void file_path(char *buf, size_t len)
{
	snprintf(buf, len, "%s/ffile", workdir_abs);
}

/* The umask, read without changing it for the processes sharing it (only
 * one process acts per step, so the brief 0 is never seen). */
static mode_t current_umask(void)
{
	mode_t m = umask(0);
	umask(m);
	return m;
}

/* Whether the cwd is WORKDIR/<sub> ("" for WORKDIR itself). */
static int cwd_is(const char *sub)
{
	char cwd[PATH_MAX], want[PATH_MAX];

	if (!getcwd(cwd, sizeof(cwd)))
		return 0;
	if (sub[0])
		snprintf(want, sizeof(want), "%s/%s", workdir_abs, sub);
	else
		snprintf(want, sizeof(want), "%s", workdir_abs);
	return strcmp(cwd, want) == 0;
}

static void check_fs(const char *sub, mode_t mask, const char *when)
{
	SHARE_CHECK(cwd_is(sub), "%s: cwd is not WORKDIR/%s", when, sub);
	SHARE_CHECK(current_umask() == mask, "%s: umask %03o, want %03o", when,
		    current_umask(), mask);
}

/* The fds P's table had at the dump. */
static void check_dumped_fds(const char *when)
{
	char ffile[PATH_MAX];

	file_path(ffile, sizeof(ffile));
	SHARE_CHECK(fd_is_file(FD_FILE, ffile), "%s: fd %d is not ffile", when, FD_FILE);
	SHARE_CHECK(fd_is_file(FD_ZERO, "/dev/zero"), "%s: fd %d is not /dev/zero", when,
		    FD_ZERO);
	SHARE_CHECK(fd_is_file(FD_DUP, ffile), "%s: fd %d is not ffile", when, FD_DUP);
}

static void run_p(void)
{
	char ffile[PATH_MAX];

	file_path(ffile, sizeof(ffile));
	if (await_step(1))
		return;
	SHARE_CHECK(fd_is_file(FD_FILE, ffile), "F's open of fd %d not seen", FD_FILE);
	victim_fd_at(open("/dev/zero", O_RDONLY), FD_ZERO);
	next_step();
	if (await_step(4))
		return;
	check_fs("s1", 027, "after S's chdir and umask");
	next_step();
	if (await_step(7))
		return;
	SHARE_CHECK(fd_is_file(FD_DUP, ffile), "B's dup2 to fd %d not seen", FD_DUP);
	next_step();

	victim_ready_and_wait(ready_line);

	if (await_step(8))
		return;
	check_dumped_fds("restored");
	check_fs("s1", 027, "restored");
	next_step();
	if (await_step(10))
		return;
	SHARE_CHECK(!fd_is_open(FD_ZERO), "F's close of fd %d not seen", FD_ZERO);
	if (dup2(FD_FILE, FD_DUP2) != FD_DUP2)
		share_fail("dup2: %s", strerror(errno));
	next_step();
	if (await_step(14))
		return;
	check_fs("s2", 027, "after S's chdir, restored");
	umask(007);
	next_step();
	if (await_step(18))
		return;
	check_fs("", 007, "after B's chdir, restored");
}

static void run_f(void)
{
	char ffile[PATH_MAX];

	file_path(ffile, sizeof(ffile));
	/* Only once S has its own copy of the table, made at its clone. */
	if (await_step(0))
		return;
	victim_fd_at(open(ffile, O_RDWR | O_CREAT, 0600), FD_FILE);
	next_step();
	if (await_step(2))
		return;
	SHARE_CHECK(fd_is_file(FD_ZERO, "/dev/zero"), "P's open of fd %d not seen", FD_ZERO);
	next_step();
	if (await_step(5))
		return;
	check_fs("", 022, "F's own fs after S's chdir");
	next_step();

	if (await_step(9))
		return;
	check_dumped_fds("restored");
	check_fs("", 022, "restored");
	close(FD_ZERO);
	next_step();
	if (await_step(12))
		return;
	SHARE_CHECK(fd_is_file(FD_DUP2, ffile), "P's dup2 to fd %d not seen", FD_DUP2);
	SHARE_CHECK(fd_is_file(FD_NULL, "/dev/null"), "B's open of fd %d not seen", FD_NULL);
	next_step();
	if (await_step(17))
		return;
	check_fs("", 022, "F's own fs after the others' chdirs");
	next_step();
}

static void run_s(void)
{
	if (await_step(3))
		return;
	SHARE_CHECK(!fd_is_open(FD_FILE), "F's fd %d leaked into S's own table", FD_FILE);
	if (chdir("s1"))
		share_fail("chdir s1: %s", strerror(errno));
	umask(027);
	next_step();

	if (await_step(13))
		return;
	check_fs("s1", 027, "restored");
	for (int fd = FD_FILE; fd <= FD_NULL; fd++)
		SHARE_CHECK(!fd_is_open(fd), "fd %d of P's table in S's own", fd);
	if (chdir("../s2"))
		share_fail("chdir ../s2: %s", strerror(errno));
	next_step();
	if (await_step(16))
		return;
	check_fs("", 007, "after B's chdir, restored");
	next_step();
}

static void run_b(void)
{
	char ffile[PATH_MAX];

	file_path(ffile, sizeof(ffile));
	if (await_step(6))
		return;
	SHARE_CHECK(fd_is_file(FD_FILE, ffile), "F's fd %d not seen", FD_FILE);
	SHARE_CHECK(fd_is_file(FD_ZERO, "/dev/zero"), "P's fd %d not seen", FD_ZERO);
	check_fs("s1", 027, "after S's chdir");
	if (dup2(FD_FILE, FD_DUP) != FD_DUP)
		share_fail("dup2: %s", strerror(errno));
	next_step();

	if (await_step(11))
		return;
	SHARE_CHECK(!fd_is_open(FD_ZERO), "F's close of fd %d not seen", FD_ZERO);
	SHARE_CHECK(fd_is_file(FD_DUP2, ffile), "P's dup2 to fd %d not seen", FD_DUP2);
	check_fs("s1", 027, "restored");
	victim_fd_at(open("/dev/null", O_RDONLY), FD_NULL);
	next_step();
	if (await_step(15))
		return;
	check_fs("s2", 007, "after S's chdir and P's umask, restored");
	if (chdir(workdir_abs))
		share_fail("chdir WORKDIR: %s", strerror(errno));
	next_step();
}

/* clone(2) with a NULL stack: the child goes on, like after fork, on its
 * copy of the parent's stack. */
static pid_t clone_role(enum role role, unsigned long flags)
{
	pid_t c = (pid_t)syscall(SYS_clone, flags | SIGCHLD, NULL, NULL, NULL, NULL);

	if (c < 0)
		die("clone");
	if (c > 0)
		return c;
	me = role;
	switch (role) {
	case ROLE_F:
		run_f();
		break;
	case ROLE_S:
		run_s();
		break;
	default:
		run_b();
		break;
	}
	_exit(turns->abort ? 1 : 0);
}

/* The siblings shape: after go, each process just ends (P reaps A, C). */
static void run_siblings(void)
{
	const unsigned long share = CLONE_FILES | CLONE_FS;
	pid_t kids[2];

	for (int i = 0; i < 2; i++) {
		kids[i] = (pid_t)syscall(SYS_clone, share | SIGCHLD, NULL, NULL, NULL, NULL);
		if (kids[i] < 0)
			die("clone");
		if (kids[i] == 0) {
			victim_child_wait_go(90);
			_exit(0);
		}
	}
	if (unshare(share))
		die("unshare");
	snprintf(ready_line, sizeof(ready_line), "%d %d %d", (int)getpid(), (int)kids[0],
		 (int)kids[1]);
	victim_ready_and_wait(ready_line);
	for (int i = 0; i < 2; i++) {
		int st = 0;
		if (waitpid(kids[i], &st, 0) != kids[i])
			fail("waitpid: %s", strerror(errno));
		else
			CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d ended with status %#x",
			      i, st);
	}
	victim_finish();
}

/* The vm shape: the word M writes and P waits for in their one memory. */
static volatile int vm_written;
static char vm_stack[64 * 1024] __attribute__((aligned(16)));

static int run_vm_child(void *arg)
{
	(void)arg;
	victim_child_wait_go(90);
	vm_written = 1;
	return 0;
}

static void run_vm(void)
{
	pid_t m = clone(run_vm_child, vm_stack + sizeof(vm_stack), CLONE_VM | SIGCHLD, NULL);
	int st = 0;

	if (m < 0)
		die("clone CLONE_VM");
	snprintf(ready_line, sizeof(ready_line), "%d %d", (int)getpid(), (int)m);
	victim_ready_and_wait(ready_line);
	if (waitpid(m, &st, 0) != m)
		fail("waitpid: %s", strerror(errno));
	else
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "M ended with status %#x", st);
	CHECK(vm_written == 1, "M's write to the shared memory is not seen by P");
	victim_finish();
}

int main(int argc, char **argv)
{
	char sub[PATH_MAX];
	pid_t kids[3];
	static const unsigned long flags[3] = { CLONE_FILES, CLONE_FS, CLONE_FILES | CLONE_FS };

	victim_init(argc, argv);
	if (!realpath(victim_workdir, workdir_abs))
		die("realpath");
	victim_workdir = workdir_abs;
	if (argc > 2 && strcmp(argv[2], "siblings") == 0)
		run_siblings();
	if (argc > 2 && strcmp(argv[2], "vm") == 0)
		run_vm();
	for (int i = 1; i <= 2; i++) {
		snprintf(sub, sizeof(sub), "%s/s%d", workdir_abs, i);
		if (mkdir(sub, 0755) && errno != EEXIST)
			die("mkdir");
	}
	if (chdir(workdir_abs))
		die("chdir");
	umask(022);
	turns = mmap(NULL, sizeof(*turns), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
		     -1, 0);
	if (turns == MAP_FAILED)
		die("mmap");
	me = ROLE_P;
	turns->step = STEP_CLONING;
	for (int i = 0; i < 3; i++)
		kids[i] = clone_role((enum role)(ROLE_F + i), flags[i]);
	next_step();
	snprintf(ready_line, sizeof(ready_line), "%d %d %d %d", (int)getpid(), (int)kids[0],
		 (int)kids[1], (int)kids[2]);
	/* Signals ready between the turns before the dump and those after. */
	run_p();
	for (int i = 0; i < 3; i++) {
		int st = 0;
		if (waitpid(kids[i], &st, 0) != kids[i])
			fail("waitpid %s: %s", role_names[i + 1], strerror(errno));
		else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			CHECK(turns->abort, "%s ended with status %#x", role_names[i + 1], st);
	}
	if (turns->abort)
		fail("%s", turns->first_failure);
	victim_finish();
}
