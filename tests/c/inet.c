/*
 * TCP and UDP sockets over IPv4 and IPv6 (tests/inet.rs).
 *
 *   inet WORKDIR tcp       a server and its forked client, connected over
 *                          127.0.0.1 and ::1, each with bytes queued in
 *                          both directions (the receiver's small buffer
 *                          full, the rest in the sender's send queue);
 *                          after go both streams run to TOTAL bytes and
 *                          every byte is checked against its offset (no
 *                          loss, no duplicate, no reordering); the kept
 *                          listening sockets accept new connections.
 *   inet WORKDIR udp       bound and connected UDP pairs (v4, v6) with
 *                          their options; datagrams flow again after go.
 *   inet WORKDIR refused   a connection not accepted yet holding bytes its
 *                          client sent: refused by name, and it goes on.
 *   inet WORKDIR halfclosed
 *                          half-closed connections over 127.0.0.1 and ::1:
 *                          one end shut down writing (FIN_WAIT2), the other
 *                          has the FIN (CLOSE_WAIT), each with HALF_DATA
 *                          unread bytes; after go both states are as they
 *                          were, each reads its bytes, the CLOSE_WAIT end
 *                          then the end of the stream, and it still
 *                          writes.
 *   inet WORKDIR privport  (root) a UDP socket on a port below 1024, kept
 *                          after dropping CAP_NET_BIND_SERVICE.
 *   inet WORKDIR outside PORT
 *                          one connection to 127.0.0.1:PORT, held by the
 *                          test itself, with the same stream both ways.
 *   inet WORKDIR chatter PORT
 *                          one connection to 127.0.0.1:PORT, whose peer (the
 *                          test) echoes: until go it sends a counter and
 *                          reads it back, over and over, with no pause, so
 *                          it is always in a send or receive on it; any
 *                          failure (EINVAL or EPERM of a connection left in
 *                          repair mode) fails it at once.
 *   inet WORKDIR server    a server on 127.0.0.1 (its port in the file
 *                          "port") whose one client is the test, outside
 *                          the tree: reads SERVER_BEFORE bytes, then after
 *                          go the SERVER_GAP bytes the test sent while the
 *                          tree was down, each checked against its offset,
 *                          and sends those back.
 *   inet WORKDIR finwait1  connections over 127.0.0.1 and ::1 whose writer
 *                          filled the reader's window and its own buffer,
 *                          then shut down writing: its FIN waits behind
 *                          unsent bytes (FIN_WAIT1); after go the reader
 *                          reads every byte, each checked, then the end of
 *                          the stream, the writer reaches FIN_WAIT2 and
 *                          still reads.
 *   inet WORKDIR closedby [v6]
 *                          like server (on ::1 with v6), but the test
 *                          shuts down writing
 *                          after its SERVER_BEFORE bytes, which the victim
 *                          leaves unread (CLOSE_WAIT); after go it is in
 *                          CLOSE_WAIT again, reads them, then the end of
 *                          the stream, and sends "bye".
 *   inet WORKDIR shutout PORT
 *                          one connection to 127.0.0.1:PORT (the test,
 *                          outside the tree) over which it sent HALF_DATA
 *                          bytes and shut down writing (FIN_WAIT2); after
 *                          go it is in FIN_WAIT2 again and reads the
 *                          HALF_DATA bytes the test sends, then the end of
 *                          the stream.
 */
#include "victim.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <linux/capability.h>

/* Bytes each side sends on each connection in all. */
#define TOTAL (1u << 20)
/* The receive buffer is kept small so the sender's queue fills too. */
#define SMALL_RCVBUF 4096
#define SMALL_SNDBUF 32768
/* At least this much must be queued before the dump. */
#define MIN_QUEUED 16384
#define PUMP_SECONDS 60
#define DATAGRAMS 100

/* Byte number n of the stream in direction dir: a hash of the offset, so a
 * lost, repeated or reordered byte shows. */
static inline uint8_t stream_byte(int dir, uint64_t n)
{
	uint64_t x = n * 0x9E3779B97F4A7C15ull + (uint64_t)dir * 0xD1B54A32D192ED03ull;

	x ^= x >> 29;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 32;
	return (uint8_t)(x >> 56);
}

struct conn {
	const char *name;
	int fd;
	int out_dir, in_dir;
	uint64_t sent, rcvd;
	int eof, shut, broken;
};

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

static void nonblock(int fd)
{
	if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0)
		die("O_NONBLOCK");
}

static int send_some(struct conn *c)
{
	static uint8_t buf[65536];
	uint64_t left = TOTAL - c->sent;
	size_t n = left < sizeof(buf) ? (size_t)left : sizeof(buf);

	for (size_t i = 0; i < n; i++)
		buf[i] = stream_byte(c->out_dir, c->sent + i);
	ssize_t w = send(c->fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
	if (w < 0)
		return errno == EAGAIN ? 0 : -1;
	c->sent += (uint64_t)w;
	if (c->sent == TOTAL && !c->shut) {
		if (shutdown(c->fd, SHUT_WR) != 0)
			return -1;
		c->shut = 1;
	}
	return (int)(w > 0);
}

/* Fills the peer's receive buffer and our send queue. */
static void fill(struct conn *c)
{
	int r;

	while ((r = send_some(c)) > 0)
		;
	if (r < 0)
		die("fill");
	if (c->sent < MIN_QUEUED) {
		errno = 0;
		die("fill: too little queued");
	}
}

static int recv_some(struct conn *c)
{
	static uint8_t buf[65536];
	ssize_t r = recv(c->fd, buf, sizeof(buf), MSG_DONTWAIT);

	if (r < 0)
		return errno == EAGAIN ? 0 : -1;
	if (r == 0) {
		c->eof = 1;
		if (c->rcvd != TOTAL)
			fail("%s: end of stream after %llu of %u bytes", c->name,
			     (unsigned long long)c->rcvd, TOTAL);
		return 0;
	}
	for (ssize_t i = 0; i < r; i++) {
		uint8_t want = stream_byte(c->in_dir, c->rcvd + (uint64_t)i);
		if (buf[i] != want) {
			fail("%s: byte %llu is %#x, expected %#x (lost or repeated data)",
			     c->name, (unsigned long long)(c->rcvd + (uint64_t)i), buf[i], want);
			return -1;
		}
	}
	c->rcvd += (uint64_t)r;
	return 1;
}

/* Runs every connection's two streams to their end. */
static void pump(struct conn *cs, int n)
{
	struct timespec deadline;

	clock_gettime(CLOCK_MONOTONIC, &deadline);
	deadline.tv_sec += PUMP_SECONDS;
	for (;;) {
		struct pollfd p[4];
		int active = 0;

		for (int i = 0; i < n; i++) {
			struct conn *c = &cs[i];
			p[i].fd = -1;
			p[i].events = 0;
			if (c->broken || (c->eof && c->shut))
				continue;
			p[i].fd = c->fd;
			p[i].events = (short)((c->eof ? 0 : POLLIN) | (c->shut ? 0 : POLLOUT));
			active++;
		}
		if (!active)
			break;
		if (victim_timespec_passed(&deadline)) {
			for (int i = 0; i < n; i++)
				CHECK(cs[i].eof && cs[i].shut,
				      "%s: stuck after sending %llu and receiving %llu bytes",
				      cs[i].name, (unsigned long long)cs[i].sent,
				      (unsigned long long)cs[i].rcvd);
			return;
		}
		if (poll(p, (nfds_t)n, 1000) < 0 && errno != EINTR)
			die("poll");
		for (int i = 0; i < n; i++) {
			struct conn *c = &cs[i];
			if (p[i].fd < 0)
				continue;
			if (p[i].revents & (POLLIN | POLLHUP | POLLERR)) {
				if (!c->eof && recv_some(c) < 0) {
					if (errno)
						fail("%s: recv: %s", c->name, strerror(errno));
					c->broken = 1;
					continue;
				}
			}
			if ((p[i].revents & POLLOUT) && !c->shut && send_some(c) < 0) {
				fail("%s: send: %s", c->name, strerror(errno));
				c->broken = 1;
			}
		}
	}
}

static socklen_t local_addr(int fd, struct sockaddr_storage *ss)
{
	socklen_t len = sizeof(*ss);

	if (getsockname(fd, (struct sockaddr *)ss, &len) != 0)
		die("getsockname");
	return len;
}

static int same_addr(int fd, const struct sockaddr_storage *want, int peer)
{
	struct sockaddr_storage got;
	socklen_t len = sizeof(got);
	int r = peer ? getpeername(fd, (struct sockaddr *)&got, &len)
		     : getsockname(fd, (struct sockaddr *)&got, &len);

	return r == 0 && memcmp(&got, want, len) == 0;
}

/* The loopback address of `family` with port 0 (any free port) in *ss;
 * returns its length. */
static socklen_t loopback_any_port(int family, struct sockaddr_storage *ss)
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

static int listener(int family)
{
	struct sockaddr_storage ss;
	int fd = socket(family, SOCK_STREAM, 0);

	if (fd < 0)
		die("socket");
	set_int(fd, SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR");
	set_int(fd, SOL_SOCKET, SO_RCVBUF, SMALL_RCVBUF, "SO_RCVBUF");
	if (family == AF_INET6)
		set_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, 1, "IPV6_V6ONLY");
	socklen_t len = loopback_any_port(family, &ss);
	if (bind(fd, (struct sockaddr *)&ss, len) != 0)
		die("bind");
	if (listen(fd, 8) != 0)
		die("listen");
	return fd;
}

static int connect_to(int lfd, int small)
{
	struct sockaddr_storage ss;
	socklen_t len = local_addr(lfd, &ss);
	int fd = socket(ss.ss_family, SOCK_STREAM, 0);

	if (fd < 0)
		die("socket");
	if (small) {
		set_int(fd, SOL_SOCKET, SO_RCVBUF, SMALL_RCVBUF, "SO_RCVBUF");
		set_int(fd, SOL_SOCKET, SO_SNDBUF, SMALL_SNDBUF, "SO_SNDBUF");
	}
	if (connect(fd, (struct sockaddr *)&ss, len) != 0)
		die("connect");
	return fd;
}

/* After the streams: the listening socket still takes new connections. */
static void check_accepts(int lfd, const char *name)
{
	char buf[16] = { 0 };
	int fd = accept(lfd, NULL, NULL);

	if (fd < 0) {
		fail("%s: accept after restore: %s", name, strerror(errno));
		return;
	}
	CHECK(recv(fd, buf, sizeof(buf) - 1, MSG_WAITALL) == 5 && strcmp(buf, "again") == 0,
	      "%s: new connection brought %s", name, buf);
	close(fd);
}

static void say_again(int lfd)
{
	int fd = connect_to(lfd, 0);

	if (send(fd, "again", 5, MSG_NOSIGNAL) != 5)
		fail("send again: %s", strerror(errno));
	close(fd);
}

static void tcp_client(int l4, int l6, int filled_w, int go_r)
{
	struct conn cs[2] = {
		{ .name = "client v4", .out_dir = 1, .in_dir = 0 },
		{ .name = "client v6", .out_dir = 3, .in_dir = 2 },
	};
	char b;

	cs[0].fd = connect_to(l4, 1);
	cs[1].fd = connect_to(l6, 1);
	set_int(cs[0].fd, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY");
	for (int i = 0; i < 2; i++) {
		nonblock(cs[i].fd);
		fill(&cs[i]);
	}
	if (write(filled_w, "F", 1) != 1 || read(go_r, &b, 1) != 1)
		die("client sync");
	CHECK(get_int(cs[0].fd, IPPROTO_TCP, TCP_NODELAY) == 1, "client v4 lost TCP_NODELAY");
	CHECK(get_int(cs[1].fd, IPPROTO_TCP, TCP_NODELAY) == 0, "client v6 gained TCP_NODELAY");
	CHECK(fcntl(cs[0].fd, F_GETFL) & O_NONBLOCK, "client v4 lost O_NONBLOCK");
	pump(cs, 2);
	say_again(l4);
	say_again(l6);
	_exit(victim_failures ? 1 : 0);
}

static void tcp(void)
{
	int l4 = listener(AF_INET), l6 = listener(AF_INET6);
	int filled[2], go[2];
	struct sockaddr_storage l4_addr, l6_addr;

	local_addr(l4, &l4_addr);
	local_addr(l6, &l6_addr);
	if (pipe(filled) != 0 || pipe(go) != 0)
		die("pipe");
	pid_t kid = fork();
	if (kid < 0)
		die("fork");
	if (kid == 0)
		tcp_client(l4, l6, filled[1], go[0]);

	struct conn cs[2] = {
		{ .name = "server v4", .out_dir = 0, .in_dir = 1 },
		{ .name = "server v6", .out_dir = 2, .in_dir = 3 },
	};
	char b;
	cs[0].fd = accept(l4, NULL, NULL);
	cs[1].fd = accept(l6, NULL, NULL);
	if (cs[0].fd < 0 || cs[1].fd < 0)
		die("accept");
	for (int i = 0; i < 2; i++) {
		set_int(cs[i].fd, SOL_SOCKET, SO_SNDBUF, SMALL_SNDBUF, "SO_SNDBUF");
		nonblock(cs[i].fd);
		fill(&cs[i]);
	}
	if (read(filled[0], &b, 1) != 1)
		die("server sync");

	victim_ready_and_wait(NULL);

	CHECK(same_addr(l4, &l4_addr, 0) && same_addr(l6, &l6_addr, 0),
	      "listening sockets moved");
	CHECK(get_int(l4, SOL_SOCKET, SO_ACCEPTCONN) == 1, "v4 listener not listening");
	CHECK(get_int(l6, IPPROTO_IPV6, IPV6_V6ONLY) == 1, "v6 listener lost IPV6_V6ONLY");
	CHECK(get_int(cs[0].fd, SOL_SOCKET, SO_REUSEADDR) == 1, "server v4 lost SO_REUSEADDR");
	if (write(go[1], "G", 1) != 1)
		die("server go");
	pump(cs, 2);
	check_accepts(l4, "v4 listener");
	check_accepts(l6, "v6 listener");

	int st;
	CHECK(waitpid(kid, &st, 0) == kid, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "client failed (see stderr): status %#x", st);
	victim_finish();
}

struct udp_sock {
	const char *name;
	int fd;
	struct sockaddr_storage local, peer;
	int rcvbuf;
};

static int udp_bound(int family)
{
	struct sockaddr_storage ss;
	int fd = socket(family, SOCK_DGRAM, 0);

	if (fd < 0)
		die("socket");
	if (family == AF_INET6) {
		set_int(fd, IPPROTO_IPV6, IPV6_V6ONLY, 1, "IPV6_V6ONLY");
		set_int(fd, SOL_SOCKET, SO_REUSEPORT, 1, "SO_REUSEPORT");
	} else {
		set_int(fd, SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR");
		set_int(fd, SOL_SOCKET, SO_BROADCAST, 1, "SO_BROADCAST");
	}
	set_int(fd, SOL_SOCKET, SO_RCVBUF, 65536, "SO_RCVBUF");
	socklen_t len = loopback_any_port(family, &ss);
	if (bind(fd, (struct sockaddr *)&ss, len) != 0)
		die("bind");
	return fd;
}

static void udp_pair(struct udp_sock *a, struct udp_sock *b, int family)
{
	a->fd = udp_bound(family);
	b->fd = udp_bound(family);
	socklen_t la = local_addr(a->fd, &a->local), lb = local_addr(b->fd, &b->local);
	if (connect(a->fd, (struct sockaddr *)&b->local, lb) != 0 ||
	    connect(b->fd, (struct sockaddr *)&a->local, la) != 0)
		die("connect");
	a->peer = b->local;
	b->peer = a->local;
	a->rcvbuf = get_int(a->fd, SOL_SOCKET, SO_RCVBUF);
	b->rcvbuf = get_int(b->fd, SOL_SOCKET, SO_RCVBUF);
}

static void datagrams(struct udp_sock *from, struct udp_sock *to)
{
	for (uint32_t i = 0; i < DATAGRAMS; i++) {
		uint32_t got = ~0u;
		if (send(from->fd, &i, sizeof(i), 0) != sizeof(i)) {
			fail("%s: send: %s", from->name, strerror(errno));
			return;
		}
		if (recv(to->fd, &got, sizeof(got), 0) != sizeof(got) || got != i) {
			fail("%s: datagram %u came as %u", to->name, i, got);
			return;
		}
	}
}

static void udp(void)
{
	struct udp_sock s[4] = {
		{ .name = "udp v4 a" }, { .name = "udp v4 b" },
		{ .name = "udp v6 a" }, { .name = "udp v6 b" },
	};
	udp_pair(&s[0], &s[1], AF_INET);
	udp_pair(&s[2], &s[3], AF_INET6);
	datagrams(&s[0], &s[1]);
	/* A datagram left queued: dropped by the dump (UDP may lose it). */
	uint32_t left = 0xdead;
	if (send(s[1].fd, &left, sizeof(left), 0) != sizeof(left))
		die("send queued");

	victim_ready_and_wait(NULL);

	for (int i = 0; i < 4; i++) {
		CHECK(same_addr(s[i].fd, &s[i].local, 0), "%s: local address changed", s[i].name);
		CHECK(same_addr(s[i].fd, &s[i].peer, 1), "%s: peer changed", s[i].name);
		CHECK(get_int(s[i].fd, SOL_SOCKET, SO_RCVBUF) == s[i].rcvbuf,
		      "%s: SO_RCVBUF %d, was %d", s[i].name,
		      get_int(s[i].fd, SOL_SOCKET, SO_RCVBUF), s[i].rcvbuf);
		CHECK(get_int(s[i].fd, SOL_SOCKET, SO_TYPE) == SOCK_DGRAM, "%s: not UDP", s[i].name);
	}
	/* The datagram queued at dump time: still there when the tree ran on,
	 * dropped by a restore (the harness checks which). */
	uint32_t got = 0;
	ssize_t r = recv(s[0].fd, &got, sizeof(got), MSG_DONTWAIT);
	CHECK(r < 0 || got == left, "queued datagram came back as %#x", got);
	victim_write_file("udp-queued", r < 0 ? "dropped" : "kept");
	CHECK(get_int(s[0].fd, SOL_SOCKET, SO_REUSEADDR) == 1, "v4 lost SO_REUSEADDR");
	CHECK(get_int(s[0].fd, SOL_SOCKET, SO_BROADCAST) == 1, "v4 lost SO_BROADCAST");
	CHECK(get_int(s[0].fd, SOL_SOCKET, SO_REUSEPORT) == 0, "v4 gained SO_REUSEPORT");
	CHECK(get_int(s[2].fd, SOL_SOCKET, SO_REUSEPORT) == 1, "v6 lost SO_REUSEPORT");
	CHECK(get_int(s[2].fd, IPPROTO_IPV6, IPV6_V6ONLY) == 1, "v6 lost IPV6_V6ONLY");
	CHECK(get_int(s[2].fd, SOL_SOCKET, SO_BROADCAST) == 0, "v6 gained SO_BROADCAST");
	datagrams(&s[0], &s[1]);
	datagrams(&s[1], &s[0]);
	datagrams(&s[2], &s[3]);
	datagrams(&s[3], &s[2]);
	victim_finish();
}

static void outside(const char *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	struct conn c = { .name = "to outside", .out_dir = 1, .in_dir = 0 };

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	a.sin_port = htons((uint16_t)atoi(port));
	c.fd = socket(AF_INET, SOCK_STREAM, 0);
	if (c.fd < 0)
		die("socket");
	set_int(c.fd, SOL_SOCKET, SO_RCVBUF, SMALL_RCVBUF, "SO_RCVBUF");
	set_int(c.fd, SOL_SOCKET, SO_SNDBUF, SMALL_SNDBUF, "SO_SNDBUF");
	if (connect(c.fd, (struct sockaddr *)&a, sizeof(a)) != 0)
		die("connect");
	nonblock(c.fd);
	fill(&c);

	victim_ready_and_wait(NULL);

	pump(&c, 1);
	victim_finish();
}

static void chatter(const char *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	uint64_t n;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	a.sin_port = htons((uint16_t)atoi(port));
	if (fd < 0)
		die("socket");
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
		die("connect");
	victim_signal_ready(NULL);
	for (n = 0;; n++) {
		uint64_t back = 0;
		size_t got = 0;

		if ((n & 63) == 0) {
			if (victim_file_exists("go"))
				break;
			victim_poll_ping();
		}
		if (send(fd, &n, sizeof(n), MSG_NOSIGNAL) != (ssize_t)sizeof(n)) {
			fail("send of exchange %llu: %s", (unsigned long long)n, strerror(errno));
			victim_finish();
		}
		while (got < sizeof(back)) {
			ssize_t r = recv(fd, (char *)&back + got, sizeof(back) - got, 0);

			if (r <= 0) {
				fail("recv of exchange %llu: %s", (unsigned long long)n,
				     r == 0 ? "end of stream" : strerror(errno));
				victim_finish();
			}
			got += (size_t)r;
		}
		CHECK(back == n, "exchange %llu came back as %llu", (unsigned long long)n,
		      (unsigned long long)back);
	}
	victim_finish();
}

/* Binds a UDP socket to a free port below 1024 while root, then drops
 * CAP_NET_BIND_SERVICE from the effective set: the process keeps the port
 * but could not bind it again (a server that dropped privileges). */
static void privport(void)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct d[2];
	struct sockaddr_in a = { .sin_family = AF_INET };
	int fd = socket(AF_INET, SOCK_DGRAM, 0), port;
	char buf[16];

	if (fd < 0)
		die("socket");
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	for (port = 1023; port > 900; port--) {
		a.sin_port = htons((uint16_t)port);
		if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0)
			break;
	}
	if (port == 900)
		die("bind a low port");
	if (syscall(SYS_capget, &h, d) != 0)
		die("capget");
	d[CAP_NET_BIND_SERVICE / 32].effective &= ~(1u << (CAP_NET_BIND_SERVICE % 32));
	if (syscall(SYS_capset, &h, d) != 0)
		die("capset");
	snprintf(buf, sizeof(buf), "%d", port);
	victim_write_file("port", buf);

	victim_ready_and_wait(NULL);

	struct sockaddr_storage want = { 0 };
	memcpy(&want, &a, sizeof(a));
	CHECK(same_addr(fd, &want, 0), "lost its port");
	victim_finish();
}

/* Bytes the test sends the server before the dump, and while it is down
 * (SERVER_BEFORE and SERVER_GAP in tests/inet.rs). */
#define SERVER_BEFORE 1000
#define SERVER_GAP 1500

static void server(void)
{
	char buf[SERVER_GAP], port[16];
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	int l = listener(AF_INET);

	if (getsockname(l, (struct sockaddr *)&a, &len) != 0)
		die("getsockname");
	snprintf(port, sizeof(port), "%d", ntohs(a.sin_port));
	victim_write_file("port", port);
	int c = accept(l, NULL, NULL);
	if (c < 0)
		die("accept");
	if (victim_read_exact(c, buf, SERVER_BEFORE) != 0)
		die("read the bytes before the dump");
	for (int i = 0; i < SERVER_BEFORE; i++)
		CHECK((uint8_t)buf[i] == stream_byte(0, (uint64_t)i), "byte %d before the dump", i);

	victim_ready_and_wait(NULL);

	if (victim_read_exact(c, buf, SERVER_GAP) != 0) {
		fail("read the bytes sent while the tree was down: %s", strerror(errno));
		victim_finish();
	}
	for (int i = 0; i < SERVER_GAP; i++)
		CHECK((uint8_t)buf[i] == stream_byte(0, (uint64_t)(SERVER_BEFORE + i)),
		      "byte %d sent while the tree was down", SERVER_BEFORE + i);
	if (send(c, buf, SERVER_GAP, MSG_NOSIGNAL) != SERVER_GAP)
		fail("send back: %s", strerror(errno));
	victim_finish();
}

/* What ckpt refuses by name: a connection not accepted yet whose server
 * end holds bytes the client sent (only accept shows them). It keeps
 * working. */
static void refused(void)
{
	int l = listener(AF_INET);
	int pending = connect_to(l, 0);
	char b = 0, early[6] = { 0 };

	if (send(pending, "early", 5, MSG_NOSIGNAL) != 5)
		die("send");
	victim_ready_and_wait(NULL);

	int got = accept(l, NULL, NULL);
	CHECK(got >= 0, "pending connection lost: %s", strerror(errno));
	CHECK(victim_read_exact(got, early, 5) == 0 && strcmp(early, "early") == 0,
	      "the bytes sent before accept are lost");
	CHECK(send(pending, "p", 1, MSG_NOSIGNAL) == 1 && recv(got, &b, 1, 0) == 1 && b == 'p',
	      "pending connection broken");
	victim_finish();
}

/* Unread bytes each end of a half-closed connection holds. */
#define HALF_DATA 3000
/* How long the victim waits for a connection to reach a state. */
#define STATE_WAIT_MS 5000

static int tcp_state(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
		die("TCP_INFO");
	return ti.tcpi_state;
}

/* Whether fd reaches TCP state want with unread bytes queued (ANY_UNREAD:
 * whatever is queued) within STATE_WAIT_MS. */
#define ANY_UNREAD (-1)
static int reaches_state(int fd, int want, int unread)
{
	for (int ms = 0; ms < STATE_WAIT_MS; ms++) {
		int queued = 0;

		if (ioctl(fd, FIONREAD, &queued) != 0)
			die("FIONREAD");
		if (tcp_state(fd) == want && (unread == ANY_UNREAD || queued == unread))
			return 1;
		usleep(1000);
	}
	return 0;
}

static void await_state(int fd, int want, int unread)
{
	if (!reaches_state(fd, want, unread)) {
		errno = ETIMEDOUT;
		die("half-closed connection never settled");
	}
}

static void send_stream(int fd, int dir, int len)
{
	char buf[HALF_DATA];

	for (int i = 0; i < len; i++)
		buf[i] = (char)stream_byte(dir, (uint64_t)i);
	if (send(fd, buf, (size_t)len, MSG_NOSIGNAL) != len)
		die("send");
}

static void check_stream(int fd, int dir, int len, const char *name)
{
	char buf[HALF_DATA];

	if (victim_read_exact(fd, buf, (size_t)len) != 0) {
		fail("%s: read %d unread bytes: %s", name, len, strerror(errno));
		return;
	}
	for (int i = 0; i < len; i++)
		if ((uint8_t)buf[i] != stream_byte(dir, (uint64_t)i)) {
			fail("%s: byte %d lost or changed", name, i);
			return;
		}
}

static void closedby(int family)
{
	char buf[SERVER_BEFORE], port[16], b = 0;
	struct sockaddr_storage a;
	int l = listener(family);

	local_addr(l, &a);
	snprintf(port, sizeof(port), "%d",
		 ntohs(family == AF_INET6 ? ((struct sockaddr_in6 *)&a)->sin6_port :
					    ((struct sockaddr_in *)&a)->sin_port));
	victim_write_file("port", port);
	int c = accept(l, NULL, NULL);
	if (c < 0)
		die("accept");
	await_state(c, TCP_CLOSE_WAIT, SERVER_BEFORE);

	victim_ready_and_wait(NULL);

	CHECK(tcp_state(c) == TCP_CLOSE_WAIT, "not in CLOSE_WAIT again but in %d", tcp_state(c));
	if (victim_read_exact(c, buf, SERVER_BEFORE) != 0) {
		fail("read the unread bytes: %s", strerror(errno));
		victim_finish();
	}
	for (int i = 0; i < SERVER_BEFORE; i++)
		CHECK((uint8_t)buf[i] == stream_byte(0, (uint64_t)i), "unread byte %d", i);
	CHECK(recv(c, &b, 1, 0) == 0, "no end of stream after the unread bytes");
	CHECK(send(c, "bye", 3, MSG_NOSIGNAL) == 3, "send in CLOSE_WAIT: %s", strerror(errno));
	victim_finish();
}

static void shutout(const char *port)
{
	struct sockaddr_in a = { .sin_family = AF_INET };
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	char b = 0;

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	a.sin_port = htons((uint16_t)atoi(port));
	if (fd < 0)
		die("socket");
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
		die("connect");
	send_stream(fd, 0, HALF_DATA);
	if (shutdown(fd, SHUT_WR) != 0)
		die("shutdown");
	await_state(fd, TCP_FIN_WAIT2, 0);

	victim_ready_and_wait(NULL);

	CHECK(reaches_state(fd, TCP_FIN_WAIT2, ANY_UNREAD), "not in FIN_WAIT2 again but in %d",
	      tcp_state(fd));
	check_stream(fd, 1, HALF_DATA, "FIN_WAIT2 end");
	CHECK(recv(fd, &b, 1, 0) == 0, "no end of stream after the test's bytes");
	victim_finish();
}

/* The most a writer can queue towards a small reader (bounds its buffer). */
#define FINWAIT1_MAX (1 << 20)

static void finwait1(void)
{
	const int families[2] = { AF_INET, AF_INET6 };
	const char *names[2] = { "v4", "v6" };
	int writer[2], reader[2];
	size_t queued[2];
	char *buf = malloc(FINWAIT1_MAX);

	if (!buf)
		die("malloc");
	for (int f = 0; f < 2; f++) {
		int l = listener(families[f]);

		writer[f] = connect_to(l, 1);
		reader[f] = accept(l, NULL, NULL);
		if (reader[f] < 0)
			die("accept");
		close(l);
		nonblock(writer[f]);
		for (size_t i = 0; i < FINWAIT1_MAX; i++)
			buf[i] = (char)stream_byte(0, i);
		queued[f] = 0;
		for (;;) {
			ssize_t n = send(writer[f], buf + queued[f], FINWAIT1_MAX - queued[f],
					 MSG_NOSIGNAL);
			if (n > 0) {
				queued[f] += (size_t)n;
				continue;
			}
			if (n < 0 && errno == EAGAIN) {
				/* Until the window closed for good. */
				usleep(20000);
				n = send(writer[f], buf + queued[f], FINWAIT1_MAX - queued[f],
					 MSG_NOSIGNAL);
				if (n > 0) {
					queued[f] += (size_t)n;
					continue;
				}
				if (n < 0 && errno == EAGAIN)
					break;
			}
			die("fill the writer");
		}
		if (shutdown(writer[f], SHUT_WR) != 0)
			die("shutdown");
		await_state(writer[f], TCP_FIN_WAIT1, 0);
	}

	victim_ready_and_wait(NULL);

	for (int f = 0; f < 2; f++) {
		char b = 0;

		if (victim_read_exact(reader[f], buf, queued[f]) != 0) {
			fail("%s: read the %zu bytes queued: %s", names[f], queued[f], strerror(errno));
			continue;
		}
		for (size_t i = 0; i < queued[f]; i++)
			if ((uint8_t)buf[i] != stream_byte(0, i)) {
				fail("%s: byte %zu lost or changed", names[f], i);
				break;
			}
		CHECK(recv(reader[f], &b, 1, 0) == 0, "%s: no end of stream after %zu bytes",
		      names[f], queued[f]);
		CHECK(reaches_state(writer[f], TCP_FIN_WAIT2, ANY_UNREAD),
		      "%s: the writer is in state %d, not FIN_WAIT2", names[f], tcp_state(writer[f]));
		CHECK(send(reader[f], "r", 1, MSG_NOSIGNAL) == 1 &&
			      reaches_state(writer[f], TCP_FIN_WAIT2, 1) &&
			      recv(writer[f], &b, 1, 0) == 1 && b == 'r',
		      "%s: the writer no longer reads", names[f]);
	}
	free(buf);
	victim_finish();
}

static void halfclosed(void)
{
	const int families[2] = { AF_INET, AF_INET6 };
	const char *names[2] = { "v4", "v6" };
	int closer[2], other[2];

	for (int i = 0; i < 2; i++) {
		int l = listener(families[i]);

		closer[i] = connect_to(l, 0);
		other[i] = accept(l, NULL, NULL);
		if (other[i] < 0)
			die("accept");
		close(l);
		send_stream(closer[i], 0, HALF_DATA);
		if (shutdown(closer[i], SHUT_WR) != 0)
			die("shutdown");
		send_stream(other[i], 1, HALF_DATA);
		await_state(other[i], TCP_CLOSE_WAIT, HALF_DATA);
		await_state(closer[i], TCP_FIN_WAIT2, HALF_DATA);
	}

	victim_ready_and_wait(NULL);

	for (int i = 0; i < 2; i++) {
		char b = 0;

		CHECK(tcp_state(other[i]) == TCP_CLOSE_WAIT, "%s: the reader is in state %d",
		      names[i], tcp_state(other[i]));
		CHECK(tcp_state(closer[i]) == TCP_FIN_WAIT2, "%s: the closer is in state %d",
		      names[i], tcp_state(closer[i]));
		check_stream(other[i], 0, HALF_DATA, "CLOSE_WAIT end");
		CHECK(recv(other[i], &b, 1, 0) == 0, "%s: no end of stream after the unread bytes",
		      names[i]);
		check_stream(closer[i], 1, HALF_DATA, "FIN_WAIT2 end");
		CHECK(send(other[i], "o", 1, MSG_NOSIGNAL) == 1 && recv(closer[i], &b, 1, 0) == 1 &&
			      b == 'o',
		      "%s: the CLOSE_WAIT end no longer writes", names[i]);
		CHECK(shutdown(other[i], SHUT_WR) == 0 && recv(closer[i], &b, 1, 0) == 0,
		      "%s: the FIN_WAIT2 end sees no end of stream", names[i]);
	}
	victim_finish();
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	const char *mode = argc > 2 ? argv[2] : "";

	if (strcmp(mode, "tcp") == 0)
		tcp();
	else if (strcmp(mode, "udp") == 0)
		udp();
	else if (strcmp(mode, "refused") == 0)
		refused();
	else if (strcmp(mode, "privport") == 0)
		privport();
	else if (strcmp(mode, "outside") == 0 && argc > 3)
		outside(argv[3]);
	else if (strcmp(mode, "chatter") == 0 && argc > 3)
		chatter(argv[3]);
	else if (strcmp(mode, "server") == 0)
		server();
	else if (strcmp(mode, "halfclosed") == 0)
		halfclosed();
	else if (strcmp(mode, "finwait1") == 0)
		finwait1();
	else if (strcmp(mode, "closedby") == 0)
		closedby(argc > 3 && strcmp(argv[3], "v6") == 0 ? AF_INET6 : AF_INET);
	else if (strcmp(mode, "shutout") == 0 && argc > 3)
		shutout(argv[3]);
	errno = EINVAL;
	die("usage: inet WORKDIR tcp|udp|refused|privport|server|halfclosed|outside PORT|chatter PORT|shutout PORT|closedby [v6]|finwait1");
}
