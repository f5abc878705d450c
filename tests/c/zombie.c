/*
 * Zombie victim: two children end before the dump (one exits 42, one is
 * killed by SIGTERM) and the parent does not reap them until go. After
 * restore it must still find both, with the same statuses.
 */
#include "victim.h"

#include <sys/wait.h>

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
	if (a == 0)
		_exit(42);
	pid_t b = fork();
	if (b == 0) {
		signal(SIGTERM, SIG_DFL);
		raise(SIGTERM);
		_exit(1);
	}
	while (!is_zombie(a) || !is_zombie(b))
		victim_tick();
	victim_ready_and_wait(NULL);

	int st;
	CHECK(waitpid(a, &st, 0) == a, "waitpid(%d): %s", a, strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 42, "first zombie: status %#x", st);
	CHECK(waitpid(b, &st, 0) == b, "waitpid(%d): %s", b, strerror(errno));
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM, "second zombie: status %#x", st);
	victim_finish();
}
