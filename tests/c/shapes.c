/*
 * Tree shapes whose session or group leader is gone. The root is a child
 * subreaper (PR_SET_CHILD_SUBREAPER), so orphans stay in the tree:
 *
 *   M1: its parent L1 called setsid, forked it and exited: session L1 and
 *       (orphaned) group L1 have no leader process;
 *   M2: its parent G2 made group G2 in the root's session, forked it and
 *       exited: group G2 has no leader;
 *   M3: its parent Z3 called setsid, forked it and exited 7, unreaped: a
 *       zombie leads its session and group;
 *   M5: its parent Z5 made group Z5, forked it and exited 9, unreaped: a
 *       zombie leads its group in the root's session;
 *   Z7: a child that joined group Z5 and exited 3, unreaped.
 *
 * Every member is the root's child now. Ready content: the pids
 * "M1 M2 M3 M5 Z3 Z5 Z7 L1 G2". After go each member checks its own session,
 * group and parent, the root checks them from outside, reaps the zombies
 * with their statuses, and finds no other child (no helper left over).
 */
#include "victim.h"

#include <sys/prctl.h>

enum { SID_WRONG = 31, PGID_WRONG = 32, PPID_WRONG = 33, TIMEOUT = 34 };

static pid_t root;

/* A member: remember its ids, wait for go, check them again. */
static void member(void)
{
	pid_t sid = getsid(0), pgid = getpgid(0);
	victim_child_wait_go(TIMEOUT);
	if (getsid(0) != sid)
		_exit(SID_WRONG);
	if (getpgid(0) != pgid)
		_exit(PGID_WRONG);
	if (getppid() != root)
		_exit(PPID_WRONG);
	_exit(0);
}

/*
 * A leader: `setsid` or `setpgid`, fork a member, report its pid through
 * `fd`, exit with `code`.
 */
static pid_t leader(int session, int code, pid_t *member_pid)
{
	int p[2];
	if (pipe(p))
		die("pipe");
	pid_t l = fork();
	if (l < 0)
		die("fork");
	if (l == 0) {
		close(p[0]);
		if (session ? setsid() < 0 : setpgid(0, 0) < 0)
			_exit(40);
		pid_t m = fork();
		if (m == 0) {
			close(p[1]);
			member();
		}
		if (write(p[1], &m, sizeof(m)) != sizeof(m))
			_exit(41);
		_exit(code);
	}
	close(p[1]);
	if (read(p[0], member_pid, sizeof(*member_pid)) != sizeof(*member_pid))
		die("read member pid");
	close(p[0]);
	return l;
}

static pid_t ppid_of(pid_t pid)
{
	char buf[1024];
	const char *f = proc_stat_fields(pid, buf, sizeof(buf));
	char st;
	int ppid;
	return f && sscanf(f, "%c %d", &st, &ppid) == 2 ? ppid : -1;
}

static int is_zombie(pid_t pid)
{
	return proc_state(pid) == 'Z';
}

static void check_member(const char *name, pid_t m, pid_t sid, pid_t pgid)
{
	int st;
	CHECK(getsid(m) == sid, "%s: session %d, want %d", name, getsid(m), sid);
	CHECK(getpgid(m) == pgid, "%s: group %d, want %d", name, getpgid(m), pgid);
	CHECK(ppid_of(m) == root, "%s: parent %d, want %d", name, ppid_of(m), root);
	CHECK(waitpid(m, &st, 0) == m, "%s: waitpid: %s", name, strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: own check failed: status %#x", name,
	      st);
}

/*
 * "live" mode: A calls setsid and forks B, B forks C and exits: C is the
 * root's child in session A, whose leader lives but is not its ancestor
 * (refused). Ready content: "A C". After go A and C exit 0.
 */
static void live_leader_mode(void)
{
	int p[2], status;
	pid_t c;
	if (pipe(p))
		die("pipe");
	pid_t a = fork();
	if (a < 0)
		die("fork");
	if (a == 0) {
		if (setsid() < 0)
			_exit(40);
		pid_t b = fork();
		if (b == 0) {
			pid_t cc = fork();
			if (cc == 0) {
				close(p[0]);
				close(p[1]);
				member();
			}
			if (write(p[1], &cc, sizeof(cc)) != sizeof(cc))
				_exit(41);
			_exit(0);
		}
		close(p[0]);
		close(p[1]);
		if (waitpid(b, &status, 0) != b)
			_exit(42);
		victim_child_wait_go(TIMEOUT);
		_exit(0);
	}
	close(p[1]);
	if (read(p[0], &c, sizeof(c)) != sizeof(c))
		die("read member pid");
	close(p[0]);
	while (ppid_of(c) != root)
		victim_tick();
	char ready[64];
	snprintf(ready, sizeof(ready), "%d %d", a, c);
	victim_ready_and_wait(ready);
	check_member("C (leader alive, not an ancestor)", c, a, a);
	CHECK(waitpid(a, &status, 0) == a && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "A: status %#x", status);
	victim_finish();
}

/*
 * "many" mode: MANY_LEADERS children each call setsid, fork a member and
 * exit 20 + i, unreaped: every member's session is led by a zombie. Each
 * zombie leader is a helper the restorer forks members through and then
 * turns into a zombie, so many of them make a race in that step likely to
 * show. Ready content: "M0 Z0 M1 Z1 ...". After go the root checks every
 * member's session and each zombie's status.
 */
enum { MANY_LEADERS = 16 };

static void many_leaders_mode(void)
{
	pid_t m[MANY_LEADERS], z[MANY_LEADERS];
	char ready[MANY_LEADERS * 24] = "";
	size_t used = 0;
	int status;

	for (int i = 0; i < MANY_LEADERS; i++)
		z[i] = leader(1, 20 + i, &m[i]);
	for (int i = 0; i < MANY_LEADERS; i++) {
		while (!is_zombie(z[i]) || ppid_of(m[i]) != root)
			victim_tick();
		used += snprintf(ready + used, sizeof(ready) - used, "%s%d %d", i ? " " : "", m[i],
				 z[i]);
	}
	victim_ready_and_wait(ready);
	for (int i = 0; i < MANY_LEADERS; i++) {
		check_member("member of a zombie-led session", m[i], z[i], z[i]);
		CHECK(waitpid(z[i], &status, 0) == z[i] && WIFEXITED(status) &&
			      WEXITSTATUS(status) == 20 + i,
		      "zombie leader %d: status %#x", z[i], status);
	}
	victim_finish();
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	root = getpid();
	if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0))
		die("PR_SET_CHILD_SUBREAPER");
	if (argc > 2 && strcmp(argv[2], "live") == 0)
		live_leader_mode();
	if (argc > 2 && strcmp(argv[2], "many") == 0)
		many_leaders_mode();
	pid_t m1, m2, m3, m5, st;
	pid_t l1 = leader(1, 0, &m1);
	pid_t g2 = leader(0, 0, &m2);
	pid_t z3 = leader(1, 7, &m3);
	pid_t z5 = leader(0, 9, &m5);
	/* Z7: a zombie that had joined Z5's group. */
	pid_t z7 = fork();
	if (z7 < 0)
		die("fork");
	if (z7 == 0)
		_exit(setpgid(0, z5) ? 50 : 3);
	int status;
	if (waitpid(l1, &status, 0) != l1 || waitpid(g2, &status, 0) != g2)
		die("reap leaders");
	while (!is_zombie(z3) || !is_zombie(z5) || !is_zombie(z7) || ppid_of(m1) != root || ppid_of(m2) != root ||
	       ppid_of(m3) != root || ppid_of(m5) != root)
		victim_tick();
	if (getpgid(z7) != z5)
		die("Z7 did not join Z5's group");
	char ready[128];
	snprintf(ready, sizeof(ready), "%d %d %d %d %d %d %d %d %d", m1, m2, m3, m5, z3, z5, z7, l1,
		 g2);
	victim_ready_and_wait(ready);

	CHECK(getsid(0) == root && getpgid(0) == root, "root: session %d group %d", getsid(0),
	      getpgid(0));
	CHECK(getsid(l1) < 0 && getpgid(g2) < 0, "an exited leader (%d or %d) exists", l1, g2);
	check_member("M1 (session leader exited)", m1, l1, l1);
	check_member("M2 (group leader exited)", m2, root, g2);
	check_member("M3 (zombie session leader)", m3, z3, z3);
	check_member("M5 (zombie group leader)", m5, root, z5);
	CHECK(getsid(z3) == z3, "zombie Z3: session %d", getsid(z3));
	CHECK(getpgid(z5) == z5, "zombie Z5: group %d", getpgid(z5));
	CHECK(waitpid(z3, &status, 0) == z3 && WIFEXITED(status) && WEXITSTATUS(status) == 7,
	      "Z3: status %#x", status);
	CHECK(getpgid(z7) == z5, "zombie Z7: group %d, want %d", getpgid(z7), z5);
	CHECK(waitpid(z7, &status, 0) == z7 && WIFEXITED(status) && WEXITSTATUS(status) == 3,
	      "Z7: status %#x", status);
	CHECK(waitpid(z5, &status, 0) == z5 && WIFEXITED(status) && WEXITSTATUS(status) == 9,
	      "Z5: status %#x", status);
	st = waitpid(-1, &status, WNOHANG | __WALL);
	CHECK(st < 0 && errno == ECHILD, "an extra child %d (status %#x) is left", st, status);
	if (argc > 2 && strcmp(argv[2], "subreaper") == 0) {
		int flag = 0;
		CHECK(prctl(PR_GET_CHILD_SUBREAPER, (unsigned long)&flag, 0, 0, 0) == 0 && flag == 1,
		      "the root is no longer a child subreaper");
	}
	victim_finish();
}
