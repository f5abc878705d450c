/*
 * UTS, IPC and time namespaces across a checkpoint (usage: namespaces
 * WORKDIR HOSTNAME), run under `ckpt run --pidns --utsns --ipcns --timens`.
 * Sets its hostname and domainname (HOSTNAME "-": keeps those it started
 * with, as an unprivileged job must), creates (after a few throwaway ones, so
 * the ids are not the namespace's first) a SysV shm segment filled with a
 * pattern, a semaphore set and a message queue, all keyed, and reads
 * CLOCK_MONOTONIC and CLOCK_BOOTTIME. Ready: "shmid semid msqid mono_ns
 * boot_ns". After go: same names; the same ids hold the same key and
 * contents; a second pattern-filled segment created right after restore
 * gets a fresh id (the namespace's counters were not left at zero); the
 * clocks did not go back. Writes WORKDIR/clock: CLOCK_MONOTONIC (ns) as
 * read after go.
 */
#include "victim.h"

#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/utsname.h>

#define KEY 0x4e53434bu
#define SHM_LEN (256u << 10)
#define SEED 0x6e616d657370u
#define DOMAIN "ckpt-ns-domain"
#define THROWAWAY 3
#define NSEMS 3

union semun {
	int val;
	struct semid_ds *buf;
	unsigned short *array;
};

static const unsigned short sem_values[NSEMS] = { 9, 0, 4242 };
static const char *messages[2] = { "first in the namespace", "second, type 5" };
static const long mtypes[2] = { 1, 5 };

struct msg {
	long mtype;
	char text[64];
};

static int64_t clock_ns(clockid_t c)
{
	struct timespec ts;
	if (clock_gettime(c, &ts) != 0)
		die("clock_gettime");
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	if (argc < 3)
		die("usage: namespaces WORKDIR HOSTNAME");
	static struct utsname start;
	if (uname(&start) != 0)
		die("uname");
	const char *host = argv[2];
	const char *domain = DOMAIN;
	if (strcmp(host, "-") == 0) {
		host = start.nodename;
		domain = start.domainname;
	} else {
		if (sethostname(host, strlen(host)) != 0)
			die("sethostname");
		if (setdomainname(DOMAIN, strlen(DOMAIN)) != 0)
			die("setdomainname");
	}

	/* Ids are index + sequence * 32768: used and removed ones move on. */
	for (int i = 0; i < THROWAWAY; i++) {
		int s = shmget(IPC_PRIVATE, 4096, 0600);
		int m = semget(IPC_PRIVATE, 1, 0600);
		int q = msgget(IPC_PRIVATE, 0600);
		if (s < 0 || m < 0 || q < 0)
			die("throwaway ipc");
		shmctl(s, IPC_RMID, NULL);
		semctl(m, 0, IPC_RMID);
		msgctl(q, IPC_RMID, NULL);
	}
	int shmid = shmget(KEY, SHM_LEN, IPC_CREAT | IPC_EXCL | 0600);
	if (shmid < 0)
		die("shmget");
	void *seg = shmat(shmid, NULL, 0);
	if (seg == (void *)-1)
		die("shmat");
	fill_pattern(seg, SHM_LEN, SEED);
	uint64_t sum = hash_bytes(seg, SHM_LEN, 0);
	int semid = semget(KEY, NSEMS, IPC_CREAT | IPC_EXCL | 0600);
	if (semid < 0)
		die("semget");
	union semun arg = { .array = (unsigned short *)sem_values };
	if (semctl(semid, 0, SETALL, arg) != 0)
		die("SETALL");
	int msqid = msgget(KEY, IPC_CREAT | IPC_EXCL | 0600);
	if (msqid < 0)
		die("msgget");
	for (int i = 0; i < 2; i++) {
		struct msg m = { .mtype = mtypes[i] };
		strcpy(m.text, messages[i]);
		if (msgsnd(msqid, &m, strlen(m.text) + 1, 0) != 0)
			die("msgsnd");
	}
	int64_t mono = clock_ns(CLOCK_MONOTONIC);
	int64_t boot = clock_ns(CLOCK_BOOTTIME);

	char ready[256];
	snprintf(ready, sizeof(ready), "%d %d %d %lld %lld", shmid, semid, msqid, (long long)mono,
		 (long long)boot);
	victim_ready_and_wait(ready);

	int64_t mono_after = clock_ns(CLOCK_MONOTONIC);
	int64_t boot_after = clock_ns(CLOCK_BOOTTIME);
	CHECK(mono_after >= mono, "CLOCK_MONOTONIC went back: %lld after %lld",
	      (long long)mono_after, (long long)mono);
	CHECK(boot_after >= boot, "CLOCK_BOOTTIME went back: %lld after %lld",
	      (long long)boot_after, (long long)boot);

	struct utsname u;
	if (uname(&u) != 0)
		die("uname");
	CHECK(strcmp(u.nodename, host) == 0, "hostname %s, want %s", u.nodename, host);
	CHECK(strcmp(u.domainname, domain) == 0, "domainname %s, want %s", u.domainname, domain);

	CHECK(shmget(KEY, 0, 0) == shmid, "segment of key %x has id %d, want %d", KEY,
	      shmget(KEY, 0, 0), shmid);
	CHECK(hash_bytes(seg, SHM_LEN, 0) == sum, "segment contents changed");
	void *again = shmat(shmid, NULL, SHM_RDONLY);
	CHECK(again != (void *)-1 && hash_bytes(again, SHM_LEN, 0) == sum,
	      "segment by id: not attachable or other contents");

	CHECK(semget(KEY, 0, 0) == semid, "semaphore set id %d, want %d", semget(KEY, 0, 0), semid);
	unsigned short got[NSEMS] = { 0 };
	union semun out = { .array = got };
	CHECK(semctl(semid, 0, GETALL, out) == 0 && memcmp(got, sem_values, sizeof(got)) == 0,
	      "semaphore values %u %u %u", got[0], got[1], got[2]);

	CHECK(msgget(KEY, 0) == msqid, "queue id %d, want %d", msgget(KEY, 0), msqid);
	for (int i = 0; i < 2; i++) {
		struct msg m;
		ssize_t n = msgrcv(msqid, &m, sizeof(m.text), 0, IPC_NOWAIT);
		CHECK(n > 0 && m.mtype == mtypes[i] && strcmp(m.text, messages[i]) == 0,
		      "message %d: %zd bytes, type %ld", i, n, n > 0 ? m.mtype : 0);
	}

	/* The namespace is a new one of the job's own: nothing of the host's. */
	int fresh = shmget(IPC_PRIVATE, 4096, 0600);
	CHECK(fresh >= 0 && fresh != shmid, "new segment id %d", fresh);
	struct shm_info info;
	int highest = shmctl(0, SHM_INFO, (struct shmid_ds *)&info);
	CHECK(highest >= 0 && info.used_ids == 2, "%d segments in the namespace, want 2",
	      (int)info.used_ids);
	shmctl(fresh, IPC_RMID, NULL);

	char clock_text[64];
	snprintf(clock_text, sizeof(clock_text), "%lld", (long long)clock_ns(CLOCK_MONOTONIC));
	victim_write_file("clock", clock_text);
	victim_finish();
	return 0;
}
