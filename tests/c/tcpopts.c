/*
 * Socket options a program sets and reads back (tests/inet.rs).
 *
 *   tcpopts WORKDIR        an established connection over 127.0.0.1 and a
 *                          listener on ::1, each with options set to values
 *                          other than the defaults: SO_BINDTODEVICE,
 *                          SO_BUF_LOCK, SO_LINGER, SO_KEEPALIVE,
 *                          TCP_KEEPIDLE/KEEPINTVL/KEEPCNT, TCP_NODELAY,
 *                          TCP_CORK, IP_FREEBIND, IP_TOS or IPV6_TCLASS,
 *                          IPV6_V6ONLY, TCP_USER_TIMEOUT, TCP_CONGESTION
 *                          and a classic BPF filter (SO_ATTACH_FILTER).
 *                          After go each reads back as set (the filter
 *                          with SO_GET_FILTER), and the connection and the
 *                          listener still work.
 *   tcpopts WORKDIR reuseport
 *                          two listeners on one port of 127.0.0.1 with
 *                          SO_REUSEPORT; after go both are on it still, and
 *                          REUSEPORT_CLIENTS connections are all accepted,
 *                          by one or the other.
 */
#include "victim.h"

#include <arpa/inet.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#ifndef SO_BUF_LOCK
#define SO_BUF_LOCK 72
#endif

/* A filter that takes every packet whole; two instructions, so its
 * length shows too. */
static struct sock_filter prog[2] = {
	BPF_STMT(BPF_LD | BPF_W | BPF_LEN, 0),
	BPF_STMT(BPF_RET | BPF_K, 0xffffffff),
};

struct intopt {
	const char *name;
	int level, opt, val;
};

/* Values other than the kernel's defaults. */
static const struct intopt common[] = {
	{ "SO_KEEPALIVE", SOL_SOCKET, SO_KEEPALIVE, 1 },
	{ "SO_BUF_LOCK", SOL_SOCKET, SO_BUF_LOCK, 1 },
	{ "TCP_KEEPIDLE", IPPROTO_TCP, TCP_KEEPIDLE, 33 },
	{ "TCP_KEEPINTVL", IPPROTO_TCP, TCP_KEEPINTVL, 11 },
	{ "TCP_KEEPCNT", IPPROTO_TCP, TCP_KEEPCNT, 4 },
	{ "TCP_NODELAY", IPPROTO_TCP, TCP_NODELAY, 1 },
	{ "TCP_CORK", IPPROTO_TCP, TCP_CORK, 1 },
	{ "IP_FREEBIND", IPPROTO_IP, IP_FREEBIND, 1 },
	{ "TCP_USER_TIMEOUT", IPPROTO_TCP, TCP_USER_TIMEOUT, 12345 },
};
static const struct intopt v4[] = { { "IP_TOS", IPPROTO_IP, IP_TOS, 0x10 } };
static const struct intopt v6[] = {
	{ "IPV6_V6ONLY", IPPROTO_IPV6, IPV6_V6ONLY, 1 },
	{ "IPV6_TCLASS", IPPROTO_IPV6, IPV6_TCLASS, 0x20 },
};
#define N(a) (sizeof(a) / sizeof((a)[0]))

static void set_ints(int fd, const struct intopt *o, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (setsockopt(fd, o[i].level, o[i].opt, &o[i].val, sizeof(int)) != 0)
			die(o[i].name);
}

static void check_ints(int fd, const char *who, const struct intopt *o, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		int v = -1;
		socklen_t len = sizeof(v);

		CHECK(getsockopt(fd, o[i].level, o[i].opt, &v, &len) == 0 && v == o[i].val,
		      "%s: %s is %d, not %d", who, o[i].name, v, o[i].val);
	}
}

/* The options both sockets get besides the table's. */
static void set_rest(int fd)
{
	struct linger l = { .l_onoff = 1, .l_linger = 7 };
	struct sock_fprog fp = { .len = N(prog), .filter = prog };

	if (setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, "lo", 3) != 0)
		die("SO_BINDTODEVICE");
	if (setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l)) != 0)
		die("SO_LINGER");
	if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, "reno", 4) != 0)
		die("TCP_CONGESTION");
	if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &fp, sizeof(fp)) != 0)
		die("SO_ATTACH_FILTER");
	set_ints(fd, common, N(common));
}

static void check_rest(int fd, const char *who)
{
	char name[16] = { 0 };
	socklen_t len = sizeof(name);
	struct linger l = { 0 };
	struct sock_filter got[4];

	CHECK(getsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, name, &len) == 0 &&
		      strcmp(name, "lo") == 0,
	      "%s: SO_BINDTODEVICE is \"%s\"", who, name);
	len = sizeof(l);
	CHECK(getsockopt(fd, SOL_SOCKET, SO_LINGER, &l, &len) == 0 && l.l_onoff == 1 &&
		      l.l_linger == 7,
	      "%s: SO_LINGER is %d %d", who, l.l_onoff, l.l_linger);
	memset(name, 0, sizeof(name));
	len = sizeof(name);
	CHECK(getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name, &len) == 0 &&
		      strcmp(name, "reno") == 0,
	      "%s: TCP_CONGESTION is \"%s\"", who, name);
	len = N(got); /* SO_GET_FILTER counts instructions */
	CHECK(getsockopt(fd, SOL_SOCKET, SO_GET_FILTER, got, &len) == 0 && len == N(prog) &&
		      memcmp(got, prog, sizeof(prog)) == 0,
	      "%s: the socket filter has %u instructions or others", who, (unsigned)len);
	check_ints(fd, who, common, N(common));
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

#define REUSEPORT_CLIENTS 16

static void reuseport(void)
{
	struct sockaddr_storage ss;
	socklen_t len = loopback(AF_INET, &ss);
	int one = 1, l[2], port[2], accepted = 0;

	for (int i = 0; i < 2; i++) {
		l[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
		if (l[i] < 0 || setsockopt(l[i], SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0 ||
		    bind(l[i], (struct sockaddr *)&ss, len) != 0 || listen(l[i], REUSEPORT_CLIENTS) != 0 ||
		    getsockname(l[i], (struct sockaddr *)&ss, &len) != 0)
			die("listener");
		port[i] = ((struct sockaddr_in *)&ss)->sin_port;
	}

	victim_ready_and_wait(NULL);

	for (int i = 0; i < 2; i++) {
		int v = 0;
		socklen_t vlen = sizeof(v);

		len = sizeof(ss);
		CHECK(getsockname(l[i], (struct sockaddr *)&ss, &len) == 0 &&
			      ((struct sockaddr_in *)&ss)->sin_port == port[0] && port[i] == port[0],
		      "listener %d left the shared port", i);
		CHECK(getsockopt(l[i], SOL_SOCKET, SO_REUSEPORT, &v, &vlen) == 0 && v == 1,
		      "listener %d: SO_REUSEPORT is %d", i, v);
	}
	for (int n = 0; n < REUSEPORT_CLIENTS; n++) {
		int c = socket(AF_INET, SOCK_STREAM, 0);

		if (c < 0 || connect(c, (struct sockaddr *)&ss, len) != 0)
			die("connect");
	}
	usleep(100000);
	for (int i = 0; i < 2; i++)
		while (accept(l[i], NULL, NULL) >= 0)
			accepted++;
	CHECK(accepted == REUSEPORT_CLIENTS, "%d of %d connections accepted", accepted,
	      REUSEPORT_CLIENTS);
	victim_finish();
}

int main(int argc, char **argv)
{
	struct sockaddr_storage ss;
	socklen_t len;
	char b[2] = { 0 };

	victim_init(argc, argv);
	if (argc > 2 && strcmp(argv[2], "reuseport") == 0)
		reuseport();
	/* An established connection over IPv4, its client with the options. */
	int l4 = socket(AF_INET, SOCK_STREAM, 0);
	len = loopback(AF_INET, &ss);
	if (l4 < 0 || bind(l4, (struct sockaddr *)&ss, len) != 0 || listen(l4, 1) != 0 ||
	    getsockname(l4, (struct sockaddr *)&ss, &len) != 0)
		die("listener v4");
	int c = socket(AF_INET, SOCK_STREAM, 0);
	if (c < 0)
		die("socket");
	set_rest(c);
	set_ints(c, v4, N(v4));
	if (connect(c, (struct sockaddr *)&ss, len) != 0)
		die("connect");
	int s = accept(l4, NULL, NULL);
	if (s < 0)
		die("accept");
	/* A listener over IPv6 with the options. */
	int l6 = socket(AF_INET6, SOCK_STREAM, 0);
	if (l6 < 0)
		die("socket v6");
	set_rest(l6);
	set_ints(l6, v6, N(v6));
	len = loopback(AF_INET6, &ss);
	if (bind(l6, (struct sockaddr *)&ss, len) != 0 || listen(l6, 1) != 0)
		die("listener v6");

	victim_ready_and_wait(NULL);

	check_rest(c, "v4 client");
	check_ints(c, "v4 client", v4, N(v4));
	check_rest(l6, "v6 listener");
	check_ints(l6, "v6 listener", v6, N(v6));
	CHECK(send(c, "ok", 2, MSG_NOSIGNAL) == 2 && victim_read_exact(s, b, 2) == 0 &&
		      memcmp(b, "ok", 2) == 0,
	      "the connection no longer carries bytes");
	len = sizeof(ss);
	if (getsockname(l6, (struct sockaddr *)&ss, &len) != 0)
		die("getsockname");
	int c6 = socket(AF_INET6, SOCK_STREAM, 0);
	CHECK(c6 >= 0 && connect(c6, (struct sockaddr *)&ss, len) == 0 &&
		      accept(l6, NULL, NULL) >= 0,
	      "the v6 listener takes no connection: %s", strerror(errno));
	victim_finish();
}
