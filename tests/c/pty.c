/*
 * A pseudo-terminal pair inside the tree, as a launcher (mpirun, script)
 * makes one: the root holds the master, its child has the slave as its
 * stdout. The line is set to non-canonical mode without echo, a 101x33
 * window, VMIN 1. A second pair has only its master open, in packet mode
 * with the slave locked. After go, the child checks its line settings and
 * window size, then root and child exchange a ping and a pong through the
 * pair (the pong comes back with ONLCR's \r\n: output processing is on).
 */
#include "victim.h"

#include <sys/ioctl.h>
#include <sys/wait.h>
#include <termios.h>

static int child_main(void)
{
	struct termios t;
	struct winsize ws;
	char buf[8];

	while (!victim_file_exists("go")) {
		victim_tick();
		if (victim_timespec_passed(&victim_deadline))
			return 70;
	}
	if (!isatty(1) || tcgetattr(1, &t) != 0 || ioctl(1, TIOCGWINSZ, &ws) != 0)
		return 71;
	if ((t.c_lflag & (ECHO | ICANON)) != 0 || t.c_cc[VMIN] != 1 || t.c_cc[VTIME] != 0)
		return 72;
	if (!(t.c_oflag & OPOST) || !(t.c_oflag & ONLCR))
		return 73;
	if (ws.ws_row != 33 || ws.ws_col != 101)
		return 74;
	if (victim_read_exact(1, buf, 5) != 0 || memcmp(buf, "ping\n", 5) != 0)
		return 75;
	if (write(1, "pong\n", 5) != 5)
		return 76;
	return 0;
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	int master = posix_openpt(O_RDWR | O_NOCTTY);
	if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0)
		die("posix_openpt");
	int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
	if (slave < 0)
		die("open slave");
	struct termios t;
	if (tcgetattr(slave, &t) != 0)
		die("tcgetattr");
	t.c_lflag &= ~(ECHO | ICANON);
	t.c_cc[VMIN] = 1;
	t.c_cc[VTIME] = 0;
	if (tcsetattr(slave, TCSANOW, &t) != 0)
		die("tcsetattr");
	struct winsize ws = { .ws_row = 33, .ws_col = 101 };
	if (ioctl(master, TIOCSWINSZ, &ws) != 0)
		die("TIOCSWINSZ");

	int other = posix_openpt(O_RDWR | O_NOCTTY);
	int on = 1;
	if (other < 0 || ioctl(other, TIOCPKT, &on) != 0)
		die("second pair");

	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		close(master);
		close(other);
		if (dup2(slave, 1) != 1)
			_exit(77);
		close(slave);
		_exit(child_main());
	}
	close(slave);
	victim_ready_and_wait(NULL);

	int pkt = 0, lck = 0;
	CHECK(ioctl(other, TIOCGPKT, &pkt) == 0 && pkt == 1, "packet mode lost (%d)", pkt);
	CHECK(ioctl(other, TIOCGPTLCK, &lck) == 0 && lck == 1, "slave of the second pair unlocked (%d)", lck);
	CHECK(write(master, "ping\n", 5) == 5, "write ping: %s", strerror(errno));
	char buf[8] = { 0 };
	CHECK(victim_read_exact(master, buf, 6) == 0 && memcmp(buf, "pong\r\n", 6) == 0,
	      "pong not read back through the master: '%.6s'", buf);
	int st;
	CHECK(waitpid(child, &st, 0) == child, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed: status %#x", st);
	victim_finish();
}
