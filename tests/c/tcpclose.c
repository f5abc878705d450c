/*
 * TCP connections closing from both ends, a FIN not yet acknowledged
 * (tests/inet.rs), over 127.0.0.1 and ::1. Each connection's writer fills
 * its reader's small window and its own buffer, so its FIN waits behind
 * unsent bytes and stays unacknowledged until the reader reads.
 *
 *   tcpclose WORKDIR lastack
 *                          the reader shut down writing first (FIN_WAIT2),
 *                          then the writer filled it and shut down too: its
 *                          FIN answers the reader's (LAST_ACK). After go
 *                          the writer is in LAST_ACK again and reads the
 *                          end of the stream at once; the reader reads every
 *                          byte, each checked, then the end of the stream,
 *                          and the writer reaches CLOSE.
 *   tcpclose WORKDIR closing
 *                          the writer filled the reader and shut down first
 *                          (FIN_WAIT1), then the reader shut down: its FIN
 *                          crossed the writer's queued one (CLOSING, the
 *                          reader FIN_WAIT2). After go the writer is in
 *                          CLOSING again and reads the end of the stream at
 *                          once; the reader reads every byte then the end
 *                          of the stream, and the writer's FIN is
 *                          acknowledged (TIME_WAIT, then CLOSE).
 */
#include "victim.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

/* The reader's buffer is kept small so the writer's queue fills. */
#define SMALL_RCVBUF 4096
#define SMALL_SNDBUF 32768
/* The most a writer can queue towards a small reader. */
#define MAX_QUEUED (1 << 20)
/* How long the victim waits for a connection to reach a state. */
#define STATE_WAIT_MS 5000

static inline uint8_t stream_byte(uint64_t n)
{
	uint64_t x = n * 0x9E3779B97F4A7C15ull;

	x ^= x >> 29;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 32;
	return (uint8_t)(x >> 56);
}

static void set_int(int fd, int level, int opt, int val, const char *what)
{
	if (setsockopt(fd, level, opt, &val, sizeof(val)) != 0)
		die(what);
}

static int tcp_state(int fd)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);

	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0)
		die("TCP_INFO");
	return ti.tcpi_state;
}

/* Whether fd reaches one of the TCP states want[0..n] within
 * STATE_WAIT_MS. */
static int reaches(int fd, const int *want, int n)
{
	for (int ms = 0; ms < STATE_WAIT_MS; ms++) {
		int s = tcp_state(fd);

		for (int i = 0; i < n; i++)
			if (s == want[i])
				return 1;
		usleep(1000);
	}
	return 0;
}

static void await_state(int fd, int want, const char *what)
{
	if (!reaches(fd, &want, 1)) {
		errno = ETIMEDOUT;
		die(what);
	}
}

/* A connected pair over the loopback of `family`: *reader with a small
 * receive buffer, *writer non-blocking with a small send buffer. */
static void pair(int family, int *writer, int *reader)
{
	struct sockaddr_storage ss;
	socklen_t len;
	int l = socket(family, SOCK_STREAM, 0);

	if (l < 0)
		die("socket");
	memset(&ss, 0, sizeof(ss));
	if (family == AF_INET6) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;

		a->sin6_family = AF_INET6;
		a->sin6_addr = in6addr_loopback;
		len = sizeof(*a);
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;

		a->sin_family = AF_INET;
		a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		len = sizeof(*a);
	}
	set_int(l, SOL_SOCKET, SO_RCVBUF, SMALL_RCVBUF, "SO_RCVBUF");
	if (bind(l, (struct sockaddr *)&ss, len) != 0 || listen(l, 1) != 0)
		die("bind and listen");
	if (getsockname(l, (struct sockaddr *)&ss, &len) != 0)
		die("getsockname");
	*writer = socket(family, SOCK_STREAM, 0);
	if (*writer < 0)
		die("socket");
	set_int(*writer, SOL_SOCKET, SO_SNDBUF, SMALL_SNDBUF, "SO_SNDBUF");
	if (connect(*writer, (struct sockaddr *)&ss, len) != 0)
		die("connect");
	*reader = accept(l, NULL, NULL);
	if (*reader < 0)
		die("accept");
	close(l);
	if (fcntl(*writer, F_SETFL, fcntl(*writer, F_GETFL) | O_NONBLOCK) != 0)
		die("O_NONBLOCK");
}

/* Writes the stream into `writer` until the reader's window and the
 * writer's buffer are full for good; returns how many bytes it queued. */
static size_t fill(int writer, char *buf)
{
	size_t queued = 0;

	for (size_t i = 0; i < MAX_QUEUED; i++)
		buf[i] = (char)stream_byte(i);
	for (int idle = 0; idle < 2;) {
		ssize_t n = send(writer, buf + queued, MAX_QUEUED - queued, MSG_NOSIGNAL);

		if (n > 0) {
			queued += (size_t)n;
			idle = 0;
		} else if (n < 0 && errno == EAGAIN) {
			/* Until the window closed for good. */
			idle++;
			usleep(20000);
		} else {
			die("fill the writer");
		}
	}
	return queued;
}

/* The reader reads `queued` bytes of the stream, each checked, then the
 * end of the stream. */
static void drain(int reader, char *buf, size_t queued, const char *name)
{
	char b = 0;

	if (victim_read_exact(reader, buf, queued) != 0) {
		fail("%s: read the %zu bytes queued: %s", name, queued, strerror(errno));
		return;
	}
	for (size_t i = 0; i < queued; i++)
		if ((uint8_t)buf[i] != stream_byte(i)) {
			fail("%s: byte %zu lost or changed", name, i);
			return;
		}
	CHECK(recv(reader, &b, 1, 0) == 0, "%s: no end of stream after %zu bytes", name, queued);
}

/* Whether `fd` reads the end of the stream at once (non-blocking). */
static int eof_now(int fd)
{
	char b = 0;

	return recv(fd, &b, 1, MSG_DONTWAIT) == 0;
}

static void lastack(void)
{
	const int families[2] = { AF_INET, AF_INET6 };
	const char *names[2] = { "v4", "v6" };
	int writer[2], reader[2];
	size_t queued[2];
	char *buf = malloc(MAX_QUEUED);

	if (!buf)
		die("malloc");
	for (int f = 0; f < 2; f++) {
		pair(families[f], &writer[f], &reader[f]);
		if (shutdown(reader[f], SHUT_WR) != 0)
			die("shutdown the reader");
		await_state(writer[f], TCP_CLOSE_WAIT, "the writer never got the FIN");
		queued[f] = fill(writer[f], buf);
		if (shutdown(writer[f], SHUT_WR) != 0)
			die("shutdown the writer");
		await_state(writer[f], TCP_LAST_ACK, "the writer never reached LAST_ACK");
	}

	victim_ready_and_wait(NULL);

	for (int f = 0; f < 2; f++) {
		const int closed[1] = { TCP_CLOSE };

		CHECK(tcp_state(writer[f]) == TCP_LAST_ACK, "%s: the writer is in state %d, not LAST_ACK",
		      names[f], tcp_state(writer[f]));
		CHECK(tcp_state(reader[f]) == TCP_FIN_WAIT2,
		      "%s: the reader is in state %d, not FIN_WAIT2", names[f], tcp_state(reader[f]));
		CHECK(eof_now(writer[f]), "%s: the writer does not read the end of the stream",
		      names[f]);
		CHECK(send(writer[f], "x", 1, MSG_NOSIGNAL) < 0 && errno == EPIPE,
		      "%s: the writer still writes", names[f]);
		drain(reader[f], buf, queued[f], names[f]);
		CHECK(reaches(writer[f], closed, 1), "%s: the writer is in state %d, not CLOSE",
		      names[f], tcp_state(writer[f]));
	}
	free(buf);
	victim_finish();
}

static void closing(void)
{
	const int families[2] = { AF_INET, AF_INET6 };
	const char *names[2] = { "v4", "v6" };
	int writer[2], reader[2];
	size_t queued[2];
	char *buf = malloc(MAX_QUEUED);

	if (!buf)
		die("malloc");
	for (int f = 0; f < 2; f++) {
		pair(families[f], &writer[f], &reader[f]);
		queued[f] = fill(writer[f], buf);
		if (shutdown(writer[f], SHUT_WR) != 0)
			die("shutdown the writer");
		await_state(writer[f], TCP_FIN_WAIT1, "the writer never reached FIN_WAIT1");
		if (shutdown(reader[f], SHUT_WR) != 0)
			die("shutdown the reader");
		await_state(writer[f], TCP_CLOSING, "the writer never reached CLOSING");
		await_state(reader[f], TCP_FIN_WAIT2, "the reader never reached FIN_WAIT2");
	}

	victim_ready_and_wait(NULL);

	for (int f = 0; f < 2; f++) {
		const int done[2] = { TCP_TIME_WAIT, TCP_CLOSE };

		CHECK(tcp_state(writer[f]) == TCP_CLOSING, "%s: the writer is in state %d, not CLOSING",
		      names[f], tcp_state(writer[f]));
		CHECK(tcp_state(reader[f]) == TCP_FIN_WAIT2,
		      "%s: the reader is in state %d, not FIN_WAIT2", names[f], tcp_state(reader[f]));
		CHECK(eof_now(writer[f]), "%s: the writer does not read the end of the stream",
		      names[f]);
		drain(reader[f], buf, queued[f], names[f]);
		CHECK(reaches(writer[f], done, 2),
		      "%s: the writer's FIN is not acknowledged (state %d)", names[f],
		      tcp_state(writer[f]));
	}
	free(buf);
	victim_finish();
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	const char *mode = argc > 2 ? argv[2] : "";

	if (strcmp(mode, "lastack") == 0)
		lastack();
	else if (strcmp(mode, "closing") == 0)
		closing();
	errno = EINVAL;
	die("usage: tcpclose WORKDIR lastack|closing");
}
