/*
 * SysV IPC across a checkpoint (usage: sysv WORKDIR KEY MIB [SHMID]): a
 * parent and its forked child share a keyed segment (size in MiB from
 * argv[3], filled with a pattern), an IPC_PRIVATE
 * segment already marked for removal (IPC_RMID) but still attached, a
 * semaphore set of 3 and a message queue holding messages of several
 * types; all keyed with argv[2] (hex). Publishes "shmid semid msqid
 * rmid_shmid child_pid locked" in WORKDIR/ids (locked: the removed
 * segment is also SHM_LOCKed, where RLIMIT_MEMLOCK allows). After go: same ids, same contents
 * (checksums), the child's write seen by the parent (one segment, not two
 * copies), the removed segment still marked, semaphore values, messages in
 * order. SHMID: also attach that (someone else's) segment.
 */
#include "victim.h"

#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/wait.h>

#define RMID_LEN ((1u << 20) + 100)
#define TOKEN 0x5157544f4b454eull
#define TEXT_LEN 2000

union semun {
	int val;
	struct semid_ds *buf;
	unsigned short *array;
};

static const unsigned short sem_values[3] = { 5, 0, 1234 };
static const long mtypes[4] = { 1, 7, 3, 7 };

struct msgbuf_big {
	long mtype;
	char text[TEXT_LEN];
};

static void message_text(int i, char *text, size_t *len)
{
	if (i == 3) {
		for (size_t k = 0; k < TEXT_LEN; k++)
			text[k] = (char)('a' + k % 26);
		*len = TEXT_LEN;
	} else {
		*len = (size_t)snprintf(text, TEXT_LEN, "message %d of type %ld", i, mtypes[i]);
	}
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	if (argc < 4)
		die("usage: sysv WORKDIR KEY MIB");
	key_t key = (key_t)strtoul(argv[2], NULL, 16);
	size_t len = (size_t)strtoul(argv[3], NULL, 10) << 20;

	int shmid = shmget(key, len, IPC_CREAT | IPC_EXCL | 0640);
	if (shmid < 0)
		die("shmget");
	volatile unsigned char *seg = shmat(shmid, NULL, 0);
	if (seg == (void *)-1)
		die("shmat");
	fill_pattern(seg, len, 42);
	uint64_t seg_hash = hash_bytes(seg + 4096, len - 4096, 1);

	int rmid = shmget(IPC_PRIVATE, RMID_LEN, IPC_CREAT | 0600);
	if (rmid < 0)
		die("shmget private");
	volatile unsigned char *rseg;
	/* Filled through a writable attach, kept through a read-only one. */
	volatile unsigned char *w = shmat(rmid, NULL, 0);
	if (w == (void *)-1)
		die("shmat private");
	fill_pattern(w, RMID_LEN, 7);
	uint64_t rmid_hash = hash_bytes(w, RMID_LEN, 1);
	rseg = shmat(rmid, NULL, SHM_RDONLY);
	if (rseg == (void *)-1)
		die("shmat private read-only");
	shmdt((const void *)w);
	/* Locked in memory too, where RLIMIT_MEMLOCK allows. */
	int locked = shmctl(rmid, SHM_LOCK, NULL) == 0;
	if (shmctl(rmid, IPC_RMID, NULL) < 0)
		die("IPC_RMID");

	/* Optionally also attach someone else's segment (argv[4]). */
	if (argc > 4 && shmat(atoi(argv[4]), NULL, 0) == (void *)-1)
		die("shmat of the given segment");

	int semid = semget(key, 3, IPC_CREAT | IPC_EXCL | 0640);
	if (semid < 0)
		die("semget");
	union semun arg = { .array = (unsigned short *)sem_values };
	if (semctl(semid, 0, SETALL, arg) < 0)
		die("SETALL");

	int msqid = msgget(key, IPC_CREAT | IPC_EXCL | 0600);
	if (msqid < 0)
		die("msgget");
	for (int i = 0; i < 4; i++) {
		struct msgbuf_big m = { .mtype = mtypes[i] };
		size_t n;
		message_text(i, m.text, &n);
		if (msgsnd(msqid, &m, n, IPC_NOWAIT) < 0)
			die("msgsnd");
	}

	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		victim_child_wait_go(70);
		if (hash_bytes(seg + 4096, len - 4096, 1) != seg_hash)
			_exit(71);
		if (hash_bytes(rseg, RMID_LEN, 1) != rmid_hash)
			_exit(72);
		*(volatile uint64_t *)seg = TOKEN;
		_exit(0);
	}
	char ids[128];
	snprintf(ids, sizeof(ids), "%d %d %d %d %d %d", shmid, semid, msqid, rmid, (int)child, locked);
	victim_write_file("ids", ids);
	victim_ready_and_wait(NULL);

	CHECK(hash_bytes(seg + 4096, len - 4096, 1) == seg_hash, "segment contents changed");
	CHECK(hash_bytes(rseg, RMID_LEN, 1) == rmid_hash, "removed segment's contents changed");
	CHECK(shmget(key, 0, 0) == shmid, "shmid changed: %d, was %d", shmget(key, 0, 0), shmid);
	CHECK(semget(key, 0, 0) == semid, "semid changed: %d, was %d", semget(key, 0, 0), semid);
	CHECK(msgget(key, 0) == msqid, "msqid changed: %d, was %d", msgget(key, 0), msqid);

	struct shmid_ds ds;
	CHECK(shmctl(shmid, IPC_STAT, &ds) == 0, "IPC_STAT: %s", strerror(errno));
	CHECK(ds.shm_segsz == len && (ds.shm_perm.mode & 0777) == 0640, "segment size %zu mode %o",
	      (size_t)ds.shm_segsz, ds.shm_perm.mode);
	CHECK(ds.shm_perm.uid == getuid(), "segment owner %u", ds.shm_perm.uid);
	CHECK(shmctl(rmid, IPC_STAT, &ds) == 0, "IPC_STAT removed: %s", strerror(errno));
	CHECK(ds.shm_perm.mode & SHM_DEST, "removed segment is no longer marked for removal");
	CHECK(ds.shm_segsz == RMID_LEN, "removed segment size %zu", (size_t)ds.shm_segsz);
	CHECK(!locked || (ds.shm_perm.mode & SHM_LOCKED), "removed segment is no longer locked");

	unsigned short vals[3];
	arg.array = vals;
	CHECK(semctl(semid, 0, GETALL, arg) == 0, "GETALL: %s", strerror(errno));
	for (int i = 0; i < 3; i++)
		CHECK(vals[i] == sem_values[i], "semaphore %d is %u, was %u", i, vals[i], sem_values[i]);
	struct sembuf op = { .sem_num = 0, .sem_op = -5, .sem_flg = IPC_NOWAIT };
	CHECK(semop(semid, &op, 1) == 0, "semop: %s", strerror(errno));

	for (int i = 0; i < 4; i++) {
		struct msgbuf_big m;
		char want[TEXT_LEN];
		size_t n;
		message_text(i, want, &n);
		ssize_t got = msgrcv(msqid, &m, TEXT_LEN, 0, IPC_NOWAIT);
		CHECK(got == (ssize_t)n && m.mtype == mtypes[i] && memcmp(m.text, want, n) == 0,
		      "message %d: got %zd bytes of type %ld", i, got, got < 0 ? 0 : m.mtype);
	}
	struct msgbuf_big m;
	CHECK(msgrcv(msqid, &m, TEXT_LEN, 0, IPC_NOWAIT) < 0 && errno == ENOMSG, "an extra message");

	int st;
	CHECK(waitpid(child, &st, 0) == child, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed: status %#x", st);
	CHECK(*(volatile uint64_t *)seg == TOKEN, "the child's write is not visible: not one segment");
	victim_finish();
}
