/*
 * Seccomp victim: `seccomp WORKDIR [nnp|notify]`.
 *
 * The main thread installs two filters for getppid, the older answering
 * EPERM and the newer ENOTTY: with stacked filters of equal precedence the
 * newest one's errno wins, so ENOTTY after restore proves the order was
 * kept. A worker thread then adds a third filter of its own that makes
 * getsid fail with EXDEV (the main thread's getsid still works). A child
 * enters strict mode and blocks in read(); after go it echoes one byte
 * (read/write are allowed) and then calls getpid, which strict mode
 * answers with SIGKILL.
 *
 * `nnp` sets no_new_privs first (as an unprivileged program must; as root
 * the filters are installed without it). `notify` installs a filter that
 * hands getppid to a user-space supervisor (SECCOMP_RET_USER_NOTIF), which
 * a dump must refuse; its listener fd is closed at once.
 */
#include "victim.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

static volatile int worker_ready, stop;
static char worker_fail[200];

/* Install: for syscall `nr` return `action`, allow everything else. */
static int install(int nr, unsigned action, unsigned flags)
{
	struct sock_filter insns[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)nr, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, action),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = { sizeof(insns) / sizeof(insns[0]), insns };

	return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog);
}

static void expect_errno(long ret, int want, const char *what, char *out, size_t len)
{
	if (ret != -1 || errno != want)
		snprintf(out, len, "%s returned %ld errno %d, want -1 errno %d", what, ret, errno,
			 want);
}

static void *work(void *arg)
{
	(void)arg;
	if (install(SYS_getsid, SECCOMP_RET_ERRNO | EXDEV, 0))
		die("worker seccomp filter");
	worker_ready = 1;
	while (!stop)
		victim_tick();
	errno = 0;
	expect_errno(syscall(SYS_getsid, 0), EXDEV, "worker getsid", worker_fail,
		     sizeof(worker_fail));
	if (!worker_fail[0]) {
		errno = 0;
		expect_errno(syscall(SYS_getppid), ENOTTY, "worker getppid", worker_fail,
			     sizeof(worker_fail));
	}
	return NULL;
}

/* Strict mode child: echo one byte, then die by a forbidden syscall. */
static void strict_child(int in, int out)
{
	char c;

	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT))
		_exit(10);
	if (read(in, &c, 1) != 1)
		_exit(11);
	c ^= 0x20;
	if (write(out, &c, 1) != 1)
		_exit(12);
	syscall(SYS_getpid);
	_exit(13);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 2 ? argv[2] : "";
	int to_child[2], from_child[2], status;
	pthread_t t;
	pid_t child;
	char c = 'a';

	victim_init(argc, argv);
	if (!strcmp(mode, "nnp") && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
		die("PR_SET_NO_NEW_PRIVS");
	if (pipe(to_child) || pipe(from_child))
		die("pipe");
	child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		close(to_child[1]);
		close(from_child[0]);
		strict_child(to_child[0], from_child[1]);
	}
	close(to_child[0]);
	close(from_child[1]);
	/* After the fork: a filter would keep the child out of strict mode. */
	if (!strcmp(mode, "notify")) {
		int listener = install(SYS_getppid, SECCOMP_RET_USER_NOTIF,
				       SECCOMP_FILTER_FLAG_NEW_LISTENER);
		if (listener < 0)
			die("user-notification filter");
		close(listener);
	}

	if (install(SYS_getppid, SECCOMP_RET_ERRNO | EPERM, 0) ||
	    install(SYS_getppid, SECCOMP_RET_ERRNO | ENOTTY, SECCOMP_FILTER_FLAG_LOG))
		die("seccomp filters");
	if (pthread_create(&t, NULL, work, NULL))
		die("pthread_create");
	while (!worker_ready)
		victim_tick();

	victim_ready_and_wait(NULL);

	errno = 0;
	{
		long r = syscall(SYS_getppid);
		CHECK(r == -1 && errno == ENOTTY, "getppid returned %ld errno %d, want ENOTTY", r,
		      errno);
	}
	CHECK(syscall(SYS_getsid, 0) >= 0, "main getsid failed: errno %d", errno);
	CHECK(getpid() > 0, "getpid failed");
	stop = 1;
	pthread_join(t, NULL);
	CHECK(!worker_fail[0], "%s", worker_fail);

	if (write(to_child[1], &c, 1) != 1)
		fail("write to the strict child: errno %d", errno);
	else if (read(from_child[0], &c, 1) != 1 || c != ('a' ^ 0x20))
		fail("strict child did not echo");
	if (waitpid(child, &status, 0) != child)
		fail("waitpid: errno %d", errno);
	else
		CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
		      "strict child: status %#x, want killed by SIGKILL", status);
	victim_finish();
}
