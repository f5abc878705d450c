/*
 * Scheduling and prctl state, per thread and per process.
 *
 * `sched WORKDIR root|user|mdwe`.  The leader and a worker thread get
 * DIFFERENT nice values / policies, CPU masks, I/O priorities, timer slacks
 * and names; the process gets an oom_score_adj, THP disabled, child
 * subreaper, not dumpable, an execution domain and locked memory (mlock,
 * mlock2 on fault, and as root mlockall(MCL_FUTURE)). A forked child sets a
 * parent-death signal (SIGUSR1). After go each thread checks its own values
 * from inside, the child reports its PR_GET_PDEATHSIG, and once the parent
 * has written its result and exited the child must get SIGUSR1 (it writes
 * WORKDIR/pdeath).
 *
 * "root" uses what only root may set (negative nice, SCHED_FIFO, the
 * real-time I/O class, mlockall); "user" what an
 * unprivileged user may (raised nice, SCHED_BATCH, best-effort I/O,
 * affinity, mlock within RLIMIT_MEMLOCK). "mdwe" sets
 * memory-deny-write-execute and "deadline" puts the worker under
 * SCHED_DEADLINE, which the dump must refuse by name.
 */
#include "victim.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#ifndef PR_SET_MDWE
#define PR_SET_MDWE 65
#define PR_MDWE_REFUSE_EXEC_GAIN 1
#endif
#ifndef MLOCK_ONFAULT
#define MLOCK_ONFAULT 1
#endif
#define SCHED_FLAG_RESET_ON_FORK 0x01
#define IOPRIO_WHO_PROCESS 1
#define IOPRIO_CLASS_SHIFT 13
#define IOPRIO(class, data) (((class) << IOPRIO_CLASS_SHIFT) | (data))
#define IOPRIO_CLASS_RT 1
#define IOPRIO_CLASS_BE 2
#define PAGE 4096

struct sched_attr_v0 {
	uint32_t size;
	uint32_t policy;
	uint64_t flags;
	int32_t nice;
	uint32_t priority;
	uint64_t runtime, deadline, period;
};

/* What one thread sets and later expects of itself. */
struct want {
	const char *name;
	uint32_t policy;
	uint64_t flags;
	int nice;
	uint32_t priority;
	int cpu;
	int ioprio;
	unsigned long slack;
};

static int as_root, deadline;
static struct want leader, worker;
static volatile int worker_ready, worker_check;
static char worker_fail[256];

static void set_self(const struct want *w)
{
	struct sched_attr_v0 a = { .size = sizeof(a), .policy = w->policy, .flags = w->flags,
				   .nice = w->nice, .priority = w->priority };
	cpu_set_t set;

	if (prctl(PR_SET_NAME, w->name))
		die("PR_SET_NAME");
	if (prctl(PR_SET_TIMERSLACK, w->slack))
		die("PR_SET_TIMERSLACK");
	if (syscall(SYS_sched_setattr, 0, &a, 0))
		die("sched_setattr");
	CPU_ZERO(&set);
	CPU_SET(w->cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		die("sched_setaffinity");
	if (syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, w->ioprio))
		die("ioprio_set");
}

/* Checks the calling thread against `w`; the first difference into `out`. */
static void check_self(const struct want *w, char *out, size_t len)
{
	struct sched_attr_v0 a;
	cpu_set_t set;
	char name[16] = "";
	long ioprio, slack;

	memset(&a, 0, sizeof(a));
	if (syscall(SYS_sched_getattr, 0, &a, sizeof(a), 0)) {
		snprintf(out, len, "%s: sched_getattr: %s", w->name, strerror(errno));
		return;
	}
	CPU_ZERO(&set);
	sched_getaffinity(0, sizeof(set), &set);
	ioprio = syscall(SYS_ioprio_get, IOPRIO_WHO_PROCESS, 0);
	/* An RT thread's slack is 0 whatever it asked for. */
	slack = prctl(PR_GET_TIMERSLACK);
	prctl(PR_GET_NAME, name);
	if (strcmp(name, w->name))
		snprintf(out, len, "%s: name is %s", w->name, name);
	else if (a.policy != w->policy)
		snprintf(out, len, "%s: policy %u, want %u", w->name, a.policy, w->policy);
	else if ((a.flags & SCHED_FLAG_RESET_ON_FORK) != w->flags)
		snprintf(out, len, "%s: sched flags %#llx, want %#llx", w->name,
			 (unsigned long long)a.flags, (unsigned long long)w->flags);
	else if (a.nice != w->nice)
		snprintf(out, len, "%s: nice %d, want %d", w->name, a.nice, w->nice);
	else if (a.priority != w->priority)
		snprintf(out, len, "%s: priority %u, want %u", w->name, a.priority, w->priority);
	else if (CPU_COUNT(&set) != 1 || !CPU_ISSET(w->cpu, &set))
		snprintf(out, len, "%s: affinity has %d CPUs, want only CPU %d", w->name,
			 CPU_COUNT(&set), w->cpu);
	else if (ioprio != w->ioprio)
		snprintf(out, len, "%s: ioprio %#lx, want %#x", w->name, ioprio, w->ioprio);
	else if (w->policy != SCHED_FIFO && slack != (long)w->slack)
		snprintf(out, len, "%s: timer slack %ld, want %lu", w->name, slack, w->slack);
	else if (w->policy == SCHED_FIFO && slack != 0)
		snprintf(out, len, "%s: real-time timer slack %ld, want 0", w->name, slack);
}

/* SCHED_DEADLINE: 1 ms every 100 ms, over every CPU (as it requires). */
static void set_deadline(void)
{
	struct sched_attr_v0 a = { .size = sizeof(a), .policy = 6, .runtime = 1000000,
				   .deadline = 100000000, .period = 100000000 };
	cpu_set_t set;

	CPU_ZERO(&set);
	for (int c = 0; c < CPU_SETSIZE; c++)
		CPU_SET(c, &set);
	if (sched_setaffinity(0, sizeof(set), &set))
		die("sched_setaffinity (all)");
	if (syscall(SYS_sched_setattr, 0, &a, 0))
		die("sched_setattr (SCHED_DEADLINE)");
}

static void *work(void *arg)
{
	(void)arg;
	if (deadline)
		set_deadline();
	else
		set_self(&worker);
	worker_ready = 1;
	while (!worker_check)
		victim_tick();
	if (!deadline)
		check_self(&worker, worker_fail, sizeof(worker_fail));
	worker_check = 2;
	return NULL;
}

/* VmFlags of the mapping holding `addr`, from /proc/self/smaps. */
static int vm_flags(void *addr, char *out, size_t len)
{
	static char buf[1 << 20];
	char *line, *save;
	int fd = open("/proc/self/smaps", O_RDONLY | O_CLOEXEC), found = 0;
	ssize_t n, total = 0;

	if (fd < 0)
		return -1;
	while ((n = read(fd, buf + total, sizeof(buf) - 1 - total)) > 0)
		total += n;
	close(fd);
	buf[total] = 0;
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		unsigned long a, b;

		if (sscanf(line, "%lx-%lx ", &a, &b) == 2 && strchr(line, '-') < strchr(line, ' '))
			found = (uintptr_t)addr >= a && (uintptr_t)addr < b;
		else if (found && !strncmp(line, "VmFlags:", 8)) {
			snprintf(out, len, "%s ", line + 8);
			return 0;
		}
	}
	return -1;
}

static int has_flag(void *addr, const char *flag)
{
	char flags[256], want[8];

	if (vm_flags(addr, flags, sizeof(flags)))
		return 0;
	snprintf(want, sizeof(want), " %s ", flag);
	return strstr(flags, want) != NULL;
}

static void on_pdeath(int sig)
{
	(void)sig;
	victim_write_file("pdeath", "SIGUSR1");
	_exit(0);
}

/* The child: a parent-death signal, reported after restore, then awaited. */
static void child(void)
{
	char msg[32];

	signal(SIGUSR1, on_pdeath);
	if (prctl(PR_SET_PDEATHSIG, SIGUSR1))
		_exit(2);
	victim_write_file("child-ready", "ready");
	victim_child_wait_go(3);
	int sig = -1;
	prctl(PR_GET_PDEATHSIG, &sig);
	snprintf(msg, sizeof(msg), "%d", sig);
	victim_write_file("child-pdeath", msg);
	for (;;)
		pause();
}

static void read_file(const char *path, char *out, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n = fd < 0 ? -1 : read(fd, out, len - 1);

	out[n > 0 ? n : 0] = 0;
	if (fd >= 0)
		close(fd);
}

int main(int argc, char **argv)
{
	pthread_t t;
	char *locked, *onfault, *future = NULL, flags[64], buf[256], path[PATH_MAX];
	int oom = 0, sub = 0, mdwe;
	pid_t pid;

	victim_init(argc, argv);
	if (argc < 3)
		die("usage: sched WORKDIR root|user|mdwe");
	as_root = !strcmp(argv[2], "root");
	mdwe = !strcmp(argv[2], "mdwe");
	deadline = !strcmp(argv[2], "deadline");

	leader = (struct want){ .name = "sched-main", .policy = SCHED_OTHER, .nice = 5,
				.cpu = 1, .ioprio = IOPRIO(IOPRIO_CLASS_BE, 2),
				.slack = 123456 };
	worker = (struct want){ .name = "sched-worker", .policy = SCHED_BATCH,
				.flags = SCHED_FLAG_RESET_ON_FORK, .nice = 12, .cpu = 0,
				.ioprio = IOPRIO(IOPRIO_CLASS_BE, 6), .slack = 777000 };
	oom = 500;
	if (as_root) {
		leader.nice = -5;
		leader.ioprio = IOPRIO(IOPRIO_CLASS_RT, 4);
		worker.policy = SCHED_FIFO;
		worker.nice = 0;
		worker.priority = 10;
		oom = 654;
	}

	/* The child first: it must not inherit the leader's settings. */
	pid = fork();
	if (pid < 0)
		die("fork");
	if (pid == 0)
		child();
	victim_wait_for("child-ready");

	set_self(&leader);
	if (pthread_create(&t, NULL, work, NULL))
		die("pthread_create");
	while (!worker_ready)
		victim_tick();

	snprintf(buf, sizeof(buf), "%d", oom);
	int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write(fd, buf, strlen(buf)) < 0)
		die("oom_score_adj");
	close(fd);
	if (prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0))
		die("PR_SET_THP_DISABLE");
	if (prctl(PR_SET_CHILD_SUBREAPER, 1))
		die("PR_SET_CHILD_SUBREAPER");
	if (personality(ADDR_NO_RANDOMIZE | READ_IMPLIES_EXEC) < 0)
		die("personality");

	locked = mmap(NULL, 3 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	onfault = mmap(NULL, 2 * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (locked == MAP_FAILED || onfault == MAP_FAILED)
		die("mmap");
	memset(locked, 0x5a, 3 * PAGE);
	if (mlock(locked, 3 * PAGE))
		die("mlock");
	if (syscall(SYS_mlock2, onfault, 2 * PAGE, MLOCK_ONFAULT))
		die("mlock2");
	if (as_root && mlockall(MCL_FUTURE))
		die("mlockall");
	if (mdwe && prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0))
		die("PR_SET_MDWE");
	/* Last: a change of ids would reset it, and it hides /proc/self. */
	if (prctl(PR_SET_DUMPABLE, 0))
		die("PR_SET_DUMPABLE");

	victim_ready_and_wait(NULL);

	buf[0] = 0;
	check_self(&leader, buf, sizeof(buf));
	CHECK(!buf[0], "%s", buf);
	worker_check = 1;
	while (worker_check != 2)
		victim_tick();
	CHECK(!worker_fail[0], "%s", worker_fail);

	read_file("/proc/self/oom_score_adj", flags, sizeof(flags));
	CHECK(atoi(flags) == oom, "oom_score_adj %s, want %d", flags, oom);
	CHECK(prctl(PR_GET_THP_DISABLE, 0, 0, 0, 0) == 1, "THP not disabled");
	prctl(PR_GET_CHILD_SUBREAPER, &sub);
	CHECK(sub == 1, "not a child subreaper");
	CHECK(prctl(PR_GET_DUMPABLE) == 0, "dumpable %d", prctl(PR_GET_DUMPABLE));
	CHECK(personality(0xffffffff) == (ADDR_NO_RANDOMIZE | READ_IMPLIES_EXEC),
	      "personality %#x", personality(0xffffffff));
	CHECK(has_flag(locked, "lo") && !has_flag(locked, "lf"), "mlocked range lost its lock");
	CHECK(locked[PAGE] == 0x5a, "locked memory changed");
	CHECK(has_flag(onfault, "lf"), "mlock2(MLOCK_ONFAULT) range lost its lock");
	future = mmap(NULL, PAGE, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (future == MAP_FAILED)
		die("mmap after restore");
	CHECK(has_flag(future, "lo") == as_root, "mlockall(MCL_FUTURE) %s",
	      as_root ? "lost" : "appeared");
	munmap(future, PAGE);

	victim_wait_for("child-pdeath");
	victim_path(path, sizeof(path), "child-pdeath");
	read_file(path, flags, sizeof(flags));
	CHECK(atoi(flags) == SIGUSR1, "child's parent-death signal %s, want %d", flags, SIGUSR1);
	/* The child gets SIGUSR1 when this exits: the test waits for it. */
	victim_finish();
}
