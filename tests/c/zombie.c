/*
 * Zombie victim: three children end before the dump (one exits 42, one is
 * killed by SIGTERM, one by SIGKILL), each named by prctl first, and the
 * parent does not reap them until go. After restore it must still find all
 * three as zombies with their names, and reap the same statuses.
 */
#include "victim.h"

#include <sys/prctl.h>
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
	char path[64], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] == 'Z';
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
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
