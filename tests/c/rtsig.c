/*
 * Queued real-time signals with payloads, to the process and to single
 * threads. All are blocked in both threads:
 *
 *   process: SIGRTMIN+5 three times (values 0x100, 0x101, 0x102) and a
 *            kill'd SIGTRAP (ckpt's own breakpoints trap with SIGTRAP);
 *   thread T: SIGRTMIN+6 twice (0x200, 0x201), SIGRTMIN+5 once (0x300)
 *             and a pthread_kill'd SIGUSR1 and SIGTRAP (SI_TKILL);
 *   main thread: SIGRTMIN+6 once (0x400).
 *
 * After go each thread takes its own with sigtimedwait: same order, same
 * values, codes, sender pid and uid, nothing extra; a thread's private
 * ones first, then the process's, which only main takes.
 */
#include "victim.h"

#include <pthread.h>
#include <signal.h>

#define RT1 (SIGRTMIN + 5)
#define RT2 (SIGRTMIN + 6)

static volatile int go_flag;
static pid_t me;
static uid_t uid;

static const struct timespec zero;

static void take(const char *who, int sig, int value, int code)
{
	sigset_t set;
	siginfo_t si;
	memset(&si, 0, sizeof(si));
	sigemptyset(&set);
	sigaddset(&set, sig);
	int got = sigtimedwait(&set, &si, &zero);
	CHECK(got == sig, "%s: signal %d lost (%s)", who, sig, strerror(errno));
	if (got != sig)
		return;
	CHECK(si.si_code == code, "%s: signal %d si_code %d, want %d", who, sig, si.si_code, code);
	CHECK(si.si_pid == me && si.si_uid == uid, "%s: signal %d from pid %d uid %d", who, sig,
	      si.si_pid, si.si_uid);
	if (code == SI_QUEUE)
		CHECK(si.si_value.sival_int == value, "%s: signal %d value %#x, want %#x", who, sig,
		      si.si_value.sival_int, value);
}

static void none_left(const char *who, int sig)
{
	sigset_t set;
	siginfo_t si;
	sigemptyset(&set);
	sigaddset(&set, sig);
	int got = sigtimedwait(&set, &si, &zero);
	CHECK(got < 0, "%s: extra signal %d (value %#x)", who, sig, si.si_value.sival_int);
}

static void *thread_t(void *arg)
{
	(void)arg;
	while (!go_flag)
		victim_tick();
	take("thread", RT2, 0x200, SI_QUEUE);
	take("thread", RT2, 0x201, SI_QUEUE);
	none_left("thread", RT2);
	/* Its own SIGRTMIN+5 comes before the process's three. */
	take("thread", RT1, 0x300, SI_QUEUE);
	/*
	 * glibc's sigtimedwait folds SI_TKILL into SI_USER; the sender pid
	 * still tells a kept siginfo from a lost one (which has pid 0).
	 */
	take("thread", SIGUSR1, 0, SI_USER);
	none_left("thread", SIGUSR1);
	take("thread", SIGTRAP, 0, SI_USER);
	return NULL;
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	me = getpid();
	uid = getuid();
	sigset_t block;
	sigemptyset(&block);
	sigaddset(&block, RT1);
	sigaddset(&block, RT2);
	sigaddset(&block, SIGUSR1);
	sigaddset(&block, SIGTRAP);
	if (sigprocmask(SIG_BLOCK, &block, NULL))
		die("sigprocmask");
	pthread_t t;
	if (pthread_create(&t, NULL, thread_t, NULL))
		die("pthread_create");
	union sigval v;
	for (int i = 0; i < 3; i++) {
		v.sival_int = 0x100 + i;
		if (sigqueue(me, RT1, v))
			die("sigqueue");
	}
	v.sival_int = 0x200;
	if (pthread_sigqueue(t, RT2, v))
		die("pthread_sigqueue");
	v.sival_int = 0x201;
	if (pthread_sigqueue(t, RT2, v))
		die("pthread_sigqueue");
	v.sival_int = 0x300;
	if (pthread_sigqueue(t, RT1, v))
		die("pthread_sigqueue");
	if (pthread_kill(t, SIGUSR1) || pthread_kill(t, SIGTRAP))
		die("pthread_kill");
	if (kill(me, SIGTRAP))
		die("kill SIGTRAP");
	v.sival_int = 0x400;
	if (pthread_sigqueue(pthread_self(), RT2, v))
		die("pthread_sigqueue self");
	victim_ready_and_wait(NULL);

	go_flag = 1;
	pthread_join(t, NULL);
	take("main", RT2, 0x400, SI_QUEUE);
	none_left("main", RT2);
	take("main", RT1, 0x100, SI_QUEUE);
	take("main", RT1, 0x101, SI_QUEUE);
	take("main", RT1, 0x102, SI_QUEUE);
	none_left("main", RT1);
	take("main", SIGTRAP, 0, SI_USER);
	none_left("main", SIGTRAP);
	victim_finish();
}
