/*
 * Multi-threaded victim: three workers, each with its own TLS counter,
 * blocked-signal mask, thread name, alternate signal stack and a value
 * kept in a callee-saved register, keep ticking across the checkpoint.
 * After go, every worker checks its tid, TLS, mask, name, alternate stack
 * and register, then main joins them (pthread_join depends on the restored
 * clear_child_tid address).
 *
 *   threads WORKDIR [handlers N]   N of SIGURG, SIGWINCH, SIGCHLD (in that
 *                                  order) get a handler, which must never
 *                                  run: ckpt stops threads with a signal the
 *                                  process ignores, and none may reach it.
 */
#include "victim.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>

#define NWORKERS 3

struct worker {
	int idx;
	pid_t tid;
	volatile unsigned long last;
	volatile int at_go;
	char fail[160];
};

static struct worker workers[NWORKERS];
/* Each worker's alternate signal stack (and main's, the last). */
static char altstacks[NWORKERS + 1][65536];
static volatile int quiet_handled;

static void quiet_handler(int sig)
{
	(void)sig;
	quiet_handled++;
}

/* Sets this thread's alternate stack to altstacks[i]. */
static void set_altstack(int i)
{
	stack_t ss = { .ss_sp = altstacks[i], .ss_size = sizeof(altstacks[i]), .ss_flags = 0 };
	if (sigaltstack(&ss, NULL))
		die("sigaltstack");
}

/* Whether this thread's alternate stack is still altstacks[i]. */
static int altstack_is(int i)
{
	stack_t ss;
	return sigaltstack(NULL, &ss) == 0 && ss.ss_sp == altstacks[i] &&
	       ss.ss_size == sizeof(altstacks[i]) && !(ss.ss_flags & SS_DISABLE);
}
static __thread unsigned long tls_counter;
static volatile int stop;

static void *work(void *arg)
{
	struct worker *me = arg;
	char name[16], got[16] = "";
	sigset_t m, cur;
	/* Kept in a callee-saved register across every nanosleep of the loop. */
	register unsigned long pattern asm("r12") = 0x5a5a000000000000ul | (unsigned)me->idx;

	me->tid = gettid();
	sigemptyset(&m);
	sigaddset(&m, SIGRTMIN + me->idx);
	pthread_sigmask(SIG_BLOCK, &m, NULL);
	snprintf(name, sizeof(name), "worker%d", me->idx);
	prctl(PR_SET_NAME, name);
	set_altstack(me->idx);
	tls_counter = 1000000ul * (me->idx + 1);

	while (!stop) {
		tls_counter++;
		me->last = tls_counter;
		asm volatile("" : "+r"(pattern));
		victim_tick();
	}
	asm volatile("" : "+r"(pattern));
	if (pattern != (0x5a5a000000000000ul | (unsigned)me->idx))
		snprintf(me->fail, sizeof(me->fail), "worker %d: r12 is %#lx", me->idx, pattern);
	else if (gettid() != me->tid)
		snprintf(me->fail, sizeof(me->fail), "worker %d: tid %d, was %d", me->idx, gettid(),
			 me->tid);
	else if (tls_counter != me->last || tls_counter <= 1000000ul * (me->idx + 1))
		snprintf(me->fail, sizeof(me->fail), "worker %d: TLS counter %lu, last %lu",
			 me->idx, tls_counter, me->last);
	else if (pthread_sigmask(SIG_BLOCK, NULL, &cur) || !sigismember(&cur, SIGRTMIN + me->idx) ||
		 sigismember(&cur, SIGRTMIN + (me->idx + 1) % NWORKERS))
		snprintf(me->fail, sizeof(me->fail), "worker %d: signal mask changed", me->idx);
	else if (prctl(PR_GET_NAME, got) || strcmp(got, name))
		snprintf(me->fail, sizeof(me->fail), "worker %d: name %s", me->idx, got);
	else if (!altstack_is(me->idx))
		snprintf(me->fail, sizeof(me->fail), "worker %d: alternate signal stack changed",
			 me->idx);
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t t[NWORKERS];
	unsigned long at_ready[NWORKERS];

	victim_init(argc, argv);
	int handled = argc > 3 && strcmp(argv[2], "handlers") == 0 ? atoi(argv[3]) : 0;
	const int quiet[] = { SIGURG, SIGWINCH, SIGCHLD };
	for (int i = 0; i < handled && i < 3; i++) {
		struct sigaction sa = { .sa_handler = quiet_handler };
		if (sigaction(quiet[i], &sa, NULL))
			die("sigaction");
	}
	set_altstack(NWORKERS);
	for (int i = 0; i < NWORKERS; i++) {
		workers[i].idx = i;
		if (pthread_create(&t[i], NULL, work, &workers[i]))
			die("pthread_create");
	}
	while (!workers[0].last || !workers[1].last || !workers[2].last)
		victim_tick();
	for (int i = 0; i < NWORKERS; i++)
		at_ready[i] = workers[i].last;

	victim_ready_and_wait(NULL);

	/* The workers kept counting after the restore. */
	for (int i = 0; i < NWORKERS; i++) {
		unsigned long seen = workers[i].last;
		for (int k = 0; k < 100 && workers[i].last == seen; k++)
			victim_tick();
		CHECK(workers[i].last > at_ready[i], "worker %d stopped counting (%lu)", i,
		      workers[i].last);
	}
	stop = 1;
	for (int i = 0; i < NWORKERS; i++) {
		if (pthread_join(t[i], NULL))
			fail("pthread_join %d", i);
		CHECK(workers[i].fail[0] == 0, "%s", workers[i].fail);
	}
	CHECK(altstack_is(NWORKERS), "main thread: alternate signal stack changed");
	CHECK(quiet_handled == 0, "a handled SIGURG/SIGWINCH/SIGCHLD ran %d times", quiet_handled);
	victim_finish();
}
