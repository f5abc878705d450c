/*
 * membarrier registrations: the process registers for the private
 * expedited barriers (plain, SYNC_CORE, RSEQ) and the global expedited
 * one. After go, MEMBARRIER_CMD_GET_REGISTRATIONS reports the same
 * registrations and each expedited barrier succeeds (unregistered, it
 * fails with EPERM).
 */
#include "victim.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>

/* Linux 6.3; Debian 12's headers are older. */
#ifndef MEMBARRIER_CMD_GET_REGISTRATIONS
#define MEMBARRIER_CMD_GET_REGISTRATIONS (1 << 9)
#endif

static long membarrier(int cmd)
{
	return syscall(SYS_membarrier, cmd, 0, 0);
}

static const struct {
	int reg, use;
	const char *name;
} kinds[] = {
	{ MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, MEMBARRIER_CMD_PRIVATE_EXPEDITED, "private" },
	{ MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_SYNC_CORE,
	  MEMBARRIER_CMD_PRIVATE_EXPEDITED_SYNC_CORE, "sync_core" },
	{ MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED_RSEQ, MEMBARRIER_CMD_PRIVATE_EXPEDITED_RSEQ,
	  "rseq" },
	{ MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, MEMBARRIER_CMD_GLOBAL_EXPEDITED, "global" },
};

#define KINDS (sizeof(kinds) / sizeof(kinds[0]))

static long registered;

static void check(const char *when)
{
	long now = membarrier(MEMBARRIER_CMD_GET_REGISTRATIONS);
	if (now != registered)
		fail("%s: registrations %#lx, want %#lx", when, now, registered);
	for (size_t i = 0; i < KINDS; i++)
		if ((registered & kinds[i].reg) && membarrier(kinds[i].use) != 0)
			fail("%s: %s barrier: %s", when, kinds[i].name, strerror(errno));
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	if (membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 || errno != EPERM)
		fail("an unregistered private barrier did not fail with EPERM");
	for (size_t i = 0; i < KINDS; i++) {
		if (membarrier(kinds[i].reg) == 0)
			registered |= kinds[i].reg;
		else if (kinds[i].reg == MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)
			die("register the private expedited barrier");
	}
	check("before the dump");
	victim_ready_and_wait("ready");
	check("after the restore");
	victim_finish();
}
