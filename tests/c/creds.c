/*
 * Credentials victim, started as root with the test user's uid and gid:
 * `creds WORKDIR UID GID`. Each thread changes its own credentials with
 * the raw syscalls (glibc's set*id would broadcast to every thread):
 *   worker 0: setresgid/setresuid to the user entirely (no caps left);
 *   worker 1: real and saved ids the user's, effective root, and fs ids
 *             that are none of them (setfsuid/setfsgid);
 *   worker 2: effective uid the user's only (effective caps cleared,
 *             permitted kept).
 * The main thread stays root but drops CAP_SYS_BOOT and CAP_MKNOD from its
 * bounding set, raises CAP_NET_BIND_SERVICE into its ambient set, sets
 * securebits (locked ones included) and no_new_privs, all after the
 * workers were created, so the workers must not have them.
 * After go, every thread checks its own credentials from inside.
 *
 * `creds WORKDIR user`, run as an unprivileged user, does what such a
 * program can: only the main thread sets no_new_privs (after the workers
 * were created), and every thread checks its ids and bounding set are
 * unchanged.
 */
#include "victim.h"

#include <linux/capability.h>
#include <linux/securebits.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#define NWORKERS 3
#define FS_UID 12345u
#define FS_GID 23456u
/* NO_CAP_AMBIENT_RAISE: the restore must raise the ambient set first. */
#define MAIN_SECUREBITS                                                        \
	(SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |        \
	 SECBIT_NO_CAP_AMBIENT_RAISE)

static unsigned uid, gid;
static int privileged = 1;
static volatile int changed[NWORKERS];
static volatile int stop;
static char worker_fail[NWORKERS][200];

struct caps {
	uint64_t eff, prm, inh;
};

static struct caps get_caps(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2] = { 0 };
	struct caps c = { 0 };

	if (syscall(SYS_capget, &h, d) == 0) {
		c.eff = d[0].effective | (uint64_t)d[1].effective << 32;
		c.prm = d[0].permitted | (uint64_t)d[1].permitted << 32;
		c.inh = d[0].inheritable | (uint64_t)d[1].inheritable << 32;
	}
	return c;
}

/* This thread's ids: real, effective, saved, fs. */
static void ids(unsigned u[4], unsigned g[4])
{
	syscall(SYS_getresuid, &u[0], &u[1], &u[2]);
	syscall(SYS_getresgid, &g[0], &g[1], &g[2]);
	/* An invalid id changes nothing and returns the current one. */
	u[3] = (unsigned)syscall(SYS_setfsuid, -1);
	g[3] = (unsigned)syscall(SYS_setfsgid, -1);
}

static void expect(int idx, const unsigned u[4], const unsigned g[4])
{
	unsigned gu[4], gg[4];

	ids(gu, gg);
	if (memcmp(u, gu, sizeof(gu)) || memcmp(g, gg, sizeof(gg)))
		snprintf(worker_fail[idx], sizeof(worker_fail[idx]),
			 "worker %d: uids %u %u %u %u gids %u %u %u %u, want %u %u %u %u / %u %u %u %u",
			 idx, gu[0], gu[1], gu[2], gu[3], gg[0], gg[1], gg[2], gg[3], u[0], u[1],
			 u[2], u[3], g[0], g[1], g[2], g[3]);
}

static void *work(void *arg)
{
	int idx = (int)(intptr_t)arg;
	struct caps c;

	switch (privileged ? idx : -1) {
	case 0:
		if (syscall(SYS_setresgid, gid, gid, gid) || syscall(SYS_setresuid, uid, uid, uid))
			die("worker 0 setres*id");
		break;
	case 1:
		if (syscall(SYS_setresgid, gid, -1, gid) || syscall(SYS_setresuid, uid, -1, uid))
			die("worker 1 setres*id");
		syscall(SYS_setfsgid, FS_GID);
		syscall(SYS_setfsuid, FS_UID);
		break;
	case 2:
		if (syscall(SYS_setresuid, -1, uid, -1))
			die("worker 2 setresuid");
		break;
	}
	changed[idx] = 1;
	while (!stop)
		victim_tick();

	c = get_caps();
	switch (privileged ? idx : -1) {
	case -1: {
		unsigned u[4] = { uid, uid, uid, uid }, g[4] = { gid, gid, gid, gid };
		expect(idx, u, g);
		break;
	}
	case 0: {
		unsigned u[4] = { uid, uid, uid, uid }, g[4] = { gid, gid, gid, gid };
		expect(0, u, g);
		if (c.eff || c.prm || c.inh)
			snprintf(worker_fail[0], sizeof(worker_fail[0]),
				 "worker 0: caps %#lx/%#lx/%#lx, want none", (long)c.eff,
				 (long)c.prm, (long)c.inh);
		break;
	}
	case 1: {
		unsigned u[4] = { uid, 0, uid, FS_UID }, g[4] = { gid, 0, gid, FS_GID };
		expect(1, u, g);
		if (!(c.prm & (1ull << CAP_SYS_ADMIN)))
			snprintf(worker_fail[1], sizeof(worker_fail[1]),
				 "worker 1: lost CAP_SYS_ADMIN from permitted");
		break;
	}
	case 2: {
		unsigned u[4] = { 0, uid, 0, uid }, g[4] = { 0, 0, 0, 0 };
		expect(2, u, g);
		if (c.eff || !(c.prm & (1ull << CAP_SETUID)))
			snprintf(worker_fail[2], sizeof(worker_fail[2]),
				 "worker 2: caps eff %#lx prm %#lx, want none / CAP_SETUID",
				 (long)c.eff, (long)c.prm);
		break;
	}
	}
	/* Set in the main thread after this one was created: not ours. */
	if (prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) != 0)
		snprintf(worker_fail[idx], sizeof(worker_fail[idx]), "worker %d: no_new_privs set",
			 idx);
	if (prctl(PR_CAPBSET_READ, CAP_SYS_BOOT, 0, 0, 0) != 1)
		snprintf(worker_fail[idx], sizeof(worker_fail[idx]),
			 "worker %d: CAP_SYS_BOOT missing from its bounding set", idx);
	if (prctl(PR_GET_SECUREBITS, 0, 0, 0, 0) != 0)
		snprintf(worker_fail[idx], sizeof(worker_fail[idx]), "worker %d: securebits %d",
			 idx, prctl(PR_GET_SECUREBITS, 0, 0, 0, 0));
	return NULL;
}

int main(int argc, char **argv)
{
	pthread_t t[NWORKERS];
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	struct caps before, after;
	unsigned u[4], g[4];

	victim_init(argc, argv);
	if (argc == 3 && !strcmp(argv[2], "user")) {
		privileged = 0;
		uid = getuid();
		gid = getgid();
	} else if (argc == 4) {
		uid = (unsigned)atoi(argv[2]);
		gid = (unsigned)atoi(argv[3]);
	} else {
		die("usage: creds WORKDIR UID GID | creds WORKDIR user");
	}
	for (int i = 0; i < NWORKERS; i++)
		if (pthread_create(&t[i], NULL, work, (void *)(intptr_t)i))
			die("pthread_create");
	for (int i = 0; i < NWORKERS; i++)
		while (!changed[i])
			victim_tick();

	if (!privileged)
		goto nnp;
	if (prctl(PR_CAPBSET_DROP, CAP_SYS_BOOT, 0, 0, 0) ||
	    prctl(PR_CAPBSET_DROP, CAP_MKNOD, 0, 0, 0))
		die("PR_CAPBSET_DROP");
	if (syscall(SYS_capget, &h, d))
		die("capget");
	d[0].inheritable |= 1u << CAP_NET_BIND_SERVICE;
	if (syscall(SYS_capset, &h, d))
		die("capset");
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_NET_BIND_SERVICE, 0, 0))
		die("PR_CAP_AMBIENT_RAISE");
	if (prctl(PR_SET_SECUREBITS, MAIN_SECUREBITS, 0, 0, 0))
		die("PR_SET_SECUREBITS");
nnp:
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
		die("PR_SET_NO_NEW_PRIVS");
	before = get_caps();
	ids(u, g);

	victim_ready_and_wait(NULL);

	after = get_caps();
	CHECK(before.eff == after.eff && before.prm == after.prm && before.inh == after.inh,
	      "main: caps %#lx/%#lx/%#lx, were %#lx/%#lx/%#lx", (long)after.eff, (long)after.prm,
	      (long)after.inh, (long)before.eff, (long)before.prm, (long)before.inh);
	{
		unsigned gu[4], gg[4];

		ids(gu, gg);
		CHECK(!memcmp(u, gu, sizeof(gu)) && !memcmp(g, gg, sizeof(gg)),
		      "main: ids changed");
	}
	CHECK(prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1, "main: no_new_privs lost");
	if (!privileged)
		goto join;
	CHECK(prctl(PR_CAPBSET_READ, CAP_SYS_BOOT, 0, 0, 0) == 0,
	      "main: CAP_SYS_BOOT back in the bounding set");
	CHECK(prctl(PR_CAPBSET_READ, CAP_MKNOD, 0, 0, 0) == 0,
	      "main: CAP_MKNOD back in the bounding set");
	CHECK(prctl(PR_CAPBSET_READ, CAP_KILL, 0, 0, 0) == 1,
	      "main: CAP_KILL missing from the bounding set");
	CHECK(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, CAP_NET_BIND_SERVICE, 0, 0) == 1,
	      "main: CAP_NET_BIND_SERVICE not ambient");
	CHECK(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, CAP_KILL, 0, 0) == 0,
	      "main: CAP_KILL ambient");
	CHECK(prctl(PR_GET_SECUREBITS, 0, 0, 0, 0) == MAIN_SECUREBITS,
	      "main: securebits %#x, want %#x", prctl(PR_GET_SECUREBITS, 0, 0, 0, 0),
	      MAIN_SECUREBITS);
	/* The locked bit still holds: clearing NOROOT must fail. */
	CHECK(prctl(PR_SET_SECUREBITS, SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP, 0, 0,
		    0) != 0,
	      "main: SECBIT_NOROOT was not locked");

join:
	stop = 1;
	for (int i = 0; i < NWORKERS; i++) {
		pthread_join(t[i], NULL);
		CHECK(worker_fail[i][0] == 0, "%s", worker_fail[i]);
	}
	victim_finish();
}
