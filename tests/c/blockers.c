/*
 * Victim holding three kinds of things ckpt cannot save yet, in two
 * processes: the root a UNIX socket pair (two fds) and a hugetlb memfd, its child
 * a fanotify instance. A dump must list all four fds at once and leave
 * both running; after go the
 * child exits and the root checks its objects still work.
 */
#include "victim.h"

#include <sys/fanotify.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>

int main(int argc, char **argv)
{
	int sv[2];

	victim_init(argc, argv);
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv))
		die("socketpair");
	int mfd = memfd_create("ckpt-blocker", MFD_CLOEXEC | MFD_HUGETLB);
	if (mfd < 0)
		die("memfd_create");
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		/* Only the fanotify instance in the child: the lists stay exact. */
		close(sv[0]);
		close(sv[1]);
		close(mfd);
		int in = fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC, O_RDONLY);
		if (in < 0)
			_exit(70);
		while (!victim_file_exists("go")) {
			victim_tick();
			if (victim_timespec_passed(&victim_deadline))
				_exit(71);
		}
		_exit(0);
	}
	victim_ready_and_wait(NULL);

	int st;
	CHECK(waitpid(child, &st, 0) == child, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed: status %#x", st);
	char c = 'x';
	CHECK(write(sv[0], &c, 1) == 1 && read(sv[1], &c, 1) == 1, "socket pair broken");
	CHECK(fcntl(mfd, F_GETFD) == FD_CLOEXEC, "memfd broken");
	victim_finish();
}
