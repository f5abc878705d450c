/*
 * A session leader whose controlling terminal is a pty slave whose master
 * is outside the tree (the test holds it, as sshd would for a login):
 * the victim, which leads its own session, opens its stdin's terminal
 * without O_NOCTTY and so makes it its controlling terminal. Such a
 * terminal is not restored (restore says so in one line): after go the
 * victim checks from inside that /proc/self/stat shows no controlling
 * terminal (tty_nr 0) and that it still runs its own session.
 */
#include "victim.h"

static unsigned long own_tty_nr(void)
{
	char buf[1024];
	const char *rest = proc_stat_fields(getpid(), buf, sizeof(buf));
	char state;
	int ppid, pgrp, session;
	unsigned long tty_nr;

	if (!rest || sscanf(rest, " %c %d %d %d %lu", &state, &ppid, &pgrp, &session, &tty_nr) != 5)
		return (unsigned long)-1;
	return tty_nr;
}

int main(int argc, char **argv)
{
	char path[64];

	victim_init(argc, argv);
	if (getsid(0) != getpid())
		die("not a session leader");
	if (ttyname_r(0, path, sizeof(path)) != 0)
		die("stdin is not a terminal");
	int fd = open(path, O_RDWR);
	if (fd < 0)
		die("open the terminal");
	close(fd);
	if (own_tty_nr() == 0 || own_tty_nr() == (unsigned long)-1)
		die("the terminal did not become the controlling terminal");
	victim_ready_and_wait(NULL);
	CHECK(own_tty_nr() == 0, "a controlling terminal after restore: tty_nr %lu", own_tty_nr());
	CHECK(getsid(0) == getpid(), "no longer leads its session");
	victim_finish();
}
