/*
 * Victim holding an fd ckpt cannot dump (a netlink socket on fd 42 in the
 * middle of a dump the kernel holds for it) next
 * to ordinary memory.  A dump attempt must fail without disturbing it: after
 * go it checks its memory, its full /proc/self/maps, the socket, that no
 * signal was left pending and that nobody traces it.
 */
#include "victim.h"

#include <signal.h>
#include <linux/netlink.h>
#include <sys/socket.h>
#include <linux/rtnetlink.h>

#define SOCK_FD 42
#define BLOB_LEN (3UL << 20)

static char maps_before[1 << 18], maps_after[1 << 18];
static char status_buf[8192];

/* Asks the kernel for every link on netlink socket `fd` and reads none of
 * the answer: the kernel holds the rest of its dump for the socket, which
 * ckpt cannot save. */
static void start_link_dump(int fd)
{
	struct {
		struct nlmsghdr h;
		struct rtgenmsg g;
	} req = { .h = { .nlmsg_len = NLMSG_LENGTH(sizeof(struct rtgenmsg)),
			 .nlmsg_type = RTM_GETLINK,
			 .nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP },
		  .g = { .rtgen_family = AF_UNSPEC } };

	if (send(fd, &req, req.h.nlmsg_len, 0) != (ssize_t)req.h.nlmsg_len)
		die("ask for the links");
}

int main(int argc, char **argv)
{
	unsigned char *blob;
	uint64_t h;
	int s, type = 0;
	socklen_t len = sizeof(type);
	sigset_t pending;
	char *tracer;

	victim_init(argc, argv);
	s = socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE);
	if (s < 0 || dup2(s, SOCK_FD) != SOCK_FD)
		die("socket");
	close(s);
	start_link_dump(SOCK_FD);
	blob = malloc(BLOB_LEN);
	if (!blob)
		die("malloc");
	fill_pattern(blob, BLOB_LEN, 77);
	h = hash_bytes(blob, BLOB_LEN, 5);
	if (read_small_file("/proc/self/maps", maps_before, sizeof(maps_before)) == (size_t)-1)
		die("read maps");

	victim_ready_and_wait(NULL);

	CHECK(hash_bytes(blob, BLOB_LEN, 5) == h, "memory changed");
	read_small_file("/proc/self/maps", maps_after, sizeof(maps_after));
	CHECK(strcmp(maps_before, maps_after) == 0,
	      "/proc/self/maps changed (leftover parasite or lost mapping?)");
	CHECK(getsockopt(SOCK_FD, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_RAW,
	      "fd %d is no longer a raw netlink socket", SOCK_FD);
	sigpending(&pending);
	for (int sig = 1; sig < 65; sig++)
		CHECK(!sigismember(&pending, sig), "signal %d left pending", sig);
	read_small_file("/proc/self/status", status_buf, sizeof(status_buf));
	tracer = strstr(status_buf, "TracerPid:\t");
	CHECK(tracer && strtol(tracer + 11, NULL, 10) == 0, "still traced: %.20s",
	      tracer ? tracer : "no TracerPid line");
	victim_finish();
}
