/*
 * Fds a child shares with its parent, above a gap: the root opens two
 * files, puts them at fds 4 and 5 with nothing at 3, and forks a child
 * that keeps both. After a restore each process checks that fd 4 is still
 * WORKDIR/a and fd 5 WORKDIR/b, and the child that nothing is at 3 (the
 * restore takes the child's fds from its parent together and moves each
 * to its number). The child exits 0 or 1; the root checks its own fds
 * and the child's status.
 */
#include "victim.h"

#include <sys/wait.h>

/* Whether fd `fd` is the file WORKDIR/`name`. */
static int is_file(int fd, const char *name)
{
	char link[64], target[PATH_MAX], want[PATH_MAX];
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, target, sizeof(target) - 1);
	if (n < 0)
		return 0;
	target[n] = 0;
	victim_path(want, sizeof(want), name);
	return strcmp(target, want) == 0;
}

static int open_at(const char *name, int want)
{
	char path[PATH_MAX];
	victim_path(path, sizeof(path), name);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	victim_fd_at(fd, want);
	return want;
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	for (int fd = 3; fd < 1024; fd++)
		close(fd);
	open_at("a", 4);
	open_at("b", 5);
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		victim_child_wait_go(2);
		_exit(is_file(4, "a") && is_file(5, "b") && fcntl(3, F_GETFD) < 0 ? 0 : 1);
	}
	victim_ready_and_wait(NULL);
	CHECK(is_file(4, "a"), "fd 4 is not WORKDIR/a");
	CHECK(is_file(5, "b"), "fd 5 is not WORKDIR/b");
	int st;
	CHECK(waitpid(child, &st, 0) == child, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child: status %#x", st);
	victim_finish();
}
