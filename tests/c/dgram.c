/*
 * Datagram sockets past plain UDP: shutdown, cork, UDP-Lite, ICMP ping
 * (tests/inet.rs).
 *
 *   dgram WORKDIR udpshut  UDP sockets shut down (v4 connected: one SHUT_RD,
 *                          its peer SHUT_WR; v6 connected: both ways; v4
 *                          bound, not connected: SHUT_RD), one corked with
 *                          nothing pending, and connected UDP-Lite pairs
 *                          (v4, v6) with their checksum coverage; after go
 *                          each is shut down as it was (poll's RDHUP/HUP, a
 *                          send's EPIPE), the cork and the coverage are
 *                          set, and datagrams flow where they may.
 *   dgram WORKDIR udpcork [more]
 *                          a connected v4 pair whose one end holds back the
 *                          start of a datagram (UDP_CORK; with "more" a
 *                          send with MSG_MORE instead): a dump is refused;
 *                          after go the end sends it whole, the other gets
 *                          it in one datagram.
 *   dgram WORKDIR ping     ICMP ping sockets (needs net.ipv4.ping_group_range
 *                          to hold the victim's group): v4 bound to
 *                          127.0.0.1 and connected to it, with IP_TOS; v6
 *                          connected to ::1; each sent one echo before;
 *                          after go each has its echo identifier, its
 *                          options, and an echo sent with send() (to the
 *                          connected address) is answered.
 */
#include "victim.h"

#include <arpa/inet.h>
#include <netinet/icmp6.h>
#include <netinet/in.h>
#include <netinet/ip_icmp.h>
#include <netinet/udp.h>
#include <poll.h>
#include <sys/socket.h>

#ifndef SOL_UDPLITE
#define SOL_UDPLITE 136
#endif
#ifndef UDPLITE_SEND_CSCOV
#define UDPLITE_SEND_CSCOV 10
#define UDPLITE_RECV_CSCOV 11
#endif
#ifndef UDP_CORK
#define UDP_CORK 1
#endif

static void set_int(int fd, int level, int opt, int val, const char *what)
{
	if (setsockopt(fd, level, opt, &val, sizeof(val)) != 0)
		die(what);
}

static int get_int(int fd, int level, int opt)
{
	int v = -1;
	socklen_t len = sizeof(v);

	if (getsockopt(fd, level, opt, &v, &len) != 0)
		return -1;
	return v;
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

static int bound(int family, int proto)
{
	struct sockaddr_storage ss;
	int fd = socket(family, SOCK_DGRAM, proto);

	if (fd < 0)
		die("socket");
	socklen_t len = loopback(family, &ss);
	if (bind(fd, (struct sockaddr *)&ss, len) != 0)
		die("bind");
	return fd;
}

/* Two sockets bound on loopback and connected to each other. */
static void pair(int family, int proto, int *a, int *b)
{
	struct sockaddr_storage la, lb;
	socklen_t len = sizeof(la);

	*a = bound(family, proto);
	*b = bound(family, proto);
	if (getsockname(*a, (struct sockaddr *)&la, &len) != 0)
		die("getsockname");
	len = sizeof(lb);
	if (getsockname(*b, (struct sockaddr *)&lb, &len) != 0)
		die("getsockname");
	if (connect(*a, (struct sockaddr *)&lb, len) != 0 ||
	    connect(*b, (struct sockaddr *)&la, len) != 0)
		die("connect");
}

static short revents(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLIN | POLLRDHUP };

	if (poll(&p, 1, 0) < 0)
		die("poll");
	return p.revents;
}

/* One datagram from `from` reaches `to`. */
static void flows(int from, int to, const char *what)
{
	uint32_t out = 0x5eed, in = 0;

	if (send(from, &out, sizeof(out), MSG_NOSIGNAL) != sizeof(out)) {
		fail("%s: send: %s", what, strerror(errno));
		return;
	}
	CHECK(recv(to, &in, sizeof(in), 0) == sizeof(in) && in == out, "%s: datagram lost", what);
}

static int send_refused(int fd)
{
	uint32_t x = 1;

	return send(fd, &x, sizeof(x), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno == EPIPE;
}

static void udpshut(void)
{
	int a, b, c, d, e, f, g, h, i, j;

	pair(AF_INET, 0, &a, &b);
	pair(AF_INET6, 0, &c, &d);
	e = bound(AF_INET, 0);
	f = bound(AF_INET, 0);
	if (shutdown(a, SHUT_RD) != 0 || shutdown(b, SHUT_WR) != 0 || shutdown(c, SHUT_RDWR) != 0)
		die("shutdown");
	/* Recorded though not connected (the kernel says ENOTCONN). */
	shutdown(e, SHUT_RD);
	set_int(f, SOL_UDP, UDP_CORK, 1, "UDP_CORK");
	pair(AF_INET, IPPROTO_UDPLITE, &g, &h);
	pair(AF_INET6, IPPROTO_UDPLITE, &i, &j);
	set_int(g, SOL_UDPLITE, UDPLITE_SEND_CSCOV, 20, "UDPLITE_SEND_CSCOV");
	set_int(g, SOL_UDPLITE, UDPLITE_RECV_CSCOV, 16, "UDPLITE_RECV_CSCOV");
	set_int(i, SOL_UDPLITE, UDPLITE_SEND_CSCOV, 12, "UDPLITE_SEND_CSCOV");

	victim_ready_and_wait(NULL);

	CHECK(revents(a) & POLLRDHUP, "v4 SHUT_RD end: reading not shut down");
	CHECK(!(revents(b) & POLLRDHUP), "v4 SHUT_WR end: reading shut down");
	CHECK(send_refused(b), "v4 SHUT_WR end: writing not shut down");
	flows(a, b, "v4 SHUT_RD end to its peer");
	CHECK(revents(c) & POLLHUP, "v6 SHUT_RDWR end: not shut down both ways");
	CHECK(send_refused(c), "v6 SHUT_RDWR end: writing not shut down");
	CHECK(!(revents(d) & POLLRDHUP), "v6 peer: shut down");
	CHECK(revents(e) & POLLRDHUP, "unconnected SHUT_RD: reading not shut down");
	CHECK(get_int(f, SOL_UDP, UDP_CORK) == 1, "corked socket lost UDP_CORK");
	CHECK(get_int(a, SOL_UDP, UDP_CORK) == 0, "UDP socket gained UDP_CORK");
	CHECK(get_int(g, SOL_SOCKET, SO_PROTOCOL) == IPPROTO_UDPLITE, "v4 UDP-Lite: protocol %d",
	      get_int(g, SOL_SOCKET, SO_PROTOCOL));
	CHECK(get_int(i, SOL_SOCKET, SO_PROTOCOL) == IPPROTO_UDPLITE, "v6 UDP-Lite: protocol %d",
	      get_int(i, SOL_SOCKET, SO_PROTOCOL));
	CHECK(get_int(g, SOL_UDPLITE, UDPLITE_SEND_CSCOV) == 20, "v4 UDP-Lite: send coverage %d",
	      get_int(g, SOL_UDPLITE, UDPLITE_SEND_CSCOV));
	CHECK(get_int(g, SOL_UDPLITE, UDPLITE_RECV_CSCOV) == 16, "v4 UDP-Lite: receive coverage %d",
	      get_int(g, SOL_UDPLITE, UDPLITE_RECV_CSCOV));
	CHECK(get_int(i, SOL_UDPLITE, UDPLITE_SEND_CSCOV) == 12, "v6 UDP-Lite: send coverage %d",
	      get_int(i, SOL_UDPLITE, UDPLITE_SEND_CSCOV));
	CHECK(get_int(j, SOL_UDPLITE, UDPLITE_SEND_CSCOV) == 0, "v6 UDP-Lite peer: coverage %d",
	      get_int(j, SOL_UDPLITE, UDPLITE_SEND_CSCOV));
	flows(g, h, "v4 UDP-Lite");
	flows(h, g, "v4 UDP-Lite back");
	flows(i, j, "v6 UDP-Lite");
	flows(j, i, "v6 UDP-Lite back");
	victim_finish();
}

static void udpcork(int more)
{
	const char part[] = "held back";
	char got[64];
	int a, b;

	pair(AF_INET, 0, &a, &b);
	if (!more)
		set_int(a, SOL_UDP, UDP_CORK, 1, "UDP_CORK");
	if (send(a, part, sizeof(part), more ? MSG_MORE : 0) != sizeof(part))
		die("send pending");

	victim_ready_and_wait(NULL);

	if (more) {
		if (send(a, "", 0, 0) != 0)
			die("send the rest");
	} else {
		set_int(a, SOL_UDP, UDP_CORK, 0, "UDP_CORK off");
	}
	ssize_t r = recv(b, got, sizeof(got), 0);
	CHECK(r == sizeof(part) && memcmp(got, part, sizeof(part)) == 0,
	      "the held-back datagram came as %zd bytes", r);
	victim_finish();
}

/* Sends an echo request with `seq` on connected ping socket `fd` and reads
 * its reply, whose identifier must be `ident`. */
static void echo(int fd, int v6, uint16_t ident, uint16_t seq, const char *what)
{
	unsigned char req[16] = { 0 }, rep[64];

	req[0] = v6 ? ICMP6_ECHO_REQUEST : ICMP_ECHO;
	memcpy(req + 6, &(uint16_t){ htons(seq) }, 2);
	if (send(fd, req, sizeof(req), 0) != sizeof(req)) {
		fail("%s: echo %u: send: %s", what, seq, strerror(errno));
		return;
	}
	struct pollfd p = { .fd = fd, .events = POLLIN };
	if (poll(&p, 1, 5000) != 1) {
		fail("%s: echo %u: no reply", what, seq);
		return;
	}
	ssize_t r = recv(fd, rep, sizeof(rep), 0);
	uint16_t id, sq;
	memcpy(&id, rep + 4, 2);
	memcpy(&sq, rep + 6, 2);
	CHECK(r >= 8 && rep[0] == (v6 ? ICMP6_ECHO_REPLY : ICMP_ECHOREPLY) && ntohs(sq) == seq,
	      "%s: echo %u: bad reply", what, seq);
	CHECK(ntohs(id) == ident, "%s: reply to identifier %u, was %u", what, ntohs(id), ident);
}

static uint16_t ident_of(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);

	if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
		die("getsockname");
	return ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
					      : ((struct sockaddr_in *)&ss)->sin_port);
}

static void ping(void)
{
	struct sockaddr_storage lo4, lo6;
	socklen_t len4 = loopback(AF_INET, &lo4), len6 = loopback(AF_INET6, &lo6);
	int p4 = socket(AF_INET, SOCK_DGRAM, IPPROTO_ICMP);
	int p6 = socket(AF_INET6, SOCK_DGRAM, IPPROTO_ICMPV6);

	if (p4 < 0 || p6 < 0)
		die("ping socket (net.ipv4.ping_group_range)");
	if (bind(p4, (struct sockaddr *)&lo4, len4) != 0)
		die("bind ping");
	if (connect(p4, (struct sockaddr *)&lo4, len4) != 0 ||
	    connect(p6, (struct sockaddr *)&lo6, len6) != 0)
		die("connect ping");
	set_int(p4, IPPROTO_IP, IP_TOS, 0x10, "IP_TOS");
	echo(p4, 0, ident_of(p4), 1, "v4 ping before");
	echo(p6, 1, ident_of(p6), 1, "v6 ping before");
	uint16_t id4 = ident_of(p4), id6 = ident_of(p6);
	CHECK(id4 != 0 && id6 != 0, "no echo identifiers");

	victim_ready_and_wait(NULL);

	CHECK(ident_of(p4) == id4, "v4 ping: identifier %u, was %u", ident_of(p4), id4);
	CHECK(ident_of(p6) == id6, "v6 ping: identifier %u, was %u", ident_of(p6), id6);
	CHECK(get_int(p4, SOL_SOCKET, SO_PROTOCOL) == IPPROTO_ICMP, "v4 ping: not ICMP");
	CHECK(get_int(p6, SOL_SOCKET, SO_PROTOCOL) == IPPROTO_ICMPV6, "v6 ping: not ICMPv6");
	CHECK(get_int(p4, IPPROTO_IP, IP_TOS) == 0x10, "v4 ping: lost IP_TOS");
	echo(p4, 0, id4, 2, "v4 ping after");
	echo(p6, 1, id6, 2, "v6 ping after");
	victim_finish();
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	const char *mode = argc > 2 ? argv[2] : "";

	if (strcmp(mode, "udpshut") == 0)
		udpshut();
	else if (strcmp(mode, "udpcork") == 0)
		udpcork(argc > 3 && strcmp(argv[3], "more") == 0);
	else if (strcmp(mode, "ping") == 0)
		ping();
	die("usage: dgram WORKDIR udpshut|udpcork [more]|ping");
}
