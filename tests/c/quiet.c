/*
 * The signals ckpt's parasite may end a command with (SIGURG, SIGWINCH,
 * SIGCHLD: ignored by default) when the process has them pending or
 * handles them itself.
 *
 * argv[2] "pending": SIGURG and SIGWINCH blocked and raised, so both are
 * pending for the main thread; SIGCHLD left at its default there, but a
 * second thread has it blocked and pending for itself. After go each
 * thread still has exactly its own pending, and the blocked masks are as
 * they were.
 * argv[2] "caught": all three handled (counting calls), two more threads
 * asleep. After go no handler has run and the three dispositions are
 * still the handlers.
 */
#include "victim.h"

#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>

static const int quiet[] = { SIGURG, SIGWINCH, SIGCHLD };
#define QUIET (sizeof(quiet) / sizeof(quiet[0]))

static volatile sig_atomic_t calls[QUIET];

static void on_signal(int sig)
{
	for (size_t i = 0; i < QUIET; i++)
		if (quiet[i] == sig)
			calls[i]++;
}

static void *sleeper(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

static volatile int go_thread;
static volatile int thread_checked;
static char thread_failure[128];

/* Blocks SIGCHLD and sends it to itself; after go, checks it is still
 * pending for this thread alone. */
static void *chld_pending(void *arg)
{
	sigset_t set, pending;
	(void)arg;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	syscall(SYS_tgkill, getpid(), syscall(SYS_gettid), SIGCHLD);
	thread_checked = 1;
	while (!go_thread)
		victim_tick();
	sigpending(&pending);
	if (!sigismember(&pending, SIGCHLD))
		snprintf(thread_failure, sizeof(thread_failure), "thread: SIGCHLD not pending");
	thread_checked = 2;
	return NULL;
}

static void check_pending(const char *when, const sigset_t *blocked)
{
	sigset_t pending, now;
	sigpending(&pending);
	sigprocmask(SIG_BLOCK, NULL, &now);
	for (int sig = 1; sig < NSIG; sig++) {
		int want = sig == SIGURG || sig == SIGWINCH;
		if (sigismember(&pending, sig) != want)
			fail("%s: signal %d %spending", when, sig, want ? "not " : "");
		if (sigismember(&now, sig) != sigismember(blocked, sig))
			fail("%s: signal %d blocked mask changed", when, sig);
	}
}

static void check_caught(const char *when)
{
	for (size_t i = 0; i < QUIET; i++) {
		struct sigaction sa;
		if (sigaction(quiet[i], NULL, &sa) != 0)
			die("sigaction");
		if (sa.sa_handler != on_signal)
			fail("%s: signal %d lost its handler", when, quiet[i]);
		if (calls[i] != 0)
			fail("%s: signal %d handled %d times", when, quiet[i], (int)calls[i]);
	}
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	if (argc < 3)
		die("usage: quiet WORKDIR pending|caught");
	int pending = strcmp(argv[2], "pending") == 0;
	sigset_t blocked;
	if (pending) {
		sigset_t set;
		sigemptyset(&set);
		sigaddset(&set, SIGURG);
		sigaddset(&set, SIGWINCH);
		sigprocmask(SIG_BLOCK, &set, NULL);
		raise(SIGURG);
		raise(SIGWINCH);
		sigprocmask(SIG_BLOCK, NULL, &blocked);
		check_pending("before the dump", &blocked);
		pthread_t t;
		if (pthread_create(&t, NULL, chld_pending, NULL) != 0)
			die("pthread_create");
		while (thread_checked != 1)
			victim_tick();
	} else {
		for (size_t i = 0; i < QUIET; i++) {
			struct sigaction sa = { .sa_handler = on_signal };
			sigemptyset(&sa.sa_mask);
			if (sigaction(quiet[i], &sa, NULL) != 0)
				die("sigaction");
		}
		pthread_t t;
		for (int i = 0; i < 2; i++)
			if (pthread_create(&t, NULL, sleeper, NULL) != 0)
				die("pthread_create");
		check_caught("before the dump");
	}
	victim_ready_and_wait("ready");
	if (pending) {
		check_pending("after the restore", &blocked);
		go_thread = 1;
		while (thread_checked != 2)
			victim_tick();
		if (thread_failure[0])
			fail("after the restore: %s", thread_failure);
	} else
		check_caught("after the restore");
	victim_finish();
}
