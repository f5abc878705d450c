/*
 * A session with a pseudo-terminal as its controlling terminal, as tmux,
 * screen or script set one up. The root holds the master. Its child L
 * leads a new session, opens the slave (which makes it L's controlling
 * terminal), turns echo off and gives the slave node to uid 4321, gid 5,
 * mode 0600; L's child J is a job in a process group of its own, the
 * terminal's foreground group (tcsetpgrp), with a SIGINT handler.
 *
 * Bytes in flight both ways at the dump: the root typed "typed\n" and the
 * half line "half" that L has not read, and L wrote "out\n" (which ONLCR
 * makes "out\r\n") that the root has not read.
 *
 * After go, each checks from inside: L and J read tty_nr and tpgid from
 * /proc/self/stat (the slave on their fd 0, J's group); L finds the node's
 * owner and mode; J, in front, reads "typed\n" and, once the root typed
 * "way\n", "halfway\n"; the root reads "out\r\n". Then the root types ^C into the
 * master, which must reach J as SIGINT (job control works); L reaps J.
 */
#include "victim.h"

#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>

#define NODE_UID 4321
#define NODE_GID 5
#define NODE_MODE 0600

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
	(void)sig;
	interrupted = 1;
}

/* Waits for WORKDIR/<name> in a child, exiting with `code` past the deadline. */
static void child_wait_file(const char *name, int code)
{
	while (!victim_file_exists(name)) {
		victim_tick();
		if (victim_timespec_passed(&victim_deadline))
			_exit(code);
	}
}

/* tty_nr and tpgid (fields 7 and 8) of this process's /proc/self/stat. */
static int own_tty(unsigned long *tty_nr, long *tpgid)
{
	char buf[1024];
	const char *rest = proc_stat_fields(getpid(), buf, sizeof(buf));
	char state;
	int ppid, pgrp, session;

	if (!rest)
		return -1;
	return sscanf(rest, " %c %d %d %d %lu %ld", &state, &ppid, &pgrp, &session, tty_nr,
		      tpgid) == 6 ? 0 : -1;
}

/* The controlling terminal is the slave on fd 0 and `fg` is in front. */
static int tty_is_ours(pid_t fg)
{
	struct stat st;
	unsigned long tty_nr;
	long tpgid;

	if (fstat(0, &st) != 0 || own_tty(&tty_nr, &tpgid) != 0)
		return 0;
	return tty_nr == (unsigned long)st.st_rdev && tpgid == (long)fg && tcgetpgrp(0) == fg;
}

/* J's checks before the ^C: 0, else the failing check's code. */
static int job_checks(void)
{
	child_wait_file("go", 81);
	if (!tty_is_ours(getpgrp()))
		return 82;
	/* Only the foreground group may read the terminal. */
	char buf[32] = { 0 };
	if (read(0, buf, sizeof(buf) - 1) != 6 || memcmp(buf, "typed\n", 6) != 0)
		return 84;
	memset(buf, 0, sizeof(buf));
	if (read(0, buf, sizeof(buf) - 1) != 8 || memcmp(buf, "halfway\n", 8) != 0)
		return 85;
	return 0;
}

/* Reports its checks in WORKDIR/job-armed ("armed" or "failed N"), then
 * waits for the SIGINT the root's ^C sends. */
static int job_main(void)
{
	struct sigaction sa = { .sa_handler = on_sigint };
	char msg[32];

	if (sigaction(SIGINT, &sa, NULL) != 0)
		return 80;
	int code = job_checks();
	snprintf(msg, sizeof(msg), code ? "failed %d" : "armed", code);
	victim_write_file("job-armed", msg);
	if (code)
		return code;
	for (int i = 0; i < 500 && !interrupted; i++)
		victim_tick();
	return interrupted ? 0 : 83;
}

static int leader_main(const char *slave_path)
{
	if (setsid() < 0)
		return 90;
	/* Without O_NOCTTY: the slave becomes the session's terminal. */
	int fd = open(slave_path, O_RDWR);
	if (fd < 0 || dup2(fd, 0) != 0 || dup2(fd, 1) != 1 || dup2(fd, 2) != 2)
		return 91;
	close(fd);
	struct termios t;
	if (tcgetattr(0, &t) != 0)
		return 92;
	t.c_lflag &= ~(tcflag_t)ECHO;
	if (tcsetattr(0, TCSANOW, &t) != 0)
		return 93;
	if (fchown(0, NODE_UID, NODE_GID) != 0 || fchmod(0, NODE_MODE) != 0)
		return 94;

	pid_t job = fork();
	if (job < 0)
		return 95;
	if (job == 0) {
		setpgid(0, 0);
		_exit(job_main());
	}
	setpgid(job, job);
	if (tcsetpgrp(0, job) != 0)
		return 96;
	if (write(1, "out\n", 4) != 4)
		return 97;
	victim_write_file("leader-set", "set");

	child_wait_file("go", 98);
	struct stat st;
	if (!tty_is_ours(job))
		return 99;
	if (fstat(0, &st) != 0 || st.st_uid != NODE_UID || st.st_gid != NODE_GID ||
	    (st.st_mode & 0777) != NODE_MODE)
		return 100;
	victim_write_file("leader-checked", "checked");
	int status;
	if (waitpid(job, &status, 0) != job)
		return 103;
	if (!WIFEXITED(status))
		return 104;
	/* The job's own code: 0 once SIGINT reached it. */
	return WEXITSTATUS(status) == 0 ? 0 : 110 + WEXITSTATUS(status) % 100;
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	int master = posix_openpt(O_RDWR | O_NOCTTY);
	if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0)
		die("posix_openpt");
	char slave_path[64];
	if (ptsname_r(master, slave_path, sizeof(slave_path)) != 0)
		die("ptsname");

	pid_t leader = fork();
	if (leader < 0)
		die("fork");
	if (leader == 0) {
		close(master);
		_exit(leader_main(slave_path));
	}
	victim_wait_for("leader-set");
	if (write(master, "typed\nhalf", 10) != 10)
		die("type");
	victim_ready_and_wait(NULL);

	char buf[8] = { 0 };
	CHECK(victim_read_exact(master, buf, 5) == 0 && memcmp(buf, "out\r\n", 5) == 0,
	      "output in flight not read back through the master: '%.5s'", buf);
	CHECK(write(master, "way\n", 4) == 4, "type way: %s", strerror(errno));
	victim_wait_for("job-armed");
	char armed[32] = { 0 }, path[PATH_MAX];
	victim_path(path, sizeof(path), "job-armed");
	read_small_file(path, armed, sizeof(armed));
	CHECK(strcmp(armed, "armed") == 0, "the job's own checks: %s", armed);
	victim_wait_for("leader-checked");
	CHECK(write(master, "\x03", 1) == 1, "type ^C: %s", strerror(errno));
	victim_check_child(leader, "session leader (its code: 9x/10x its own check, 11x the job's)");
	victim_finish();
}
