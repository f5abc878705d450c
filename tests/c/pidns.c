/*
 * PID namespace victim, run as the command of `ckpt run --pidns` (PID 2 of
 * the namespace, under ckpt's init). It forks A, A forks C, and the root
 * starts a thread; all check from inside the pids they see: their own
 * (getpid, gettid), their parent's, their session and group (the init's,
 * 1), and the root holds a pidfd of A and the read end of a pipe A wrote
 * into (its bytes in flight across the dump). Ready content: "R A C T" (the
 * namespace pids of root, A, C and the thread). After go each checks the
 * same numbers again, children exit and are reaped through the links.
 */
#include "victim.h"

#include <pthread.h>
#include <sys/syscall.h>
#include <sys/wait.h>

/* What `ckpt run --pidns` gives its command. */
#define INIT_PID 1
#define CMD_PID 2

static const char pipe_msg[] = "through the namespace";

static pid_t thread_tid;
static volatile int thread_failed = -1;

static void check_ids(char who, pid_t pid, pid_t ppid)
{
	CHECK(getpid() == pid, "%c: getpid %d, want %d", who, getpid(), pid);
	CHECK(getppid() == ppid, "%c: getppid %d, want %d", who, getppid(), ppid);
	CHECK(getsid(0) == INIT_PID, "%c: session %d, want %d", who, getsid(0), INIT_PID);
	CHECK(getpgid(0) == INIT_PID, "%c: group %d, want %d", who, getpgid(0), INIT_PID);
}

static void child(char who, pid_t ppid, pid_t grandchild)
{
	pid_t me = getpid();

	victim_child_wait_go(90);
	check_ids(who, me, ppid);
	if (victim_failures)
		_exit(91);
	if (grandchild > 0) {
		int st = 0;
		if (waitpid(grandchild, &st, 0) != grandchild)
			_exit(92);
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
			_exit(93);
	}
	_exit(0);
}

static void *thread_main(void *arg)
{
	(void)arg;
	thread_tid = (pid_t)syscall(SYS_gettid);
	while (!victim_file_exists("go"))
		victim_tick();
	thread_failed = (pid_t)syscall(SYS_gettid) != thread_tid;
	return NULL;
}

int main(int argc, char **argv)
{
	pid_t root = getpid(), a, c = 0;
	int cpipe[2], data[2];
	char ready[128];
	pthread_t th;

	victim_init(argc, argv);
	if (root != CMD_PID || getppid() != INIT_PID)
		die("not the command of ckpt run --pidns (pid/ppid not 2/1)");
	if (pipe2(cpipe, O_CLOEXEC) != 0 || pipe2(data, O_CLOEXEC) != 0)
		die("pipe");
	a = fork();
	if (a < 0)
		die("fork A");
	if (a == 0) {
		pid_t me = getpid();
		close(cpipe[0]);
		close(data[0]);
		/* A keeps the write end: both ends stay in the tree. */
		victim_write_all(data[1], pipe_msg, sizeof(pipe_msg));
		c = fork();
		if (c == 0) {
			close(cpipe[1]);
			child('C', me, 0);
		}
		victim_write_all(cpipe[1], (const char *)&c, sizeof(c));
		close(cpipe[1]);
		child('A', root, c);
	}
	close(cpipe[1]);
	close(data[1]);
	if (read(cpipe[0], &c, sizeof(c)) != sizeof(c))
		die("read C's pid");
	close(cpipe[0]);
	int pidfd = (int)syscall(SYS_pidfd_open, a, 0);
	if (pidfd < 0)
		die("pidfd_open A");
	if (pthread_create(&th, NULL, thread_main, NULL) != 0)
		die("pthread_create");
	while (__atomic_load_n(&thread_tid, __ATOMIC_SEQ_CST) == 0)
		victim_tick();
	snprintf(ready, sizeof(ready), "%d %d %d %d", root, a, c, thread_tid);
	victim_ready_and_wait(ready);

	check_ids('R', root, INIT_PID);
	char got[sizeof(pipe_msg) + 1] = {0};
	CHECK(read(data[0], got, sizeof(got)) == (ssize_t)sizeof(pipe_msg) &&
		      memcmp(got, pipe_msg, sizeof(pipe_msg)) == 0,
	      "pipe from A: got \"%s\"", got);
	CHECK(pthread_join(th, NULL) == 0, "pthread_join");
	CHECK(thread_failed == 0, "thread: gettid changed (was %d)", thread_tid);
	/* The pidfd still names A: waitid through it reaps A. */
	siginfo_t si;
	memset(&si, 0, sizeof(si));
	CHECK(waitid(P_PIDFD, (id_t)pidfd, &si, WEXITED) == 0, "waitid(P_PIDFD A): %s",
	      strerror(errno));
	CHECK(si.si_pid == a, "pidfd reaped pid %d, want A %d", si.si_pid, a);
	CHECK(si.si_code == CLD_EXITED && si.si_status == 0, "A (and C) failed: code %d status %d",
	      si.si_code, si.si_status);
	victim_finish();
}
