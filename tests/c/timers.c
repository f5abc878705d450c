/*
 * POSIX timers victim. Before the dump: a timer is created and deleted (so
 * the ids kept are not 0, 1), then
 *   - P: CLOCK_MONOTONIC, SIGEV_SIGNAL SIGRTMIN with sival_int 0x5eed,
 *     periodic every 50 ms;
 *   - O: CLOCK_REALTIME, SIGEV_SIGNAL SIGRTMIN+1 with sival_ptr &marker,
 *     one-shot, 3 s from its creation.
 *   - T: CLOCK_MONOTONIC, SIGEV_THREAD_ID SIGRTMIN+2 aimed at a second
 *     thread, periodic every 50 ms.
 * A SA_SIGINFO handler records, per signal, how many arrived, the last
 * si_value, si_timerid and the thread that took it. With "threadcpu", a
 * timer on CLOCK_THREAD_CPUTIME_ID is added (the dump must refuse it). After go: P and O are the same timer_t values
 * (ids), timer_gettime works on both with P's 50 ms period; P's signal
 * keeps arriving with its value and id; O fires exactly once, with its
 * value and id (not before go: its time left came back), within 5 s, and
 * is disarmed after.
 */
#include "victim.h"
#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>

#define PERIOD_NS (50 * 1000 * 1000)
#define ONESHOT_MS 3000
#define P_VALUE 0x5eed

static int marker;
#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid
#endif
#define NSIG_USED 3
static volatile sig_atomic_t count[NSIG_USED];
static volatile long long last_value[NSIG_USED];
static volatile int last_id[NSIG_USED];
static volatile int last_tid[NSIG_USED];
static volatile int worker_tid;

static void on_timer(int sig, siginfo_t *si, void *uc)
{
	int i = sig - SIGRTMIN;

	(void)uc;
	if (i < 0 || i >= NSIG_USED)
		return;
	last_tid[i] = (int)syscall(SYS_gettid);
	count[i]++;
	last_value[i] = (long long)(intptr_t)si->si_value.sival_ptr;
	last_id[i] = si->si_timerid;
}

static timer_t make(clockid_t clock, int sig, void *value)
{
	struct sigevent sev = { .sigev_notify = SIGEV_SIGNAL, .sigev_signo = sig };
	timer_t t;

	sev.sigev_value.sival_ptr = value;
	if (timer_create(clock, &sev, &t))
		die("timer_create");
	return t;
}

static void *worker(void *arg)
{
	(void)arg;
	worker_tid = (int)syscall(SYS_gettid);
	for (;;)
		pause();
	return NULL;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L }, rem;

	while (nanosleep(&ts, &rem) && errno == EINTR)
		ts = rem;
}

int main(int argc, char **argv)
{
	struct sigaction sa = { .sa_sigaction = on_timer, .sa_flags = SA_SIGINFO | SA_RESTART };

	victim_init(argc, argv);
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGRTMIN, &sa, NULL) || sigaction(SIGRTMIN + 1, &sa, NULL) ||
	    sigaction(SIGRTMIN + 2, &sa, NULL))
		die("sigaction");
	pthread_t th;
	if (pthread_create(&th, NULL, worker, NULL))
		die("pthread_create");
	while (!worker_tid)
		sleep_ms(1);
	timer_t gone = make(CLOCK_MONOTONIC, SIGRTMIN, NULL);
	timer_t p = make(CLOCK_MONOTONIC, SIGRTMIN, (void *)(intptr_t)P_VALUE);
	timer_t o = make(CLOCK_REALTIME, SIGRTMIN + 1, &marker);
	struct sigevent to_thread = { .sigev_notify = SIGEV_THREAD_ID, .sigev_signo = SIGRTMIN + 2 };
	timer_t t;
	to_thread.sigev_notify_thread_id = worker_tid;
	if (timer_create(CLOCK_MONOTONIC, &to_thread, &t))
		die("timer_create T");
	if (timer_delete(gone))
		die("timer_delete");
	if (argc > 2 && strcmp(argv[2], "threadcpu") == 0)
		make(CLOCK_THREAD_CPUTIME_ID, SIGRTMIN, NULL);
	int p_id = (int)(intptr_t)p, o_id = (int)(intptr_t)o;
	struct itimerspec periodic = { { 0, PERIOD_NS }, { 0, PERIOD_NS } };
	struct itimerspec once = { { 0, 0 }, { ONESHOT_MS / 1000, (ONESHOT_MS % 1000) * 1000000L } };
	if (timer_settime(p, 0, &periodic, NULL) || timer_settime(o, 0, &once, NULL) ||
	    timer_settime(t, 0, &periodic, NULL))
		die("timer_settime");

	victim_ready_and_wait(NULL);

	CHECK(count[1] == 0, "O fired before go (the dump took too long, or it lost its time)");
	struct itimerspec now;
	CHECK(timer_gettime(p, &now) == 0, "timer_gettime P (id %d): %s", p_id, strerror(errno));
	CHECK(now.it_interval.tv_sec == 0 && now.it_interval.tv_nsec == PERIOD_NS,
	      "P period %ld.%09ld", (long)now.it_interval.tv_sec, now.it_interval.tv_nsec);
	CHECK(timer_gettime(o, &now) == 0, "timer_gettime O (id %d): %s", o_id, strerror(errno));

	int p_before = count[0], t_before = count[2];
	sleep_ms(300);
	CHECK(count[2] - t_before >= 3, "T fired %d times in 300 ms after restore",
	      count[2] - t_before);
	CHECK(last_tid[2] == worker_tid, "T's signal taken by thread %d, want %d", last_tid[2],
	      worker_tid);
	CHECK(last_id[2] == (int)(intptr_t)t, "T si_timerid %d, want %d", last_id[2],
	      (int)(intptr_t)t);
	CHECK(count[0] - p_before >= 3, "P fired %d times in 300 ms after restore",
	      count[0] - p_before);
	CHECK(last_value[0] == P_VALUE, "P si_value %#llx, want %#x", last_value[0], P_VALUE);
	CHECK(last_id[0] == p_id, "P si_timerid %d, want %d", last_id[0], p_id);

	for (int waited = 0; count[1] == 0 && waited < 5000; waited += 10)
		sleep_ms(10);
	CHECK(count[1] == 1, "O fired %d times, want once", count[1]);
	CHECK(last_value[1] == (long long)(intptr_t)&marker, "O si_value %#llx, want %p",
	      last_value[1], (void *)&marker);
	CHECK(last_id[1] == o_id, "O si_timerid %d, want %d", last_id[1], o_id);
	CHECK(timer_gettime(o, &now) == 0 && now.it_value.tv_sec == 0 && now.it_value.tv_nsec == 0,
	      "O still armed after firing");
	victim_finish();
}
