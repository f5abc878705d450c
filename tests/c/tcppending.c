/*
 * Connections a listening socket has not accepted yet, their clients in
 * the tree (tests/inet.rs), over 127.0.0.1 and ::1.
 *
 *   tcppending WORKDIR pending
 *                          per family a listener and two clients it has
 *                          not accepted: one connected, one connected and
 *                          shut down writing. After go the listener
 *                          accepts exactly two connections, from the
 *                          clients' addresses; the first talks both ways,
 *                          the second reads the end of the stream at once
 *                          and still receives; the listener then accepts a
 *                          new connection.
 *   tcppending WORKDIR synsent
 *                          per family a listener with a backlog of 0, one
 *                          client it has not accepted, which fills it, and
 *                          a non-blocking connect whose SYN it drops
 *                          (SYN_SENT). After go the connect is still under
 *                          way; once the listener accepts the first client
 *                          it completes (POLLOUT, SO_ERROR 0) and the
 *                          listener accepts it from its address.
 */
#include "victim.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

static int tcp_state(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
		die("TCP_INFO");
	return ti.tcpi_state;
}

static socklen_t loopback(int family, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof(*ss));
	if (family == AF_INET6) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;

		a->sin6_family = AF_INET6;
		a->sin6_addr = in6addr_loopback;
		return sizeof(*a);
	}
	struct sockaddr_in *a = (struct sockaddr_in *)ss;

	a->sin_family = AF_INET;
	a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return sizeof(*a);
}

static int client_of(int l)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	int fd;

	if (getsockname(l, (struct sockaddr *)&ss, &len) != 0)
		die("getsockname");
	fd = socket(ss.ss_family, SOCK_STREAM, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&ss, len) != 0)
		die("connect");
	return fd;
}

/* Whether the peer of `server` is the local address of `client`. */
static int from(int server, int client)
{
	struct sockaddr_storage p, c;
	socklen_t plen = sizeof(p), clen = sizeof(c);

	if (getpeername(server, (struct sockaddr *)&p, &plen) != 0 ||
	    getsockname(client, (struct sockaddr *)&c, &clen) != 0)
		return 0;
	return plen == clen && memcmp(&p, &c, plen) == 0;
}

static int listener(int family, int backlog)
{
	struct sockaddr_storage ss;
	socklen_t len = loopback(family, &ss);
	int one = 1, fd = socket(family, SOCK_STREAM, 0);

	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
	    bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, backlog) != 0)
		die("listener");
	return fd;
}

/* How long a connect under way may take once the listener has room: the
 * SYN is sent again after 1, 3, 7 s. */
#define CONNECT_MS 10000

static void synsent(void)
{
	const int families[2] = { AF_INET, AF_INET6 };
	const char *names[2] = { "v4", "v6" };
	int l[2], first[2], waiting[2];

	for (int f = 0; f < 2; f++) {
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);

		l[f] = listener(families[f], 0);
		first[f] = client_of(l[f]);
		if (getsockname(l[f], (struct sockaddr *)&ss, &len) != 0)
			die("getsockname");
		waiting[f] = socket(families[f], SOCK_STREAM | SOCK_NONBLOCK, 0);
		if (waiting[f] < 0)
			die("socket");
		if (connect(waiting[f], (struct sockaddr *)&ss, len) == 0 || errno != EINPROGRESS)
			die("connect under way");
	}
	usleep(200000);
	for (int f = 0; f < 2; f++)
		if (tcp_state(waiting[f]) != TCP_SYN_SENT) {
			errno = EAGAIN;
			die("the connect is not in SYN_SENT");
		}

	victim_ready_and_wait(NULL);

	for (int f = 0; f < 2; f++) {
		struct pollfd p = { .fd = waiting[f], .events = POLLOUT };
		int err = -1;
		socklen_t elen = sizeof(err);

		CHECK(tcp_state(waiting[f]) == TCP_SYN_SENT, "%s: the connect is in state %d",
		      names[f], tcp_state(waiting[f]));
		int a = accept(l[f], NULL, NULL);

		CHECK(a >= 0 && from(a, first[f]), "%s: the first client is not accepted", names[f]);
		CHECK(poll(&p, 1, CONNECT_MS) == 1 && (p.revents & POLLOUT),
		      "%s: the connect never completed", names[f]);
		CHECK(getsockopt(waiting[f], SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == 0,
		      "%s: the connect failed: %s", names[f], strerror(err));
		int b = accept(l[f], NULL, NULL);

		CHECK(b >= 0 && from(b, waiting[f]), "%s: the completed connect is not accepted",
		      names[f]);
		CHECK(send(waiting[f], "w", 1, MSG_NOSIGNAL) == 1, "%s: no send after the connect",
		      names[f]);
	}
	victim_finish();
}

static void pending(void)
{
	const int families[2] = { AF_INET, AF_INET6 };
	const char *names[2] = { "v4", "v6" };
	int l[2], talker[2], closer[2];

	for (int f = 0; f < 2; f++) {
		l[f] = listener(families[f], 8);
		talker[f] = client_of(l[f]);
		closer[f] = client_of(l[f]);
		if (shutdown(closer[f], SHUT_WR) != 0)
			die("shutdown");
	}
	usleep(100000);

	victim_ready_and_wait(NULL);

	for (int f = 0; f < 2; f++) {
		int a = accept(l[f], NULL, NULL), b = accept(l[f], NULL, NULL);
		char buf[2] = { 0 };

		if (a < 0 || b < 0) {
			fail("%s: accept the two pending connections: %s", names[f], strerror(errno));
			continue;
		}
		if (!from(a, talker[f])) {
			int t = a;

			a = b;
			b = t;
		}
		CHECK(from(a, talker[f]) && from(b, closer[f]),
		      "%s: the accepted connections are not the clients'", names[f]);
		if (fcntl(l[f], F_SETFL, O_NONBLOCK) != 0)
			die("O_NONBLOCK");
		CHECK(accept(l[f], NULL, NULL) < 0 && errno == EAGAIN,
		      "%s: more than the two connections pending", names[f]);
		CHECK(send(a, "hi", 2, MSG_NOSIGNAL) == 2 && victim_read_exact(talker[f], buf, 2) == 0 &&
			      memcmp(buf, "hi", 2) == 0,
		      "%s: the client does not receive", names[f]);
		CHECK(send(talker[f], "yo", 2, MSG_NOSIGNAL) == 2 && victim_read_exact(a, buf, 2) == 0 &&
			      memcmp(buf, "yo", 2) == 0,
		      "%s: the server does not receive", names[f]);
		CHECK(recv(b, buf, 1, MSG_DONTWAIT) == 0,
		      "%s: no end of stream from the client that shut down", names[f]);
		CHECK(send(b, "s", 1, MSG_NOSIGNAL) == 1 && victim_read_exact(closer[f], buf, 1) == 0 &&
			      buf[0] == 's',
		      "%s: the client that shut down does not receive", names[f]);
		int c = client_of(l[f]);

		usleep(10000);
		CHECK(accept(l[f], NULL, NULL) >= 0, "%s: the listener takes no new connection: %s",
		      names[f], strerror(errno));
		close(c);
	}
	victim_finish();
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	const char *mode = argc > 2 ? argv[2] : "";

	if (strcmp(mode, "pending") == 0)
		pending();
	else if (strcmp(mode, "synsent") == 0)
		synsent();
	errno = EINVAL;
	die("usage: tcppending WORKDIR pending|synsent");
}
