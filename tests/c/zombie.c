/*
 * Zombie victim: three children end before the dump (one exits 42, one is
 * killed by SIGTERM, one by SIGKILL), each named by prctl first, and the
 * parent does not reap them until go. After restore it must still find all
 * three as zombies with their names, and reap the same statuses.
 */
#include "victim.h"

#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>

static void name_self(const char *name)
{
	prctl(PR_SET_NAME, name, 0, 0, 0);
}

static void check_comm(pid_t pid, const char *want)
{
	char path[64], buf[32] = { 0 };
	snprintf(path, sizeof(path), "/proc/%d/comm", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
	if (fd >= 0)
		close(fd);
	if (n > 0 && buf[n - 1] == '\n')
		buf[n - 1] = 0;
	CHECK(strcmp(buf, want) == 0, "zombie %d is named \"%s\", want \"%s\"", pid, buf, want);
}

static int is_zombie(pid_t pid)
{
	return proc_state(pid) == 'Z';
}

/* Field 52 of /proc/PID/stat: a zombie's status in waitpid() form. */
static int stat_status(pid_t pid)
{
	char buf[1024];
	const char *p = proc_stat_fields(pid, buf, sizeof(buf));
	/* p is field 3; field 52 is 49 spaces further. */
	for (int i = 0; p && i < 49; i++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	return p ? atoi(p) : -1;
}

#define ENDINGS 7

/*
 * "all" mode: one zombie per way to end: exit 0, 1 and 255, SIGKILL,
 * SIGSEGV and SIGABRT without a core dump, SIGSEGV with one (a small core
 * in the work dir: every mapping filtered out). Their exact statuses
 * (core-dump bit included) must come back. Ready content: "core=0|1",
 * whether the original got the core-dump bit.
 */
static void all_endings(void)
{
	pid_t kids[ENDINGS];
	int want[ENDINGS];
	for (int i = 0; i < ENDINGS; i++) {
		kids[i] = fork();
		if (kids[i] < 0)
			die("fork");
		if (kids[i] != 0)
			continue;
		struct rlimit none = { 0, 0 }, some = { 64 << 20, 64 << 20 };
		switch (i) {
		case 0:
			_exit(0);
		case 1:
			_exit(1);
		case 2:
			_exit(255);
		case 3:
			raise(SIGKILL);
			break;
		case 4:
		case 5:
			/* (Not PR_SET_DUMPABLE: its /proc status would hide from the parent.) */
			setrlimit(RLIMIT_CORE, &none);
			signal(i == 4 ? SIGSEGV : SIGABRT, SIG_DFL);
			raise(i == 4 ? SIGSEGV : SIGABRT);
			break;
		case 6: {
			int fd = open("/proc/self/coredump_filter", O_WRONLY | O_CLOEXEC);
			if (fd >= 0) {
				if (write(fd, "0", 1) != 1)
					_exit(70);
				close(fd);
			}
			if (setrlimit(RLIMIT_CORE, &some) || chdir(victim_workdir))
				_exit(71);
			signal(SIGSEGV, SIG_DFL);
			raise(SIGSEGV);
			break;
		}
		}
		_exit(72);
	}
	for (int i = 0; i < ENDINGS; i++) {
		while (!is_zombie(kids[i]))
			victim_tick();
		want[i] = stat_status(kids[i]);
	}
	victim_ready_and_wait(want[6] & 0x80 ? "core=1" : "core=0");

	for (int i = 0; i < ENDINGS; i++) {
		int st = -1;
		CHECK(is_zombie(kids[i]), "ending %d: pid %d is no zombie", i, kids[i]);
		CHECK(waitpid(kids[i], &st, 0) == kids[i], "ending %d: waitpid: %s", i,
		      strerror(errno));
		CHECK(st == want[i], "ending %d: status %#x, want %#x", i, st, want[i]);
	}
	victim_finish();
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	if (argc > 2 && strcmp(argv[2], "all") == 0)
		all_endings();
	pid_t a = fork();
	if (a == 0) {
		name_self("zomb-exit");
		_exit(42);
	}
	pid_t b = fork();
	if (b == 0) {
		name_self("zomb-term");
		signal(SIGTERM, SIG_DFL);
		raise(SIGTERM);
		_exit(1);
	}
	pid_t c = fork();
	if (c == 0) {
		name_self("zomb-kill");
		raise(SIGKILL);
		_exit(1);
	}
	while (!is_zombie(a) || !is_zombie(b) || !is_zombie(c))
		victim_tick();
	victim_ready_and_wait(NULL);

	CHECK(is_zombie(a) && is_zombie(b) && is_zombie(c), "children are not zombies");
	check_comm(a, "zomb-exit");
	check_comm(b, "zomb-term");
	check_comm(c, "zomb-kill");
	int st;
	CHECK(waitpid(a, &st, 0) == a, "waitpid(%d): %s", a, strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 42, "first zombie: status %#x", st);
	CHECK(waitpid(b, &st, 0) == b, "waitpid(%d): %s", b, strerror(errno));
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "second zombie: status %#x", st);
	CHECK(waitpid(c, &st, 0) == c, "waitpid(%d): %s", c, strerror(errno));
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "third zombie: status %#x", st);
	victim_finish();
}
