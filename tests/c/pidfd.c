/*
 * pidfd victim. `pidfd WORKDIR [outside]`.
 * Before the dump: a child of the tree, and fd 10 = pidfd_open(child,
 * PIDFD_NONBLOCK), fd 11 = pidfd_open(self) (blocking). After go: fd 10
 * is still a non-blocking pidfd of the child (fdinfo Pid: is the child's
 * pid, waitid(P_PIDFD, WNOHANG) says it is running, signal 0 reaches it);
 * fd 11 refers to this process; once told to, the child exits with 42,
 * poll says fd 10 is readable, and waitid(P_PIDFD) reaps it with status 42.
 * fd 13 = pidfd_open of a second child that exited with 7 before the dump
 * and was not reaped (a zombie): waitid(P_PIDFD, WNOHANG) reaps it with 7.
 * fd 14 = pidfd_open(PIDFD_NONBLOCK) of a third child that exited and was
 * reaped before the dump: after go it still refers to no process (fdinfo
 * Pid: -1), is readable, non-blocking, has no child to wait for (ECHILD)
 * and no one to signal (ESRCH).
 * With "outside": fd 12 is also a pidfd of the victim's parent (outside the
 * tree), which the dump must refuse; the victim then passes untouched.
 */
#include "victim.h"
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define FD_CHILD 10
#define FD_SELF 11
#define FD_OUTSIDE 12
#define FD_ZOMBIE 13
#define FD_REAPED 14
#define ZOMBIE_STATUS 7
#define CHILD_STATUS 42
#define WAIT_MS 5000
#ifndef PIDFD_NONBLOCK
#define PIDFD_NONBLOCK O_NONBLOCK
#endif

static int pidfd_open(pid_t pid, unsigned int flags)
{
	return (int)syscall(SYS_pidfd_open, pid, flags);
}

static void at(int fd, int want)
{
	if (fd < 0)
		die("pidfd_open");
	if (fd != want) {
		if (dup2(fd, want) != want)
			die("dup2");
		close(fd);
	}
}

/* The Pid: line of fd's fdinfo, or -2. */
static int fdinfo_pid(int fd)
{
	char path[64], buf[512];

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	if (read_small_file(path, buf, sizeof(buf)) == (size_t)-1)
		return -2;
	char *p = strstr(buf, "\nPid:");
	return p ? atoi(p + 5) : -2;
}

int main(int argc, char **argv)
{
	int outside = argc > 2 && strcmp(argv[2], "outside") == 0;

	victim_init(argc, argv);
	pid_t kid = fork();
	if (kid < 0)
		die("fork");
	if (kid == 0) {
		while (!victim_file_exists("exit")) {
			victim_tick();
			if (victim_timespec_passed(&victim_deadline))
				_exit(90);
		}
		_exit(CHILD_STATUS);
	}
	pid_t zombie = fork();
	if (zombie < 0)
		die("fork");
	if (zombie == 0)
		_exit(ZOMBIE_STATUS);
	siginfo_t si = { 0 };
	/* Wait until it has exited, without reaping it. */
	if (waitid(P_PID, zombie, &si, WEXITED | WNOWAIT))
		die("waitid WNOWAIT");
	at(pidfd_open(zombie, 0), FD_ZOMBIE);
	pid_t gone = fork();
	if (gone < 0)
		die("fork");
	if (gone == 0)
		_exit(0);
	/* Exited, not reaped yet: the pidfd is opened, then it is reaped. */
	memset(&si, 0, sizeof(si));
	if (waitid(P_PID, gone, &si, WEXITED | WNOWAIT))
		die("waitid WNOWAIT");
	at(pidfd_open(gone, PIDFD_NONBLOCK), FD_REAPED);
	if (waitpid(gone, NULL, 0) != gone)
		die("waitpid");
	at(pidfd_open(kid, PIDFD_NONBLOCK), FD_CHILD);
	at(pidfd_open(getpid(), 0), FD_SELF);
	if (outside)
		at(pidfd_open(getppid(), 0), FD_OUTSIDE);

	victim_ready_and_wait(NULL);

	CHECK(fdinfo_pid(FD_CHILD) == kid, "fd %d Pid: %d, want the child %d", FD_CHILD,
	      fdinfo_pid(FD_CHILD), kid);
	CHECK(fdinfo_pid(FD_SELF) == getpid(), "fd %d Pid: %d, want %d", FD_SELF,
	      fdinfo_pid(FD_SELF), getpid());
	CHECK(fcntl(FD_CHILD, F_GETFL) & O_NONBLOCK, "fd %d lost PIDFD_NONBLOCK", FD_CHILD);
	CHECK(!(fcntl(FD_SELF, F_GETFL) & O_NONBLOCK), "fd %d gained O_NONBLOCK", FD_SELF);
	CHECK(syscall(SYS_pidfd_send_signal, FD_CHILD, 0, NULL, 0) == 0,
	      "pidfd_send_signal(0) to the child: %s", strerror(errno));
	memset(&si, 0, sizeof(si));
	CHECK(waitid(P_PIDFD, FD_CHILD, &si, WEXITED | WNOHANG) == 0 && si.si_pid == 0,
	      "the child is not running (si_pid %d): %s", si.si_pid, strerror(errno));

	CHECK(fdinfo_pid(FD_ZOMBIE) == zombie, "fd %d Pid: %d, want the zombie %d", FD_ZOMBIE,
	      fdinfo_pid(FD_ZOMBIE), zombie);
	memset(&si, 0, sizeof(si));
	CHECK(waitid(P_PIDFD, FD_ZOMBIE, &si, WEXITED | WNOHANG) == 0 && si.si_pid == zombie &&
		      si.si_code == CLD_EXITED && si.si_status == ZOMBIE_STATUS,
	      "zombie: pid %d code %d status %d, want %d exited %d", si.si_pid, si.si_code,
	      si.si_status, zombie, ZOMBIE_STATUS);

	CHECK(fdinfo_pid(FD_REAPED) == -1, "fd %d Pid: %d, want -1 (reaped)", FD_REAPED,
	      fdinfo_pid(FD_REAPED));
	CHECK(fcntl(FD_REAPED, F_GETFL) & O_NONBLOCK, "fd %d lost PIDFD_NONBLOCK", FD_REAPED);
	struct pollfd reaped = { .fd = FD_REAPED, .events = POLLIN };
	CHECK(poll(&reaped, 1, 0) == 1 && (reaped.revents & POLLIN), "reaped pidfd not readable");
	memset(&si, 0, sizeof(si));
	CHECK(waitid(P_PIDFD, FD_REAPED, &si, WEXITED | WNOHANG) == -1 && errno == ECHILD,
	      "waitid on the reaped pidfd: %s, want ECHILD", strerror(errno));
	CHECK(syscall(SYS_pidfd_send_signal, FD_REAPED, 0, NULL, 0) == -1 && errno == ESRCH,
	      "signal through the reaped pidfd: %s, want ESRCH", strerror(errno));

	victim_write_file("exit", "exit");
	struct pollfd p = { .fd = FD_CHILD, .events = POLLIN };
	CHECK(poll(&p, 1, WAIT_MS) == 1 && (p.revents & POLLIN), "pidfd not readable after exit");
	memset(&si, 0, sizeof(si));
	CHECK(waitid(P_PIDFD, FD_CHILD, &si, WEXITED) == 0, "waitid: %s", strerror(errno));
	CHECK(si.si_pid == kid && si.si_code == CLD_EXITED && si.si_status == CHILD_STATUS,
	      "waitid: pid %d code %d status %d, want %d exited %d", si.si_pid, si.si_code,
	      si.si_status, kid, CHILD_STATUS);
	victim_finish();
}
