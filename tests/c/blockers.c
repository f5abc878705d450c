/*
 * Victim holding three kinds of things ckpt cannot save yet, in two
 * processes: the root two netlink sockets in the middle of a dump the
 * kernel holds for them and a hugetlb memfd, its child
 * a fanotify group it made as root before giving up its effective
 * capabilities (as a daemon dropping privileges would), which ckpt could
 * restore only by lending it CAP_SYS_ADMIN. A dump must list all four fds at once and leave
 * both running; after go the
 * child exits and the root checks its objects still work.
 */
#include "victim.h"

#include <linux/capability.h>
#include <sys/fanotify.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <linux/netlink.h>
#include <sys/socket.h>
#include <linux/rtnetlink.h>
#include <sys/wait.h>

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
	int sv[2];

	victim_init(argc, argv);
	sv[0] = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	sv[1] = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_ROUTE);
	if (sv[0] < 0 || sv[1] < 0)
		die("netlink socket");
	start_link_dump(sv[0]);
	start_link_dump(sv[1]);
	int mfd = memfd_create("ckpt-blocker", MFD_CLOEXEC | MFD_HUGETLB);
	if (mfd < 0)
		die("memfd_create");
	/* The child says when it holds only its own object: ready waits for
	 * that, or a dump could still find the parent's fds in it. */
	int setup[2];
	if (pipe2(setup, O_CLOEXEC))
		die("pipe2");
	pid_t child = fork();
	if (child < 0)
		die("fork");
	if (child == 0) {
		/* Only the fanotify instance in the child: the lists stay exact. */
		close(sv[0]);
		close(sv[1]);
		close(mfd);
		close(setup[0]);
		int in = fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC, O_RDONLY);
		if (in < 0)
			_exit(70);
		struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3 };
		struct __user_cap_data_struct caps[_LINUX_CAPABILITY_U32S_3];
		if (syscall(SYS_capget, &hdr, caps))
			_exit(73);
		for (int i = 0; i < _LINUX_CAPABILITY_U32S_3; i++)
			caps[i].effective = 0;
		if (syscall(SYS_capset, &hdr, caps))
			_exit(74);
		if (write(setup[1], "k", 1) != 1)
			_exit(72);
		close(setup[1]);
		victim_child_wait_go(71);
		_exit(0);
	}
	close(setup[1]);
	char byte;
	if (read(setup[0], &byte, 1) != 1)
		die("child setup");
	close(setup[0]);
	victim_ready_and_wait(NULL);

	int st;
	CHECK(waitpid(child, &st, 0) == child, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed: status %#x", st);
	int type = 0;
	socklen_t len = sizeof(type);
	CHECK(getsockopt(sv[1], SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_DGRAM,
	      "netlink socket broken");
	CHECK(fcntl(mfd, F_GETFD) == FD_CLOEXEC, "memfd broken");
	victim_finish();
}
