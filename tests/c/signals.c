/*
 * Signals victim.
 *
 * Before ready: SIGUSR1 handler (SA_RESTART|SA_SIGINFO, mask {SIGQUIT}),
 * SIGUSR2 handler (mask {SIGINT}), SIGINT ignored, SIGHUP handler with
 * SA_RESETHAND, SIGTERM, SIGTRAP and SIGRTMIN+3 blocked, two queued
 * SIGRTMIN+3 with distinct si_value, a SIGTRAP raised to itself (pending
 * for the thread: ckpt's own breakpoints trap with SIGTRAP too).  The harness sends SIGTERM (blocked, so it stays
 * pending) before dumping.
 *
 * Protocol after restore:
 *   go    -> compare the whole sigaction table, blocked mask and pending set
 *            with the pre-dump snapshot; write "stage1" ("ok" or the failure)
 *   go2   -> (the harness has sent SIGUSR1, SIGUSR2 and SIGHUP, then wrote
 *            its pid into go2) verify each handler ran once, saw the right
 *            signo/si_pid/si_code and the right blocked mask, and that
 *            SA_RESETHAND reset SIGHUP to SIG_DFL; then dequeue the queued
 *            real-time signals and check their values.
 */
#include "victim.h"

#include <signal.h>

#define NSIG_CHECK 65
#define RTSIG (SIGRTMIN + 3)

static struct sigaction before[NSIG_CHECK];
static int have_before[NSIG_CHECK];
static sigset_t blocked_before;

static volatile sig_atomic_t usr1_count, usr1_signo, usr1_code;
static volatile pid_t usr1_pid;
static volatile sig_atomic_t usr1_quit_blocked;
static volatile sig_atomic_t usr2_count, usr2_int_blocked, usr2_usr2_blocked;
static volatile sig_atomic_t hup_count;

static void on_usr1(int sig, siginfo_t *si, void *uc)
{
	sigset_t cur;

	(void)uc;
	usr1_signo = sig;
	usr1_pid = si->si_pid;
	usr1_code = si->si_code;
	sigprocmask(SIG_BLOCK, NULL, &cur);
	usr1_quit_blocked = sigismember(&cur, SIGQUIT);
	usr1_count++;
}

static void on_usr2(int sig)
{
	sigset_t cur;

	(void)sig;
	sigprocmask(SIG_BLOCK, NULL, &cur);
	usr2_int_blocked = sigismember(&cur, SIGINT);
	usr2_usr2_blocked = sigismember(&cur, SIGUSR2);
	usr2_count++;
}

static void on_hup(int sig)
{
	(void)sig;
	hup_count++;
}

static void install(int sig, struct sigaction *sa)
{
	if (sigaction(sig, sa, NULL))
		die("sigaction");
}

static void setup(void)
{
	struct sigaction sa;
	sigset_t block;
	union sigval v;

	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = on_usr1;
	sa.sa_flags = SA_RESTART | SA_SIGINFO;
	sigemptyset(&sa.sa_mask);
	sigaddset(&sa.sa_mask, SIGQUIT);
	install(SIGUSR1, &sa);

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr2;
	sigemptyset(&sa.sa_mask);
	sigaddset(&sa.sa_mask, SIGINT);
	install(SIGUSR2, &sa);

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = SIG_IGN;
	sigemptyset(&sa.sa_mask);
	install(SIGINT, &sa);

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_hup;
	sa.sa_flags = SA_RESETHAND;
	sigemptyset(&sa.sa_mask);
	install(SIGHUP, &sa);

	sigemptyset(&block);
	sigaddset(&block, SIGTERM);
	sigaddset(&block, RTSIG);
	sigaddset(&block, SIGTRAP);
	if (sigprocmask(SIG_BLOCK, &block, NULL))
		die("sigprocmask");
	if (raise(SIGTRAP))
		die("raise SIGTRAP");

	/* Two queued instances of a blocked RT signal, each with its own value. */
	v.sival_int = 0x1234;
	if (sigqueue(getpid(), RTSIG, v))
		die("sigqueue 1");
	v.sival_int = 0x5678;
	if (sigqueue(getpid(), RTSIG, v))
		die("sigqueue 2");
}

static void snapshot(void)
{
	for (int s = 1; s < NSIG_CHECK; s++)
		have_before[s] = sigaction(s, NULL, &before[s]) == 0;
	sigprocmask(SIG_BLOCK, NULL, &blocked_before);
}

static int same_set(const sigset_t *a, const sigset_t *b, int *first_diff)
{
	for (int s = 1; s < NSIG_CHECK; s++)
		if (sigismember(a, s) != sigismember(b, s)) {
			*first_diff = s;
			return 0;
		}
	return 1;
}

static void verify_table(void)
{
	sigset_t blocked, pending;
	int d = 0;

	for (int s = 1; s < NSIG_CHECK; s++) {
		struct sigaction now;

		if (sigaction(s, NULL, &now) != 0) {
			CHECK(!have_before[s], "sigaction(%d) fails after restore", s);
			continue;
		}
		if (!have_before[s])
			continue;
		CHECK(now.sa_handler == before[s].sa_handler, "signal %d: handler %p, was %p", s,
		      (void *)now.sa_handler, (void *)before[s].sa_handler);
		CHECK(now.sa_flags == before[s].sa_flags, "signal %d: sa_flags %#x, was %#x", s,
		      now.sa_flags, before[s].sa_flags);
		CHECK(now.sa_restorer == before[s].sa_restorer, "signal %d: sa_restorer changed",
		      s);
		CHECK(same_set(&now.sa_mask, &before[s].sa_mask, &d),
		      "signal %d: sa_mask differs at signal %d", s, d);
	}
	sigprocmask(SIG_BLOCK, NULL, &blocked);
	CHECK(same_set(&blocked, &blocked_before, &d), "blocked mask differs at signal %d", d);

	sigpending(&pending);
	CHECK(sigismember(&pending, SIGTERM), "SIGTERM sent before the dump is no longer pending");
	CHECK(sigismember(&pending, RTSIG), "queued SIGRTMIN+3 is no longer pending");
	CHECK(sigismember(&pending, SIGTRAP), "SIGTRAP raised before the dump is no longer pending");
	for (int s = 1; s < NSIG_CHECK; s++)
		CHECK(s == SIGTERM || s == RTSIG || s == SIGTRAP || !sigismember(&pending, s),
		      "unexpected pending signal %d", s);
}

static long read_sender_pid(void)
{
	char p[PATH_MAX], buf[64];

	victim_path(p, sizeof(p), "go2");
	if (read_small_file(p, buf, sizeof(buf)) == (size_t)-1)
		return -1;
	return strtol(buf, NULL, 10);
}

static void verify_delivery(void)
{
	long sender = read_sender_pid();
	struct sigaction now;
	struct timespec deadline;
	sigset_t rt;
	siginfo_t si;
	struct timespec zero = { 0, 0 };

	memset(&si, 0, sizeof(si));

	/* Signals were sent before go2 was written, but allow delivery to lag. */
	clock_gettime(CLOCK_MONOTONIC, &deadline);
	deadline.tv_sec += 5;
	while ((!usr1_count || !usr2_count || !hup_count) && !victim_timespec_passed(&deadline))
		victim_tick();

	CHECK(sender > 0, "go2 does not contain the sender pid");
	CHECK(usr1_count == 1, "SIGUSR1 handler ran %d times, want 1", (int)usr1_count);
	CHECK(usr1_signo == SIGUSR1, "SIGUSR1 handler got signo %d", (int)usr1_signo);
	CHECK(usr1_pid == sender, "SIGUSR1 si_pid %d, want sender %ld", (int)usr1_pid, sender);
	CHECK(usr1_code == SI_USER, "SIGUSR1 si_code %d, want SI_USER", (int)usr1_code);
	CHECK(usr1_quit_blocked, "SIGQUIT not blocked inside SIGUSR1 handler (sa_mask lost)");
	CHECK(usr2_count == 1, "SIGUSR2 handler ran %d times, want 1", (int)usr2_count);
	CHECK(usr2_int_blocked, "SIGINT not blocked inside SIGUSR2 handler (sa_mask lost)");
	CHECK(usr2_usr2_blocked, "SIGUSR2 not blocked inside its own handler");
	CHECK(hup_count == 1, "SIGHUP handler ran %d times, want 1", (int)hup_count);
	CHECK(sigaction(SIGHUP, NULL, &now) == 0 && now.sa_handler == SIG_DFL,
	      "SA_RESETHAND did not reset SIGHUP to SIG_DFL");

	/* The queued RT signals keep their order and payload. */
	sigemptyset(&rt);
	sigaddset(&rt, RTSIG);
	CHECK(sigtimedwait(&rt, &si, &zero) == RTSIG && si.si_value.sival_int == 0x1234 &&
		      si.si_code == SI_QUEUE && si.si_pid == getpid(),
	      "first queued SIGRTMIN+3 lost or changed (value %#x)", si.si_value.sival_int);
	CHECK(sigtimedwait(&rt, &si, &zero) == RTSIG && si.si_value.sival_int == 0x5678,
	      "second queued SIGRTMIN+3 lost or changed (value %#x)", si.si_value.sival_int);
	CHECK(sigtimedwait(&rt, &si, &zero) < 0, "extra SIGRTMIN+3 instance queued");

	/* The SIGTRAP is the one raised (sent by a process: code SI_USER or
	 * SI_TKILL, by itself), not one of ckpt's breakpoints (SI_KERNEL). */
	sigemptyset(&rt);
	sigaddset(&rt, SIGTRAP);
	CHECK(sigtimedwait(&rt, &si, &zero) == SIGTRAP && si.si_code <= 0 &&
		      si.si_pid == getpid(),
	      "the raised SIGTRAP lost or changed (code %d, pid %d)", si.si_code, (int)si.si_pid);
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	setup();
	snapshot();
	victim_ready_and_wait(NULL);

	verify_table();
	if (victim_failures) {
		victim_write_file("stage1", victim_first_failure);
		victim_finish();
	}
	victim_write_file("stage1", "ok");
	victim_wait_for("go2");
	verify_delivery();
	victim_finish();
}
