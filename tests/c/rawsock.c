/*
 * Raw IPv4/IPv6 sockets and packet sockets (tests/rawsock.rs).
 *
 *   rawsock WORKDIR all    raw sockets of an experimental protocol (253):
 *                          v4 bound to 127.0.0.1, v4 connected to it, v6
 *                          bound to ::1; an IPPROTO_RAW one (IP_HDRINCL);
 *                          an ICMP one with an ICMP_FILTER; a packet
 *                          datagram socket bound to lo for IPv4 with
 *                          PACKET_AUXDATA, and an unbound raw packet socket;
 *                          after go each has its protocol, addresses and
 *                          options, a datagram sent with send() on the
 *                          connected one reaches the bound one, and the
 *                          packet socket sees it pass on lo.
 *   rawsock WORKDIR user UID GID
 *                          (root) a raw socket of protocol 253, kept after
 *                          becoming user UID (no capability left): a restore
 *                          through the service for that user is refused.
 *   rawsock WORKDIR ring   a packet socket with a PACKET_RX_RING and one in
 *                          a fanout group: a dump is refused, naming both.
 */
#include "victim.h"

#include <arpa/inet.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/ip_icmp.h>
#include <poll.h>
#include <grp.h>
#include <sys/prctl.h>
#include <sys/socket.h>

#define PROTO 253
/* linux/icmp.h, which clashes with net/if.h. */
#define ICMP_FILTER 1
#define PAYLOAD "raw datagram"

static int get_int(int fd, int level, int opt)
{
	int v = -1;
	socklen_t len = sizeof(v);

	if (getsockopt(fd, level, opt, &v, &len) != 0)
		return -1;
	return v;
}

static void set_int(int fd, int level, int opt, int val, const char *what)
{
	if (setsockopt(fd, level, opt, &val, sizeof(val)) != 0)
		die(what);
}

static int raw(int family, int proto)
{
	int fd = socket(family, SOCK_RAW, proto);

	if (fd < 0)
		die("socket (raw)");
	return fd;
}

/* Waits for a datagram on `fd` that ends with PAYLOAD. */
static int receives(int fd, const char *what)
{
	char buf[2048];

	/* Other traffic passes on lo too: look at what comes for a while. */
	for (int i = 0; i < 100000; i++) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, 5000) != 1)
			break;
		ssize_t r = recv(fd, buf, sizeof(buf), 0);
		size_t n = strlen(PAYLOAD);
		if (r >= (ssize_t)n && memcmp(buf + r - n, PAYLOAD, n) == 0)
			return 1;
	}
	fail("%s: the datagram did not come", what);
	return 0;
}

static void all(void)
{
	struct sockaddr_in lo4 = { .sin_family = AF_INET };
	struct sockaddr_in6 lo6 = { .sin6_family = AF_INET6 };
	uint32_t filt = ~(1u << ICMP_ECHOREPLY);
	int lo = (int)if_nametoindex("lo");

	lo4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	lo6.sin6_addr = in6addr_loopback;
	int bound4 = raw(AF_INET, PROTO), conn4 = raw(AF_INET, PROTO);
	int bound6 = raw(AF_INET6, PROTO), hdr = raw(AF_INET, IPPROTO_RAW);
	int icmp = raw(AF_INET, IPPROTO_ICMP);
	if (bind(bound4, (struct sockaddr *)&lo4, sizeof(lo4)) != 0 ||
	    bind(bound6, (struct sockaddr *)&lo6, sizeof(lo6)) != 0)
		die("bind raw");
	if (connect(conn4, (struct sockaddr *)&lo4, sizeof(lo4)) != 0)
		die("connect raw");
	if (setsockopt(icmp, SOL_RAW, ICMP_FILTER, &filt, sizeof(filt)) != 0)
		die("ICMP_FILTER");
	int pk = socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_IP));
	int pkraw = socket(AF_PACKET, SOCK_RAW, 0);
	if (pk < 0 || pkraw < 0)
		die("socket (packet)");
	struct sockaddr_ll ll = { .sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_IP),
				  .sll_ifindex = lo };
	if (bind(pk, (struct sockaddr *)&ll, sizeof(ll)) != 0)
		die("bind packet");
	set_int(pk, SOL_PACKET, PACKET_AUXDATA, 1, "PACKET_AUXDATA");

	victim_ready_and_wait(NULL);

	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	CHECK(getsockname(bound4, (struct sockaddr *)&ss, &len) == 0 &&
		      ((struct sockaddr_in *)&ss)->sin_addr.s_addr == lo4.sin_addr.s_addr,
	      "v4 raw: not bound to 127.0.0.1");
	len = sizeof(ss);
	CHECK(getsockname(bound6, (struct sockaddr *)&ss, &len) == 0 &&
		      memcmp(&((struct sockaddr_in6 *)&ss)->sin6_addr, &in6addr_loopback, 16) == 0,
	      "v6 raw: not bound to ::1");
	CHECK(get_int(bound4, SOL_SOCKET, SO_PROTOCOL) == PROTO, "v4 raw: protocol %d",
	      get_int(bound4, SOL_SOCKET, SO_PROTOCOL));
	CHECK(get_int(bound6, SOL_SOCKET, SO_PROTOCOL) == PROTO, "v6 raw: protocol %d",
	      get_int(bound6, SOL_SOCKET, SO_PROTOCOL));
	CHECK(get_int(hdr, IPPROTO_IP, IP_HDRINCL) == 1, "IPPROTO_RAW: no IP_HDRINCL");
	CHECK(get_int(conn4, IPPROTO_IP, IP_HDRINCL) == 0, "raw: gained IP_HDRINCL");
	uint32_t now = 0;
	len = sizeof(now);
	CHECK(getsockopt(icmp, SOL_RAW, ICMP_FILTER, &now, &len) == 0 && now == filt,
	      "ICMP_FILTER %#x, was %#x", now, filt);
	struct sockaddr_ll pn = { 0 };
	len = sizeof(pn);
	CHECK(getsockname(pk, (struct sockaddr *)&pn, &len) == 0 && pn.sll_ifindex == lo &&
		      pn.sll_protocol == htons(ETH_P_IP),
	      "packet: bound to interface %d protocol %#x", pn.sll_ifindex, ntohs(pn.sll_protocol));
	CHECK(get_int(pk, SOL_PACKET, PACKET_AUXDATA) == 1, "packet: lost PACKET_AUXDATA");
	CHECK(get_int(pkraw, SOL_SOCKET, SO_TYPE) == SOCK_RAW, "raw packet socket: type");
	/* Room in its buffer for the datagram, whatever else lo carried. */
	char junk[2048];
	while (recv(pk, junk, sizeof(junk), MSG_DONTWAIT) > 0)
		;
	if (send(conn4, PAYLOAD, strlen(PAYLOAD), 0) != (ssize_t)strlen(PAYLOAD))
		fail("connected raw socket: send: %s", strerror(errno));
	receives(bound4, "bound raw socket");
	receives(pk, "packet socket on lo");
	victim_finish();
}

static void ring(void)
{
	struct tpacket_req req = { .tp_block_size = 4096, .tp_block_nr = 1, .tp_frame_size = 2048,
				   .tp_frame_nr = 2 };
	int rx = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
	int fan = socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));

	if (rx < 0 || fan < 0)
		die("socket (packet)");
	if (setsockopt(rx, SOL_PACKET, PACKET_RX_RING, &req, sizeof(req)) != 0)
		die("PACKET_RX_RING");
	set_int(fan, SOL_PACKET, PACKET_FANOUT, (int)(getpid() & 0xffff) | (PACKET_FANOUT_HASH << 16),
		"PACKET_FANOUT");

	victim_ready_and_wait(NULL);

	CHECK(get_int(fan, SOL_PACKET, PACKET_FANOUT) != 0, "left its fanout group");
	victim_finish();
}

static void user(uid_t uid, gid_t gid)
{
	int fd = raw(AF_INET, PROTO);

	if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 ||
	    setresuid(uid, uid, uid) != 0)
		die("become the user");
	/* A change of uid made it undumpable; it runs no set-id program. */
	if (prctl(PR_SET_DUMPABLE, 1) != 0)
		die("PR_SET_DUMPABLE");

	victim_ready_and_wait(NULL);

	CHECK(get_int(fd, SOL_SOCKET, SO_PROTOCOL) == PROTO, "raw socket: protocol");
	victim_finish();
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	const char *mode = argc > 2 ? argv[2] : "";

	if (strcmp(mode, "all") == 0)
		all();
	else if (strcmp(mode, "ring") == 0)
		ring();
	else if (strcmp(mode, "user") == 0 && argc > 4)
		user((uid_t)atoi(argv[3]), (gid_t)atoi(argv[4]));
	die("usage: rawsock WORKDIR all|ring|user UID GID");
}
