/*
 * Netlink sockets (tests/netlink.rs).
 *
 *   netlink WORKDIR all    a NETLINK_ROUTE socket bound by the kernel (its
 *                          port id is the pid) in groups below and above 32,
 *                          with NETLINK_EXT_ACK and NETLINK_NO_ENOBUFS and a
 *                          message queued to it; a second route socket
 *                          bound to a chosen port id and connected to the
 *                          first; a NETLINK_SOCK_DIAG socket; a
 *                          NETLINK_KOBJECT_UEVENT socket in group 1; after
 *                          go each has its port id, groups, destination and
 *                          options, the queued message is gone ("nl-queued"
 *                          says dropped or kept), a message sent with send()
 *                          reaches the first, and the kernel answers a
 *                          route request and a sock_diag request.
 *   netlink WORKDIR dumping
 *                          a route socket that asked for the links and read
 *                          none of the answer (the kernel holds the rest of
 *                          its dump): a dump is refused; after go it reads
 *                          the answer to its end.
 *   netlink WORKDIR admin  (root) a NETLINK_SOCK_DIAG socket in group 1
 *                          (socket destruction events), kept after dropping
 *                          CAP_NET_ADMIN: a restore is refused.
 */
#include "victim.h"

#include <linux/capability.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/syscall.h>

#ifndef NETLINK_EXT_ACK
#define NETLINK_EXT_ACK 11
#endif
#ifndef SOL_NETLINK
#define SOL_NETLINK 270
#endif

/* Groups the route socket joins: one in nl_groups, two by number, one of
 * them past 32. */
#define GROUP_LINK 1
#define GROUP_IFADDR 5
#define GROUP_HIGH 33
#define CHOSEN_PORTID 0x4e4c0000u

static int nl_socket(int type, int proto)
{
	int fd = socket(AF_NETLINK, type, proto);

	if (fd < 0)
		die("socket");
	return fd;
}

static void nl_bind(int fd, uint32_t portid, uint32_t groups)
{
	struct sockaddr_nl a = { .nl_family = AF_NETLINK, .nl_pid = portid, .nl_groups = groups };

	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
		die("bind");
}

static void join(int fd, int group)
{
	if (setsockopt(fd, SOL_NETLINK, NETLINK_ADD_MEMBERSHIP, &group, sizeof(group)) != 0)
		die("NETLINK_ADD_MEMBERSHIP");
}

static struct sockaddr_nl name_of(int fd, int peer)
{
	struct sockaddr_nl a = { 0 };
	socklen_t len = sizeof(a);

	if ((peer ? getpeername(fd, (struct sockaddr *)&a, &len)
		  : getsockname(fd, (struct sockaddr *)&a, &len)) != 0)
		die("getsockname");
	return a;
}

/* The groups as NETLINK_LIST_MEMBERSHIPS gives them; returns the words. */
static int memberships(int fd, uint32_t *words, int n)
{
	socklen_t len = (socklen_t)(n * sizeof(*words));

	memset(words, 0, len);
	if (getsockopt(fd, SOL_NETLINK, NETLINK_LIST_MEMBERSHIPS, words, &len) != 0)
		return -1;
	return (int)(len / sizeof(*words));
}

static int get_int(int fd, int level, int opt)
{
	int v = -1;
	socklen_t len = sizeof(v);

	if (getsockopt(fd, level, opt, &v, &len) != 0)
		return -1;
	return v;
}

static void send_note(int fd, const char *note)
{
	char buf[NLMSG_SPACE(32)] = { 0 };
	struct nlmsghdr *h = (struct nlmsghdr *)buf;

	h->nlmsg_len = NLMSG_LENGTH(strlen(note) + 1);
	h->nlmsg_type = NLMSG_MIN_TYPE + 1;
	strcpy(NLMSG_DATA(h), note);
	if (send(fd, buf, h->nlmsg_len, 0) != (ssize_t)h->nlmsg_len)
		die("send note");
}

/* The next message's text, or "" when none comes within the wait. */
static const char *next_note(int fd, int wait_ms, char *buf, size_t len)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };

	if (poll(&p, 1, wait_ms) != 1)
		return "";
	ssize_t r = recv(fd, buf, len - 1, 0);
	if (r < (ssize_t)NLMSG_HDRLEN)
		return "";
	buf[r] = 0;
	return NLMSG_DATA((struct nlmsghdr *)buf);
}

/* Whether a message with text `note` comes within the wait, passing over
 * the kernel's notifications to the groups. */
static int comes(int fd, const char *note, int wait_ms)
{
	char buf[8192];

	for (int i = 0; i < 64; i++) {
		const char *got = next_note(fd, wait_ms, buf, sizeof(buf));
		if (strcmp(got, note) == 0)
			return 1;
		if (!*got)
			return 0;
	}
	return 0;
}

/* Reads a dump's replies until NLMSG_DONE; returns how many messages came
 * (-1 on an error reply). */
static int answer(int fd)
{
	char buf[8192];
	int count = 0;

	for (;;) {
		ssize_t r = recv(fd, buf, sizeof(buf), 0);
		if (r <= 0)
			return -1;
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)r);
		     h = NLMSG_NEXT(h, r)) {
			if (h->nlmsg_type == NLMSG_DONE)
				return count;
			if (h->nlmsg_type == NLMSG_ERROR)
				return -1;
			count++;
		}
	}
}

/* Sends a dump request; with `read` reads the replies (see answer()). */
static int ask_only(int fd, uint16_t type, void *req, size_t req_len, int read)
{
	struct {
		struct nlmsghdr h;
		char body[64];
	} m = { 0 };

	m.h.nlmsg_len = NLMSG_LENGTH(req_len);
	m.h.nlmsg_type = type;
	m.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	m.h.nlmsg_seq = 7;
	memcpy(m.body, req, req_len);
	if (send(fd, &m, m.h.nlmsg_len, 0) < 0)
		return -1;
	return read ? answer(fd) : 0;
}

static int ask(int fd, uint16_t type, void *req, size_t req_len)
{
	return ask_only(fd, type, req, req_len, 1);
}

static void all(void)
{
	uint32_t before[4], after[4];
	int yes = 1;
	int rt = nl_socket(SOCK_RAW, NETLINK_ROUTE);
	int to = nl_socket(SOCK_RAW, NETLINK_ROUTE);
	int diag = nl_socket(SOCK_DGRAM, NETLINK_SOCK_DIAG);
	int ue = nl_socket(SOCK_DGRAM, NETLINK_KOBJECT_UEVENT);

	nl_bind(rt, 0, 1u << (GROUP_LINK - 1));
	join(rt, GROUP_IFADDR);
	join(rt, GROUP_HIGH);
	if (setsockopt(rt, SOL_NETLINK, NETLINK_EXT_ACK, &yes, sizeof(yes)) != 0 ||
	    setsockopt(rt, SOL_NETLINK, NETLINK_NO_ENOBUFS, &yes, sizeof(yes)) != 0)
		die("netlink options");
	nl_bind(to, CHOSEN_PORTID ^ (uint32_t)getpid(), 0);
	struct sockaddr_nl rt_name = name_of(rt, 0), to_name = name_of(to, 0);
	if (connect(to, (struct sockaddr *)&rt_name, sizeof(rt_name)) != 0)
		die("connect");
	nl_bind(ue, 0, 1);
	int words = memberships(rt, before, 4);
	CHECK(words >= 2 && (before[1] & 1), "group %d not joined", GROUP_HIGH);
	/* Left queued: dropped by the dump (as CRIU does). */
	send_note(to, "before");

	victim_ready_and_wait(NULL);

	struct sockaddr_nl rt_now = name_of(rt, 0), to_now = name_of(to, 0);
	struct sockaddr_nl to_peer = name_of(to, 1), ue_now = name_of(ue, 0);
	CHECK(rt_now.nl_pid == rt_name.nl_pid, "route socket: port id %u, was %u", rt_now.nl_pid,
	      rt_name.nl_pid);
	CHECK(rt_now.nl_groups == rt_name.nl_groups, "route socket: nl_groups %#x, was %#x",
	      rt_now.nl_groups, rt_name.nl_groups);
	CHECK(memberships(rt, after, 4) == words && memcmp(before, after, sizeof(before)) == 0,
	      "route socket: groups %#x %#x, were %#x %#x", after[0], after[1], before[0], before[1]);
	CHECK(to_now.nl_pid == to_name.nl_pid, "chosen port id %u, was %u", to_now.nl_pid,
	      to_name.nl_pid);
	CHECK(to_peer.nl_pid == rt_name.nl_pid, "destination %u, was %u", to_peer.nl_pid,
	      rt_name.nl_pid);
	CHECK(ue_now.nl_groups == 1, "uevent socket: groups %#x", ue_now.nl_groups);
	CHECK(get_int(rt, SOL_NETLINK, NETLINK_EXT_ACK) == 1, "lost NETLINK_EXT_ACK");
	CHECK(get_int(rt, SOL_NETLINK, NETLINK_NO_ENOBUFS) == 1, "lost NETLINK_NO_ENOBUFS");
	CHECK(get_int(to, SOL_NETLINK, NETLINK_EXT_ACK) == 0, "gained NETLINK_EXT_ACK");
	CHECK(get_int(diag, SOL_SOCKET, SO_PROTOCOL) == NETLINK_SOCK_DIAG, "diag: protocol %d",
	      get_int(diag, SOL_SOCKET, SO_PROTOCOL));
	CHECK(get_int(ue, SOL_SOCKET, SO_TYPE) == SOCK_DGRAM, "uevent: not datagram");
	victim_write_file("nl-queued", comes(rt, "before", 0) ? "kept" : "dropped");
	send_note(to, "after");
	CHECK(comes(rt, "after", 5000), "a message sent after go did not arrive");
	struct rtgenmsg link = { .rtgen_family = AF_UNSPEC };
	CHECK(ask(rt, RTM_GETLINK, &link, sizeof(link)) > 0, "the kernel did not list the links");
	struct unix_diag_req u = { .sdiag_family = AF_UNIX, .udiag_states = ~0u };
	CHECK(ask(diag, SOCK_DIAG_BY_FAMILY, &u, sizeof(u)) >= 0, "sock_diag did not answer");
	victim_finish();
}

static void dumping(void)
{
	struct rtgenmsg link = { .rtgen_family = AF_UNSPEC };
	int rt = nl_socket(SOCK_RAW, NETLINK_ROUTE);

	if (ask_only(rt, RTM_GETLINK, &link, sizeof(link), 0) != 0)
		die("ask for the links");

	victim_ready_and_wait(NULL);

	CHECK(answer(rt) > 0, "the answer did not come to its end");
	victim_finish();
}

static void admin(void)
{
	struct __user_cap_header_struct h = { .version = _LINUX_CAPABILITY_VERSION_3 };
	struct __user_cap_data_struct d[2];
	int fd = nl_socket(SOCK_DGRAM, NETLINK_SOCK_DIAG);

	nl_bind(fd, 0, 1);
	if (syscall(SYS_capget, &h, d) != 0)
		die("capget");
	d[CAP_NET_ADMIN / 32].effective &= ~(1u << (CAP_NET_ADMIN % 32));
	if (syscall(SYS_capset, &h, d) != 0)
		die("capset");

	victim_ready_and_wait(NULL);

	CHECK(name_of(fd, 0).nl_groups == 1, "left its group");
	victim_finish();
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	const char *mode = argc > 2 ? argv[2] : "";

	if (strcmp(mode, "all") == 0)
		all();
	else if (strcmp(mode, "admin") == 0)
		admin();
	else if (strcmp(mode, "dumping") == 0)
		dumping();
	die("usage: netlink WORKDIR all|dumping|admin");
}
