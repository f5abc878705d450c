/*
 * UNIX socket victim. Before the dump the root builds, then forks (the
 * child keeps the second end of each cross-process pair):
 *   - STREAM pair, several writes queued each way (the child end has
 *     SO_PEEK_OFF 2 set; the root end SO_PASSCRED, forced buffer sizes,
 *     receive and send timeouts, and a dup at DUP_FD);
 *   - DGRAM pair, messages of 1, 300 and 70000 bytes queued each way (the
 *     root end O_NONBLOCK);
 *   - SEQPACKET pair, messages of 5, 0x1000 and 100000 bytes each way;
 *   - SHUT pair (stream): the root wrote "bye" and shut its sending side;
 *   - LOCAL pair (stream, both ends in the root) with data both ways;
 *   - LONE: a datagram socket neither bound nor connected.
 *   - WIDOW (stream) and DWIDOW (datagram): one end of a pair whose other
 *     end wrote a last message and closed;
 *   - SRV: a stream listener bound to WORKDIR/srv.sock (mode 0640,
 *     backlog 7) with one connection accepted (ACC, its client in the
 *     child) and one pending (client in the child);
 *   - ABS: a seqpacket listener on an abstract name with a pending
 *     connection from the root itself (client at a lower fd than ABS);
 *   - GONE: a listener bound to WORKDIR/gone.sock, then unlinked;
 *   - BOUND: a datagram socket bound to WORKDIR/dgram.sock, with two
 *     datagrams queued from DC, a datagram socket connected to it one way
 *     (held by the child), which sends a third after go.
 * After go each side reads back every queued byte and message boundary
 * exactly, checks the attributes and the socket owner (its own fsuid),
 * then the root and the child play ping-pong over every cross-process
 * pair; the root reaps the child (exit 0 = all its checks passed).
 *
 * `unix WORKDIR inflight`: a stream pair whose queue holds messages with
 * fds (SCM_RIGHTS) no fd of the tree holds: a pipe's read end, a regular
 * file, one end of a socket pair, then the pipe end and the file again;
 * after go each arrives with its message, the same open file as before.
 * `unix WORKDIR inflight_dgram`: a datagram pair with a pipe end in flight,
 * an empty datagram and another; a stream and a seqpacket socket never
 * connected; a seqpacket socket whose peer closed after sending. After go
 * every datagram arrives as it was.
 * `unix WORKDIR creds`: a datagram carrying a pipe end sent before
 * SO_PASSCRED, then a child's datagram queued on the socket with
 * SO_PASSCRED; after go the first still has no credentials and the
 * second the child's.
 * `unix WORKDIR nested`: a socket in flight with a pipe end in flight on
 * it; after go both arrive, the pipe end still the pipe's and the socket
 * still its pair's other end.
 * `unix WORKDIR outside`: a stream socket whose peer is held by an
 * orphaned grandchild (outside the tree); the dump must be refused, and
 * after go the pair still works both ways.
 * `unix WORKDIR pendingdata`: on a stream listener two connections
 * pending, the first having sent data in two writes, the second nothing;
 * on an abstract seqpacket listener one that sent two records. After go
 * the listener accepts them in order, each with its data and boundaries,
 * and each still talks with its client both ways. With `refused` also an
 * out-of-band byte queued on a pair, which fails every dump.
 * `unix WORKDIR names`: a listener whose path was unlinked, with a
 * connection pending that sent data, and a new listener at that path; a
 * bound datagram socket with a datagram queued, a socket connected to it
 * one way and a bound one with a datagram queued for itself connected to
 * it one way, its path unlinked; a datagram pair both bound and connected
 * both ways, one path unlinked, a datagram queued each way. After go each
 * keeps its name, the unlinked paths stay gone, the pending connection
 * is the old listener's, the path leads to the new one, and every queued
 * datagram arrives.
 * `unix WORKDIR oob`: a stream pair with "abc", an out-of-band "X" and
 * "def" queued; the dump must be refused, and after go the reader still
 * gets "abc", the urgent byte, then "def".
 * `unix WORKDIR netns`: a socket pair made in a network namespace of its
 * own (unshare, as root); after go (in whatever namespace the restore put
 * it) the pair still carries bytes.
 * `unix WORKDIR listen [UID]`: only a listener at WORKDIR/srv.sock (its
 * socket file given to UID); after go it still has its name (and owner)
 * and serves a new connection.
 */
#include "victim.h"

#include <poll.h>
#include <sched.h>
#include <stddef.h>
#include <sys/un.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>

#define DUP_FD 40
#define PENDING_CLIENT_FD 45
#define ABS_FD 50
#define SOCK_MODE 0640
#define BACKLOG 7
#define OTHER_GID 4242
#define SNDBUF_SET 300000
#define RCVBUF_SET 123456
#define PEEK_OFF_SET 2
#define ROUNDS 3

static const size_t dgram_sizes[] = { 1, 300, 70000 };
static const size_t seq_sizes[] = { 5, 0x1000, 100000 };
#define NMSG 3

static const char root_stream[] = "root-to-child: first write|second write|third";
static const char child_stream[] = "child-to-root: 1|22|333|4444";

static unsigned char msgbuf[200000], expect[200000];

/* Receive one message or stream chunk, waiting up to 5 s. */
static ssize_t recv_wait(int fd, void *buf, size_t len, int flags)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	if (poll(&p, 1, 5000) != 1)
		return -2;
	return recv(fd, buf, len, flags | MSG_DONTWAIT);
}

/* Read exactly len stream bytes and compare them. */
static int read_stream(int fd, const char *want, size_t len)
{
	size_t got = 0;
	while (got < len) {
		ssize_t n = recv_wait(fd, msgbuf + got, len - got, 0);
		if (n <= 0)
			return 0;
		got += (size_t)n;
	}
	return memcmp(msgbuf, want, len) == 0;
}

/* Queued messages of sizes[] with pattern seed base+i: each must come back
 * whole, in order, and nothing after. Returns a failure reason or NULL. */
static const char *read_messages(int fd, const size_t *sizes, uint64_t base)
{
	for (int i = 0; i < NMSG; i++) {
		ssize_t n = recv_wait(fd, msgbuf, sizeof(msgbuf), MSG_TRUNC);
		if (n < 0)
			return "message missing";
		if ((size_t)n != sizes[i])
			return "message boundary or size changed";
		fill_pattern(expect, sizes[i], base + i);
		if (memcmp(msgbuf, expect, sizes[i]) != 0)
			return "message contents changed";
	}
	if (recv(fd, msgbuf, sizeof(msgbuf), MSG_DONTWAIT) >= 0)
		return "extra message queued";
	return NULL;
}

static void send_messages(int fd, const size_t *sizes, uint64_t base)
{
	for (int i = 0; i < NMSG; i++) {
		fill_pattern(msgbuf, sizes[i], base + i);
		if (send(fd, msgbuf, sizes[i], 0) != (ssize_t)sizes[i])
			die("send message");
	}
}

static int owned_by_me(int fd)
{
	struct stat st;
	return fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_uid == geteuid();
}

static int sock_int(int fd, int opt)
{
	int v = -12345;
	socklen_t len = sizeof(v);
	if (getsockopt(fd, SOL_SOCKET, opt, &v, &len) != 0)
		return -12345;
	return v;
}

static long timeo_us(int fd, int opt)
{
	struct timeval tv = { 0, 0 };
	socklen_t len = sizeof(tv);
	if (getsockopt(fd, SOL_SOCKET, opt, &tv, &len) != 0)
		return -1;
	return tv.tv_sec * 1000000L + tv.tv_usec;
}

/* Ping-pong: one side sends "ping N", the other answers "pong N". */
static int ping(int fd, int round)
{
	char m[32], r[32], want[32];
	int n = snprintf(m, sizeof(m), "ping %d", round);
	snprintf(want, sizeof(want), "pong %d", round);
	if (send(fd, m, (size_t)n, MSG_NOSIGNAL) != n)
		return 0;
	ssize_t got = recv_wait(fd, r, sizeof(r), 0);
	return got == (ssize_t)strlen(want) && memcmp(r, want, (size_t)got) == 0;
}

static int pong(int fd, int round)
{
	char m[32], want[32];
	int n = snprintf(want, sizeof(want), "ping %d", round);
	ssize_t got = recv_wait(fd, m, sizeof(m), 0);
	if (got != n || memcmp(m, want, (size_t)n) != 0)
		return 0;
	n = snprintf(m, sizeof(m), "pong %d", round);
	return send(fd, m, (size_t)n, MSG_NOSIGNAL) == n;
}

static char srv_path[PATH_MAX], gone_path[PATH_MAX], dgram_path[PATH_MAX];
static char abs_name[64];

static socklen_t unix_addr(struct sockaddr_un *a, const char *path, int abstract)
{
	memset(a, 0, sizeof(*a));
	a->sun_family = AF_UNIX;
	if (abstract) {
		size_t n = strlen(path);
		memcpy(a->sun_path + 1, path, n);
		return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
	}
	snprintf(a->sun_path, sizeof(a->sun_path), "%s", path);
	return sizeof(*a);
}

static int listener(int type, const char *path, int abstract)
{
	struct sockaddr_un a;
	socklen_t len = unix_addr(&a, path, abstract);
	int s = socket(AF_UNIX, type, 0);
	if (s < 0 || bind(s, (struct sockaddr *)&a, len) || listen(s, BACKLOG))
		die("listener");
	return s;
}

static int connect_to(int type, const char *path, int abstract)
{
	struct sockaddr_un a;
	socklen_t len = unix_addr(&a, path, abstract);
	int s = socket(AF_UNIX, type, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, len))
		die("connect");
	return s;
}

/* getsockname is the path (or abstract name) it was bound to. */
static int named(int fd, const char *path, int abstract)
{
	struct sockaddr_un want, got;
	socklen_t wlen = unix_addr(&want, path, abstract), glen = sizeof(got);
	memset(&got, 0, sizeof(got));
	if (getsockname(fd, (struct sockaddr *)&got, &glen))
		return 0;
	if (abstract)
		return glen == wlen && memcmp(&got, &want, wlen) == 0;
	return strcmp(got.sun_path, want.sun_path) == 0;
}

static int accept_wait(int l)
{
	struct pollfd p = { .fd = l, .events = POLLIN };
	if (poll(&p, 1, 5000) != 1)
		return -1;
	return accept4(l, NULL, NULL, SOCK_CLOEXEC);
}

static void child(int st, int dg, int sq, int sh, int pend, int acc_client, int dc)
{
	while (!victim_file_exists("go")) {
		victim_tick();
		if (victim_timespec_passed(&victim_deadline))
			_exit(90);
	}
	if (!owned_by_me(st) || !owned_by_me(dg))
		_exit(91);
	if (sock_int(st, SO_PEEK_OFF) != PEEK_OFF_SET)
		_exit(92);
	if (sock_int(st, SO_TYPE) != SOCK_STREAM || sock_int(sq, SO_TYPE) != SOCK_SEQPACKET)
		_exit(93);
	if (!read_stream(st, root_stream, sizeof(root_stream)))
		_exit(94);
	if (read_messages(dg, dgram_sizes, 100))
		_exit(95);
	if (read_messages(sq, seq_sizes, 300))
		_exit(96);
	/* The root shut its sending side after "bye": then end of file. */
	if (!read_stream(sh, "bye", 3) || recv_wait(sh, msgbuf, 1, 0) != 0)
		_exit(97);
	for (int i = 0; i < ROUNDS; i++)
		if (!pong(st, i) || !pong(dg, i) || !pong(sq, i))
			_exit(98);
	/* The pending connection, accepted by the root after the restore. */
	if (send(pend, "pending-hello", 13, MSG_NOSIGNAL) != 13 || !read_stream(pend, "pending-welcome", 15))
		_exit(100);
	struct sockaddr_un peer;
	socklen_t plen = sizeof(peer);
	/* Connected through the listener again: its name is the peer's. */
	if (getpeername(acc_client, (struct sockaddr *)&peer, &plen) || strcmp(peer.sun_path, srv_path) != 0)
		_exit(104);
	for (int i = 0; i < ROUNDS; i++)
		if (!pong(acc_client, i))
			_exit(101);
	plen = sizeof(peer);
	if (getpeername(dc, (struct sockaddr *)&peer, &plen) || strcmp(peer.sun_path, dgram_path) != 0)
		_exit(102);
	if (send(dc, "dc-after", 8, 0) != 8)
		_exit(103);
	/* The child may still write to the root: only the root's side is shut. */
	if (send(sh, "late", 4, MSG_NOSIGNAL) != 4)
		_exit(99);
	_exit(0);
}

/* Sends `text` on `s` with the fds `fds` (SCM_RIGHTS; none if n == 0). */
static void send_fds(int s, const char *text, size_t len, const int *fds, int n)
{
	char cbuf[CMSG_SPACE(4 * sizeof(int))];
	struct iovec iov = { .iov_base = (void *)text, .iov_len = len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (n > 0) {
		m.msg_control = cbuf;
		m.msg_controllen = CMSG_SPACE(n * sizeof(int));
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(n * sizeof(int));
		memcpy(CMSG_DATA(c), fds, n * sizeof(int));
	}
	if (sendmsg(s, &m, 0) != (ssize_t)len)
		die("sendmsg SCM_RIGHTS");
}

/*
 * Receives one message of `want` bytes into msgbuf with at most 4 fds in
 * `fds`; returns how many fds came (-1 if the message was not that).
 */
static int recv_fds(int s, const char *want, size_t len, int *fds)
{
	char cbuf[CMSG_SPACE(4 * sizeof(int))];
	struct iovec iov = { .iov_base = msgbuf, .iov_len = sizeof(msgbuf) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			    .msg_controllen = sizeof(cbuf) };
	ssize_t got = recvmsg(s, &m, MSG_DONTWAIT);
	if (got != (ssize_t)len || memcmp(msgbuf, want, len) != 0)
		return -1;
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	if (!c || c->cmsg_type != SCM_RIGHTS)
		return 0;
	int n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
	memcpy(fds, CMSG_DATA(c), n * sizeof(int));
	return n;
}

/*
 * A stream pair whose queue holds, in order: a pipe's read end (its write
 * end kept, data buffered), a regular file read to offset 4, one end of a
 * socket pair whose other end is kept (bytes queued for the end in
 * flight), then the pipe's read end and the file again in one message.
 * None of them is held by any fd but the queue's.
 */
static void inflight(void)
{
	int sv[2], pp[2], sp[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) || pipe(pp) ||
	    socketpair(AF_UNIX, SOCK_STREAM, 0, sp))
		die("socketpair/pipe");
	if (write(pp[1], "through the pipe", 16) != 16)
		die("write pipe");
	char path[PATH_MAX];
	victim_path(path, sizeof(path), "inflight.txt");
	int file = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	if (file < 0 || write(file, "0123456789", 10) != 10 || lseek(file, 4, SEEK_SET) != 4)
		die("inflight.txt");
	if (write(sp[1], "to the end in flight", 20) != 20)
		die("write sp");
	send_fds(sv[0], "fd!", 3, &pp[0], 1);
	send_fds(sv[0], "file", 4, &file, 1);
	send_fds(sv[0], "sock", 4, &sp[0], 1);
	int both[2] = { pp[0], file };
	send_fds(sv[0], "both", 4, both, 2);
	close(pp[0]);
	close(file);
	close(sp[0]);

	victim_ready_and_wait(NULL);

	int fds[4] = { -1, -1, -1, -1 };
	int pipe_end, file_fd, sock_end;
	CHECK(recv_fds(sv[1], "fd!", 3, fds) == 1, "message with the pipe end lost");
	pipe_end = fds[0];
	CHECK(pipe_end >= 0 && read(pipe_end, msgbuf, 16) == 16 &&
		      memcmp(msgbuf, "through the pipe", 16) == 0,
	      "the pipe end in flight was lost or changed");
	CHECK(recv_fds(sv[1], "file", 4, fds) == 1, "message with the file lost");
	file_fd = fds[0];
	CHECK(file_fd >= 0 && read(file_fd, msgbuf, 2) == 2 && memcmp(msgbuf, "45", 2) == 0,
	      "the file in flight lost its offset or contents");
	CHECK(recv_fds(sv[1], "sock", 4, fds) == 1, "message with the socket lost");
	sock_end = fds[0];
	CHECK(sock_end >= 0 && recv(sock_end, msgbuf, 20, MSG_DONTWAIT) == 20 &&
		      memcmp(msgbuf, "to the end in flight", 20) == 0,
	      "the socket in flight lost its queue");
	CHECK(sock_end >= 0 && write(sock_end, "back", 4) == 4 &&
		      recv(sp[1], msgbuf, 4, MSG_DONTWAIT) == 4 && memcmp(msgbuf, "back", 4) == 0,
	      "the socket in flight is no longer connected to its peer");
	CHECK(recv_fds(sv[1], "both", 4, fds) == 2, "message with two fds lost");
	/* The same descriptions again: the file's offset is shared. */
	CHECK(read(fds[1], msgbuf, 2) == 2 && memcmp(msgbuf, "67", 2) == 0,
	      "the file sent twice is no longer one open file");
	CHECK(write(pp[1], "x", 1) == 1 && read(fds[0], msgbuf, 1) == 1 && msgbuf[0] == 'x',
	      "the pipe end sent twice is no longer the kept write end's pipe");
	victim_finish();
}

/*
 * A datagram pair with "a" carrying a pipe's read end, an empty datagram
 * and "c"; a socket never bound nor connected of each type; a seqpacket
 * socket whose peer closed after sending "last".
 */
static void inflight_dgram(void)
{
	int dv[2], pp[2], sq[2];
	if (socketpair(AF_UNIX, SOCK_DGRAM, 0, dv) || pipe(pp) ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sq))
		die("socketpair/pipe");
	if (write(pp[1], "p", 1) != 1)
		die("write pipe");
	send_fds(dv[0], "a", 1, &pp[0], 1);
	if (send(dv[0], "", 0, 0) != 0 || send(dv[0], "c", 1, 0) != 1)
		die("send dgram");
	close(pp[0]);
	int lone_stream = socket(AF_UNIX, SOCK_STREAM, 0);
	int lone_seq = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	if (lone_stream < 0 || lone_seq < 0)
		die("socket");
	if (send(sq[0], "last", 4, 0) != 4)
		die("send seqpacket");
	close(sq[0]);

	victim_ready_and_wait(NULL);

	int fds[4] = { -1, -1, -1, -1 };
	CHECK(recv_fds(dv[1], "a", 1, fds) == 1, "datagram with the pipe end lost");
	CHECK(fds[0] >= 0 && read(fds[0], msgbuf, 1) == 1 && msgbuf[0] == 'p',
	      "the pipe end in flight was lost or changed");
	CHECK(recv(dv[1], msgbuf, sizeof(msgbuf), MSG_DONTWAIT) == 0, "the empty datagram was lost");
	CHECK(recv(dv[1], msgbuf, sizeof(msgbuf), MSG_DONTWAIT) == 1 && msgbuf[0] == 'c',
	      "the datagram after the empty one was lost");
	CHECK(recv(dv[1], msgbuf, sizeof(msgbuf), MSG_DONTWAIT) < 0 && errno == EAGAIN,
	      "more datagrams than were sent");
	int type = 0;
	socklen_t tlen = sizeof(type);
	CHECK(getsockopt(lone_stream, SOL_SOCKET, SO_TYPE, &type, &tlen) == 0 && type == SOCK_STREAM,
	      "the lone stream socket is gone");
	CHECK(getsockopt(lone_seq, SOL_SOCKET, SO_TYPE, &type, &tlen) == 0 && type == SOCK_SEQPACKET,
	      "the lone seqpacket socket is gone");
	CHECK(recv(sq[1], msgbuf, sizeof(msgbuf), MSG_DONTWAIT) == 4 && memcmp(msgbuf, "last", 4) == 0,
	      "the message of the closed seqpacket peer was lost");
	CHECK(recv(sq[1], msgbuf, sizeof(msgbuf), MSG_DONTWAIT) == 0,
	      "the seqpacket socket whose peer closed does not read its end");
	victim_finish();
}

/*
 * A child sends a datagram to the parent's socket, which has SO_PASSCRED:
 * after restore the parent still sees the child's pid, uid and gid.
 */
static void creds(void)
{
	int dv[2], pp[2];
	if (socketpair(AF_UNIX, SOCK_DGRAM, 0, dv) || pipe(pp))
		die("socketpair/pipe");
	/* Sent before SO_PASSCRED: no credentials, and a pipe end in flight. */
	send_fds(dv[0], "pre", 3, &pp[0], 1);
	close(pp[0]);
	int on = 1;
	if (setsockopt(dv[1], SOL_SOCKET, SO_PASSCRED, &on, sizeof(on)))
		die("SO_PASSCRED");
	pid_t kid = fork();
	if (kid < 0)
		die("fork");
	if (kid == 0) {
		if (send(dv[0], "cred", 4, 0) != 4)
			_exit(100);
		victim_child_wait_go(101);
		_exit(0);
	}
	/* The child's datagram is queued before ready. */
	struct pollfd pfd = { .fd = dv[1], .events = POLLIN };
	if (poll(&pfd, 1, 10000) != 1)
		die("poll");

	victim_ready_and_wait(NULL);

	char cbuf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int))];
	struct iovec iov = { .iov_base = msgbuf, .iov_len = sizeof(msgbuf) };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf,
			    .msg_controllen = sizeof(cbuf) };
	struct ucred u = { 0 };
	int fd_in_flight = -1;
	CHECK(recvmsg(dv[1], &m, MSG_DONTWAIT) == 3 && memcmp(msgbuf, "pre", 3) == 0,
	      "the datagram sent before SO_PASSCRED was lost");
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_type == SCM_CREDENTIALS)
			memcpy(&u, CMSG_DATA(c), sizeof(u));
		if (c->cmsg_type == SCM_RIGHTS)
			memcpy(&fd_in_flight, CMSG_DATA(c), sizeof(int));
	}
	/* The kernel's "no credentials": pid 0, the overflow ids. */
	CHECK(u.pid == 0, "the datagram sent before SO_PASSCRED is credited to pid %d", (int)u.pid);
	CHECK(fd_in_flight >= 0 && write(pp[1], "q", 1) == 1 && read(fd_in_flight, msgbuf, 1) == 1 &&
		      msgbuf[0] == 'q',
	      "the pipe end in flight with it was lost");
	m.msg_controllen = sizeof(cbuf);
	u.pid = 0;
	CHECK(recvmsg(dv[1], &m, MSG_DONTWAIT) == 4 && memcmp(msgbuf, "cred", 4) == 0,
	      "the child's datagram was lost");
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	if (c && c->cmsg_type == SCM_CREDENTIALS)
		memcpy(&u, CMSG_DATA(c), sizeof(u));
	CHECK(u.pid == kid && u.uid == getuid() && u.gid == getgid(),
	      "the datagram's credentials are pid %d uid %u gid %u, not the child's %d", (int)u.pid,
	      u.uid, u.gid, (int)kid);
	victim_check_child(kid, "sender");
	victim_finish();
}

/* A socket in flight that has an fd in flight itself: refused by name. */
static void nested(void)
{
	int outer[2], inner[2], pp[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, outer) || socketpair(AF_UNIX, SOCK_STREAM, 0, inner) ||
	    pipe(pp))
		die("socketpair/pipe");
	send_fds(inner[1], "p", 1, &pp[0], 1);
	send_fds(outer[0], "s", 1, &inner[0], 1);
	close(inner[0]);
	close(pp[0]);

	victim_ready_and_wait(NULL);

	int fds[4] = { -1, -1, -1, -1 };
	CHECK(recv_fds(outer[1], "s", 1, fds) == 1, "message with the socket lost");
	int in = fds[0];
	CHECK(in >= 0 && recv_fds(in, "p", 1, fds) == 1, "message in the socket in flight lost");
	int rd = fds[0];
	CHECK(rd >= 0 && write(pp[1], "z", 1) == 1 && read(rd, msgbuf, 1) == 1 && msgbuf[0] == 'z',
	      "the pipe end in flight in the socket in flight is not the pipe's");
	CHECK(in >= 0 && write(inner[1], "w", 1) == 1 && read_stream(in, "w", 1),
	      "the socket in flight is no longer its pair's other end");
	victim_finish();
}

static void outside(void)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		die("socketpair");
	pid_t kid = fork();
	if (kid < 0)
		die("fork");
	if (kid == 0) {
		/* The grandchild is reparented away: outside the dumped tree. */
		if (fork() == 0) {
			close(sv[0]);
			alarm(VICTIM_LIFETIME_SEC);
			/* Block until the first ping (after go), then answer. */
			if (recv(sv[1], msgbuf, 1, MSG_PEEK) != 1)
				_exit(1);
			for (int i = 0; i < ROUNDS; i++)
				if (!pong(sv[1], i))
					_exit(1);
			_exit(0);
		}
		_exit(0);
	}
	close(sv[1]);
	int status;
	if (waitpid(kid, &status, 0) != kid)
		die("waitpid");

	victim_ready_and_wait(NULL);

	for (int i = 0; i < ROUNDS; i++)
		CHECK(ping(sv[0], i), "ping-pong with the outside peer %d", i);
	victim_finish();
}

static void pendingdata(int with_refused)
{
	/* Something every dump refuses (an out-of-band byte queued), so a
	 * dump with --kill fails after the unix sockets are linked. */
	int sv[2];
	if (with_refused && (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) || send(sv[0], "X", 1, MSG_OOB) != 1))
		die("out-of-band byte");
	victim_path(srv_path, sizeof(srv_path), "srv.sock");
	snprintf(abs_name, sizeof(abs_name), "ckpt-unix-test-pd-%d", (int)getpid());
	int srv = listener(SOCK_STREAM, srv_path, 0);
	int sq = listener(SOCK_SEQPACKET, abs_name, 1);
	/* Two connections pending in order: the first sent data in two
	 * writes, the second nothing; a seqpacket one sent two records. */
	int c1 = connect_to(SOCK_STREAM, srv_path, 0);
	int c2 = connect_to(SOCK_STREAM, srv_path, 0);
	int cs = connect_to(SOCK_SEQPACKET, abs_name, 1);
	if (write(c1, "early", 5) != 5 || write(c1, "-more", 5) != 5 || send(cs, "one", 3, 0) != 3 ||
	    send(cs, "second", 6, 0) != 6)
		die("write before accept");

	victim_ready_and_wait(NULL);

	int conn1 = accept_wait(srv);
	CHECK(conn1 >= 0 && read_stream(conn1, "early-more", 10), "the data sent before accept was lost");
	CHECK(conn1 >= 0 && write(conn1, "reply", 5) == 5 && read_stream(c1, "reply", 5),
	      "the first client no longer hears the connection it opened");
	CHECK(conn1 >= 0 && write(c1, "late", 4) == 4 && read_stream(conn1, "late", 4),
	      "the first client can no longer send on its connection");
	int conn2 = accept_wait(srv);
	CHECK(conn2 >= 0 && write(c2, "two", 3) == 3 && read_stream(conn2, "two", 3),
	      "the second pending connection (no data) is not the next accepted");
	struct pollfd more = { .fd = srv, .events = POLLIN };
	CHECK(poll(&more, 1, 100) == 0, "a third connection appeared on the listener");
	int sconn = accept_wait(sq);
	char rec[16];
	CHECK(sconn >= 0 && recv_wait(sconn, rec, sizeof(rec), 0) == 3 && memcmp(rec, "one", 3) == 0,
	      "the first record sent before accept");
	CHECK(sconn >= 0 && recv_wait(sconn, rec, sizeof(rec), 0) == 6 && memcmp(rec, "second", 6) == 0,
	      "the second record sent before accept");
	CHECK(sconn >= 0 && send(sconn, "ok", 2, 0) == 2 && recv_wait(cs, rec, sizeof(rec), 0) == 2,
	      "the seqpacket client no longer hears its connection");
	victim_finish();
}

static int bound_dgram(const char *path)
{
	struct sockaddr_un a;
	socklen_t len = unix_addr(&a, path, 0);
	int s = socket(AF_UNIX, SOCK_DGRAM, 0);
	if (s < 0 || bind(s, (struct sockaddr *)&a, len))
		die("bound datagram socket");
	return s;
}

static int gone(const char *path)
{
	struct stat st;
	return lstat(path, &st) != 0 && errno == ENOENT;
}

static void names(void)
{
	char old_path[PATH_MAX], dg_path[PATH_MAX], a_path[PATH_MAX], b_path[PATH_MAX];
	victim_path(old_path, sizeof(old_path), "old.sock");
	victim_path(dg_path, sizeof(dg_path), "dg.sock");
	victim_path(a_path, sizeof(a_path), "pair-a.sock");
	victim_path(b_path, sizeof(b_path), "pair-b.sock");
	/* A listener with a pending connection (which sent data), its path
	 * unlinked, then a new listener at the same path. */
	int old = listener(SOCK_STREAM, old_path, 0);
	int c = connect_to(SOCK_STREAM, old_path, 0);
	if (write(c, "hi", 2) != 2 || unlink(old_path))
		die("unlinked listener");
	int fresh = listener(SOCK_STREAM, old_path, 0);
	/* A bound datagram socket with a datagram queued, a socket connected
	 * to it one way, then its path unlinked. */
	int d = bound_dgram(dg_path);
	int dc = connect_to(SOCK_DGRAM, dg_path, 0);
	/* A bound datagram socket with a datagram queued for it, connected
	 * one way to the same one. */
	char own_path[PATH_MAX];
	victim_path(own_path, sizeof(own_path), "own.sock");
	int own = bound_dgram(own_path);
	struct sockaddr_un ao, ad;
	socklen_t lo = unix_addr(&ao, own_path, 0), ld = unix_addr(&ad, dg_path, 0);
	if (sendto(d, "for-own", 7, 0, (struct sockaddr *)&ao, lo) != 7 ||
	    connect(own, (struct sockaddr *)&ad, ld))
		die("own datagram socket");
	if (send(dc, "q1", 2, 0) != 2 || unlink(dg_path))
		die("unlinked datagram socket");
	/* A datagram pair, both bound, connected both ways, one name
	 * unlinked, a datagram queued each way. */
	int pa = bound_dgram(a_path), pb = bound_dgram(b_path);
	struct sockaddr_un aa, ab;
	socklen_t la = unix_addr(&aa, a_path, 0), lb = unix_addr(&ab, b_path, 0);
	if (connect(pa, (struct sockaddr *)&ab, lb) || connect(pb, (struct sockaddr *)&aa, la) ||
	    send(pa, "to-b", 4, 0) != 4 || send(pb, "to-a", 4, 0) != 4 || unlink(b_path))
		die("bound pair");

	victim_ready_and_wait(NULL);

	CHECK(named(old, old_path, 0) && sock_int(old, SO_ACCEPTCONN) == 1, "unlinked listener lost its name");
	int conn = accept_wait(old);
	CHECK(conn >= 0 && read_stream(conn, "hi", 2), "the unlinked listener's pending connection");
	CHECK(conn >= 0 && write(conn, "yo", 2) == 2 && read_stream(c, "yo", 2),
	      "the client of the unlinked listener no longer hears its connection");
	struct pollfd more = { .fd = fresh, .events = POLLIN };
	CHECK(poll(&more, 1, 100) == 0, "the new listener at the path got the old one's connection");
	int c2 = connect_to(SOCK_STREAM, old_path, 0);
	int conn2 = accept_wait(fresh);
	CHECK(conn2 >= 0 && write(c2, "new", 3) == 3 && read_stream(conn2, "new", 3),
	      "the path no longer leads to the new listener");

	char buf[16];
	CHECK(named(d, dg_path, 0) && gone(dg_path), "unlinked datagram socket: name or path");
	CHECK(recv_wait(d, buf, sizeof(buf), 0) == 2 && memcmp(buf, "q1", 2) == 0, "datagram queued before");
	CHECK(send(dc, "q2", 2, 0) == 2 && recv_wait(d, buf, sizeof(buf), 0) == 2 && memcmp(buf, "q2", 2) == 0,
	      "the one-way socket no longer reaches the unlinked one");
	struct sockaddr_un got;
	socklen_t glen = sizeof(got);
	CHECK(getpeername(dc, (struct sockaddr *)&got, &glen) == 0 && strcmp(got.sun_path, dg_path) == 0,
	      "the one-way socket's peer name");
	CHECK(named(own, own_path, 0), "the bound one-way socket lost its name");
	CHECK(recv_wait(own, buf, sizeof(buf), 0) == 7 && memcmp(buf, "for-own", 7) == 0,
	      "the datagram queued for the bound one-way socket");
	CHECK(send(own, "o2", 2, 0) == 2 && recv_wait(d, buf, sizeof(buf), 0) == 2 && memcmp(buf, "o2", 2) == 0,
	      "the bound one-way socket no longer reaches the unlinked one");

	CHECK(named(pa, a_path, 0) && named(pb, b_path, 0), "the bound pair lost its names");
	CHECK(!gone(a_path) && gone(b_path), "the bound pair's paths: one linked, one unlinked");
	CHECK(recv_wait(pb, buf, sizeof(buf), 0) == 4 && memcmp(buf, "to-b", 4) == 0, "datagram queued for b");
	CHECK(recv_wait(pa, buf, sizeof(buf), 0) == 4 && memcmp(buf, "to-a", 4) == 0, "datagram queued for a");
	glen = sizeof(got);
	CHECK(getpeername(pa, (struct sockaddr *)&got, &glen) == 0 && strcmp(got.sun_path, b_path) == 0,
	      "a's peer name");
	CHECK(send(pa, "again", 5, 0) == 5 && recv_wait(pb, buf, sizeof(buf), 0) == 5, "the pair after restore");
	victim_finish();
}

static void oob(void)
{
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) || send(sv[0], "abc", 3, 0) != 3 ||
	    send(sv[0], "X", 1, MSG_OOB) != 1 || send(sv[0], "def", 3, 0) != 3)
		die("out-of-band setup");

	victim_ready_and_wait(NULL);

	char c = 0;
	CHECK(read_stream(sv[1], "abc", 3), "bytes before the mark");
	CHECK(recv(sv[1], &c, 1, MSG_OOB | MSG_DONTWAIT) == 1 && c == 'X', "the urgent byte");
	CHECK(read_stream(sv[1], "def", 3), "bytes after the mark");
	victim_finish();
}

static void netns(void)
{
	int sv[2];
	if (unshare(CLONE_NEWNET) || socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		die("unshare/socketpair");

	victim_ready_and_wait(NULL);

	CHECK(write(sv[0], "ns", 2) == 2 && read_stream(sv[1], "ns", 2), "pair in the namespace broken");
	victim_finish();
}

static void listen_only(int owner)
{
	victim_path(srv_path, sizeof(srv_path), "srv.sock");
	int srv = listener(SOCK_STREAM, srv_path, 0);
	if (owner >= 0 && chown(srv_path, (uid_t)owner, (gid_t)-1))
		die("chown the socket file");

	victim_ready_and_wait(NULL);

	CHECK(named(srv, srv_path, 0), "listener lost its name");
	struct stat st;
	CHECK(owner < 0 || (stat(srv_path, &st) == 0 && st.st_uid == (uid_t)owner),
	      "the socket file's owner is not the one it was given");
	int c = connect_to(SOCK_STREAM, srv_path, 0);
	int conn = accept_wait(srv);
	CHECK(conn >= 0 && write(c, "hi", 2) == 2 && read_stream(conn, "hi", 2), "new connection");
	victim_finish();
}

int main(int argc, char **argv)
{
	int st[2], dg[2], sq[2], sh[2], lo[2];

	victim_init(argc, argv);
	if (argc > 2 && strcmp(argv[2], "inflight") == 0)
		inflight();
	if (argc > 2 && strcmp(argv[2], "inflight_dgram") == 0)
		inflight_dgram();
	if (argc > 2 && strcmp(argv[2], "creds") == 0)
		creds();
	if (argc > 2 && strcmp(argv[2], "nested") == 0)
		nested();
	if (argc > 2 && strcmp(argv[2], "outside") == 0)
		outside();
	if (argc > 2 && strcmp(argv[2], "pendingdata") == 0)
		pendingdata(argc > 3 && strcmp(argv[3], "refused") == 0);
	if (argc > 2 && strcmp(argv[2], "oob") == 0)
		oob();
	if (argc > 2 && strcmp(argv[2], "names") == 0)
		names();
	if (argc > 2 && strcmp(argv[2], "netns") == 0)
		netns();
	if (argc > 2 && strcmp(argv[2], "listen") == 0)
		listen_only(argc > 3 ? atoi(argv[3]) : -1);
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, st) || socketpair(AF_UNIX, SOCK_DGRAM, 0, dg) ||
	    socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sq) || socketpair(AF_UNIX, SOCK_STREAM, 0, sh) ||
	    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, lo))
		die("socketpair");
	int lone = socket(AF_UNIX, SOCK_DGRAM, 0);
	if (lone < 0)
		die("socket");
	int widow[2], dwidow[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, widow) || socketpair(AF_UNIX, SOCK_DGRAM, 0, dwidow) ||
	    write(widow[1], "last words", 10) != 10 || write(dwidow[1], "dgram-last", 10) != 10)
		die("widows");
	close(widow[1]);
	close(dwidow[1]);

	/* Listeners, pending and accepted connections, bound names. */
	victim_path(srv_path, sizeof(srv_path), "srv.sock");
	victim_path(gone_path, sizeof(gone_path), "gone.sock");
	victim_path(dgram_path, sizeof(dgram_path), "dgram.sock");
	snprintf(abs_name, sizeof(abs_name), "ckpt-unix-test-%d", (int)getpid());
	int srv = listener(SOCK_STREAM, srv_path, 0);
	if (chmod(srv_path, SOCK_MODE))
		die("chmod");
	/* As root, a group other than its own: restore gives it back. */
	if (geteuid() == 0 && chown(srv_path, 0, OTHER_GID))
		die("chown");
	struct stat srv_st;
	if (stat(srv_path, &srv_st))
		die("stat");
	int acc_client = connect_to(SOCK_STREAM, srv_path, 0);
	int acc = accept4(srv, NULL, NULL, 0);
	if (acc < 0)
		die("accept");
	int pend = connect_to(SOCK_STREAM, srv_path, 0);
	int abs_l = listener(SOCK_SEQPACKET, abs_name, 1);
	if (dup2(abs_l, ABS_FD) != ABS_FD)
		die("dup2 abs");
	close(abs_l);
	int pc = connect_to(SOCK_SEQPACKET, abs_name, 1);
	if (dup2(pc, PENDING_CLIENT_FD) != PENDING_CLIENT_FD)
		die("dup2 pending client");
	close(pc);
	int gone = listener(SOCK_STREAM, gone_path, 0);
	if (unlink(gone_path))
		die("unlink");
	struct sockaddr_un ba;
	socklen_t blen = unix_addr(&ba, dgram_path, 0);
	int bound = socket(AF_UNIX, SOCK_DGRAM, 0);
	if (bound < 0 || bind(bound, (struct sockaddr *)&ba, blen))
		die("bind dgram");
	int dc = connect_to(SOCK_DGRAM, dgram_path, 0);
	if (send(dc, "dc-1", 4, 0) != 4 || send(dc, "dc-two", 6, 0) != 6)
		die("send to the bound socket");

	/* Queued both ways, in several writes. */
	const char *p = root_stream;
	for (int i = 0; i < 3; i++) {
		size_t part = i < 2 ? sizeof(root_stream) / 3 : sizeof(root_stream) - 2 * (sizeof(root_stream) / 3);
		if (write(st[0], p, part) != (ssize_t)part)
			die("write stream");
		p += part;
	}
	if (write(st[1], child_stream, 10) != 10 ||
	    write(st[1], child_stream + 10, sizeof(child_stream) - 10) != (ssize_t)(sizeof(child_stream) - 10))
		die("write stream back");
	send_messages(dg[0], dgram_sizes, 100);
	send_messages(dg[1], dgram_sizes, 200);
	send_messages(sq[0], seq_sizes, 300);
	send_messages(sq[1], seq_sizes, 400);
	if (write(sh[0], "bye", 3) != 3 || shutdown(sh[0], SHUT_WR))
		die("shutdown");
	if (write(lo[0], "left", 4) != 4 || write(lo[1], "right!", 6) != 6)
		die("write local pair");

	/* Attributes. */
	int one = 1, v;
	struct timeval rcv = { 2, 500000 }, snd = { 1, 250000 };
	if (setsockopt(st[0], SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) ||
	    (v = SNDBUF_SET, setsockopt(st[0], SOL_SOCKET, SO_SNDBUF, &v, sizeof(v))) ||
	    (v = RCVBUF_SET, setsockopt(st[0], SOL_SOCKET, SO_RCVBUF, &v, sizeof(v))) ||
	    setsockopt(st[0], SOL_SOCKET, SO_RCVTIMEO, &rcv, sizeof(rcv)) ||
	    setsockopt(st[0], SOL_SOCKET, SO_SNDTIMEO, &snd, sizeof(snd)) ||
	    (v = PEEK_OFF_SET, setsockopt(st[1], SOL_SOCKET, SO_PEEK_OFF, &v, sizeof(v))))
		die("setsockopt");
	int sndbuf = sock_int(st[0], SO_SNDBUF), rcvbuf = sock_int(st[0], SO_RCVBUF);
	/* Kept in jiffies: read back rounded up to the tick. */
	long rcvtimeo = timeo_us(st[0], SO_RCVTIMEO), sndtimeo = timeo_us(st[0], SO_SNDTIMEO);
	if (rcvtimeo < 2500000 || sndtimeo < 1250000)
		die("timeouts not set");
	if (fcntl(dg[0], F_SETFL, O_NONBLOCK) || dup2(st[0], DUP_FD) != DUP_FD)
		die("fcntl/dup2");

	pid_t kid = fork();
	if (kid < 0)
		die("fork");
	if (kid == 0) {
		close(st[0]);
		close(DUP_FD);
		close(dg[0]);
		close(sq[0]);
		close(sh[0]);
		close(lo[0]);
		close(lo[1]);
		close(lone);
		close(widow[0]);
		close(dwidow[0]);
		close(srv);
		close(acc);
		close(ABS_FD);
		close(PENDING_CLIENT_FD);
		close(gone);
		close(bound);
		child(st[1], dg[1], sq[1], sh[1], pend, acc_client, dc);
	}
	close(dc);
	close(pend);
	close(acc_client);
	close(st[1]);
	close(dg[1]);
	close(sq[1]);
	close(sh[1]);

	victim_ready_and_wait(NULL);

	const char *why;
	CHECK(owned_by_me(st[0]) && owned_by_me(lo[0]) && owned_by_me(lone),
	      "sockets not owned by the process's user");
	CHECK(sock_int(lone, SO_TYPE) == SOCK_DGRAM, "lone socket lost its type");
	CHECK(sock_int(st[0], SO_PASSCRED) == 1, "SO_PASSCRED lost");
	CHECK(sock_int(st[0], SO_SNDBUF) == sndbuf, "SO_SNDBUF %d, want %d", sock_int(st[0], SO_SNDBUF), sndbuf);
	CHECK(sock_int(st[0], SO_RCVBUF) == rcvbuf, "SO_RCVBUF %d, want %d", sock_int(st[0], SO_RCVBUF), rcvbuf);
	CHECK(timeo_us(st[0], SO_RCVTIMEO) == rcvtimeo, "SO_RCVTIMEO %ld, want %ld",
	      timeo_us(st[0], SO_RCVTIMEO), rcvtimeo);
	CHECK(timeo_us(st[0], SO_SNDTIMEO) == sndtimeo, "SO_SNDTIMEO %ld, want %ld",
	      timeo_us(st[0], SO_SNDTIMEO), sndtimeo);
	CHECK(sock_int(st[0], SO_PEEK_OFF) == -1, "SO_PEEK_OFF of the root end changed: %d",
	      sock_int(st[0], SO_PEEK_OFF));
	CHECK(fcntl(dg[0], F_GETFL) & O_NONBLOCK, "O_NONBLOCK lost");
	CHECK(!(fcntl(st[0], F_GETFL) & O_NONBLOCK), "O_NONBLOCK gained");
	CHECK(fcntl(lo[0], F_GETFD) == FD_CLOEXEC && fcntl(st[0], F_GETFD) == 0, "FD_CLOEXEC changed");

	/* The dup shares the description: reading through it drains st[0]. */
	CHECK(read_stream(DUP_FD, child_stream, sizeof(child_stream)), "stream bytes from the child changed");
	CHECK(recv(st[0], msgbuf, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN, "extra stream bytes");
	why = read_messages(dg[0], dgram_sizes, 200);
	CHECK(!why, "dgram: %s", why);
	why = read_messages(sq[0], seq_sizes, 400);
	CHECK(!why, "seqpacket: %s", why);
	CHECK(read_stream(lo[0], "right!", 6) && read_stream(lo[1], "left", 4), "local pair data changed");
	CHECK(write(lo[1], "again", 5) == 5 && read_stream(lo[0], "again", 5), "local pair broken");
	CHECK(send(sh[0], "x", 1, MSG_NOSIGNAL) < 0 && errno == EPIPE, "shut side can still send");

	for (int i = 0; i < ROUNDS; i++) {
		CHECK(ping(st[0], i), "stream ping-pong %d", i);
		CHECK(ping(dg[0], i), "dgram ping-pong %d", i);
		CHECK(ping(sq[0], i), "seqpacket ping-pong %d", i);
	}
	/* Peers that closed: the last data, then end of file / refusal. */
	CHECK(read_stream(widow[0], "last words", 10) && recv(widow[0], msgbuf, 1, MSG_DONTWAIT) == 0,
	      "stream whose peer closed: data or end of file");
	CHECK(send(widow[0], "x", 1, MSG_NOSIGNAL) < 0 && errno == EPIPE, "stream whose peer closed: send");
	CHECK(recv(dwidow[0], msgbuf, sizeof(msgbuf), MSG_DONTWAIT) == 10 && memcmp(msgbuf, "dgram-last", 10) == 0,
	      "datagram whose peer closed: data");
	CHECK(send(dwidow[0], "x", 1, MSG_DONTWAIT) < 0 && errno == ECONNREFUSED,
	      "datagram whose peer closed: send %s", strerror(errno));

	/* The listener on a path: name, socket file, the pending connection. */
	struct stat sst;
	CHECK(named(srv, srv_path, 0), "listener lost its name");
	CHECK(stat(srv_path, &sst) == 0 && S_ISSOCK(sst.st_mode) && (sst.st_mode & 07777) == SOCK_MODE &&
		      sst.st_uid == geteuid() && sst.st_gid == srv_st.st_gid,
	      "socket file %s: mode %o uid %d gid %d, want gid %d", srv_path, sst.st_mode, (int)sst.st_uid,
	      (int)sst.st_gid, (int)srv_st.st_gid);
	CHECK(sock_int(srv, SO_ACCEPTCONN) == 1, "no longer listening");
	int conn = accept_wait(srv);
	CHECK(conn >= 0, "the pending connection is gone: %s", strerror(errno));
	if (conn >= 0) {
		CHECK(read_stream(conn, "pending-hello", 13), "pending connection's data");
		CHECK(send(conn, "pending-welcome", 15, MSG_NOSIGNAL) == 15, "reply on the pending connection");
	}
	CHECK(named(acc, srv_path, 0), "the accepted connection lost the listener's name");
	for (int i = 0; i < ROUNDS; i++)
		CHECK(ping(acc, i), "accepted connection ping-pong %d", i);
	/* A new client is served too. */
	int fresh = connect_to(SOCK_STREAM, srv_path, 0);
	int fc = accept_wait(srv);
	CHECK(fc >= 0 && write(fresh, "new", 3) == 3 && read_stream(fc, "new", 3), "new connection");

	/* The abstract seqpacket listener and its pending client (same process). */
	CHECK(named(ABS_FD, abs_name, 1), "abstract listener lost its name");
	int aconn = accept_wait(ABS_FD);
	CHECK(aconn >= 0, "abstract pending connection gone");
	if (aconn >= 0) {
		CHECK(send(PENDING_CLIENT_FD, "seq", 3, 0) == 3 && recv_wait(aconn, msgbuf, sizeof(msgbuf), 0) == 3,
		      "abstract connection broken");
		CHECK(sock_int(aconn, SO_TYPE) == SOCK_SEQPACKET, "abstract connection type");
	}

	/* Bound, then unlinked: still named, still no file. */
	CHECK(named(gone, gone_path, 0), "unlinked listener lost its name");
	CHECK(access(gone_path, F_OK) != 0 && errno == ENOENT, "unlinked socket file came back");
	CHECK(sock_int(gone, SO_ACCEPTCONN) == 1, "unlinked listener not listening");

	/* The bound datagram socket receives at its path. */
	CHECK(named(bound, dgram_path, 0), "datagram socket lost its name");
	CHECK(recv_wait(bound, msgbuf, sizeof(msgbuf), 0) == 4 && memcmp(msgbuf, "dc-1", 4) == 0 &&
		      recv_wait(bound, msgbuf, sizeof(msgbuf), 0) == 6 && memcmp(msgbuf, "dc-two", 6) == 0,
	      "datagrams queued for the bound socket changed");
	CHECK(recv_wait(bound, msgbuf, sizeof(msgbuf), 0) == 8 && memcmp(msgbuf, "dc-after", 8) == 0,
	      "the one-way client's datagram after the restore");
	int to = socket(AF_UNIX, SOCK_DGRAM, 0);
	CHECK(sendto(to, "to-bound", 8, 0, (struct sockaddr *)&ba, blen) == 8 &&
		      recv_wait(bound, msgbuf, sizeof(msgbuf), 0) == 8 && memcmp(msgbuf, "to-bound", 8) == 0,
	      "datagram to the bound socket");

	int status;
	CHECK(waitpid(kid, &status, 0) == kid, "waitpid: %s", strerror(errno));
	CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child failed: status %#x", status);
	CHECK(read_stream(sh[0], "late", 4), "the child's late write did not arrive");
	victim_finish();
}
