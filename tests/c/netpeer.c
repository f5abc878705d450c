/*
 * Two processes of a distributed job on two "nodes", talking over one TCP
 * connection: `netpeer server|client WORKDIR ADDR PORT ROUNDS`. In round i
 * the client sends a message (sequence number i, then 4000 bytes that
 * depend on i and on everything received so far) and the server answers
 * with a digest of what it got; each side checks every byte it receives
 * against what the other must have sent. A lost, repeated or reordered
 * byte fails the check. The rounds are paced (1 ms apart) so a checkpoint
 * lands mid-exchange, with bytes in flight both ways. Each side writes
 * WORKDIR/progress-ROLE now and then and, at the end, WORKDIR/result-ROLE:
 * "PASS <digest>" or "FAIL why"; it exits 0 on PASS. Before that it writes
 * WORKDIR/endpoints-ROLE, "LOCAL PEER" as the connection's addresses are at
 * the end (they change when a restart moves the processes to other nodes).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PAYLOAD 4000

static const char *dir, *role;

static void write_file(const char *name, const char *text)
{
	char tmp[4096], dst[4096];
	snprintf(tmp, sizeof tmp, "%s/.%s-%s.tmp", dir, name, role);
	snprintf(dst, sizeof dst, "%s/%s-%s", dir, name, role);
	FILE *f = fopen(tmp, "w");
	if (!f)
		exit(3);
	fputs(text, f);
	fclose(f);
	rename(tmp, dst);
}

static void fail(const char *why)
{
	char buf[256];
	snprintf(buf, sizeof buf, "FAIL %s (errno %d)", why, errno);
	write_file("result", buf);
	exit(1);
}

static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2);
	return h * 0x100000001b3ULL;
}

static void fill(unsigned char *p, uint64_t seed)
{
	for (int i = 0; i < PAYLOAD; i++) {
		seed = mix(seed, (uint64_t)i);
		p[i] = (unsigned char)(seed >> 24);
	}
}

static void io_all(int fd, void *buf, size_t len, int sending)
{
	unsigned char *p = buf;
	while (len > 0) {
		ssize_t n = sending ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			fail(sending ? "send" : "recv");
		p += n;
		len -= (size_t)n;
	}
}

int main(int argc, char **argv)
{
	if (argc < 6)
		return 2;
	role = argv[1];
	dir = argv[2];
	int server = strcmp(role, "server") == 0;
	long rounds = atol(argv[5]);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[4])) };
	if (inet_pton(AF_INET, argv[3], &a.sin_addr) != 1)
		return 2;
	for (int fd = 3; fd < 1024; fd++)
		close(fd);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		fail("socket");
	if (server) {
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 1) != 0)
			fail("listen");
		write_file("listening", "yes");
		int c = accept(fd, NULL, NULL);
		if (c < 0)
			fail("accept");
		close(fd);
		fd = c;
	} else {
		struct timespec pause = { 0, 20 * 1000 * 1000 };
		int tries = 0;
		while (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
			if (++tries > 500)
				fail("connect");
			close(fd);
			fd = socket(AF_INET, SOCK_STREAM, 0);
			nanosleep(&pause, NULL);
		}
	}
	/* Both sides keep the same running digest of the whole exchange. */
	uint64_t digest = 1469598103934665603ULL;
	unsigned char msg[8 + PAYLOAD], want[PAYLOAD];
	struct timespec pace = { 0, 1000 * 1000 };
	for (long i = 0; i < rounds; i++) {
		uint64_t seq;
		if (!server) {
			seq = (uint64_t)i;
			memcpy(msg, &seq, 8);
			fill(msg + 8, mix(digest, seq));
			io_all(fd, msg, sizeof msg, 1);
			digest = mix(digest, mix(seq, msg[8 + PAYLOAD - 1]));
			uint64_t echo;
			io_all(fd, &echo, 8, 0);
			if (echo != digest)
				fail("server's digest differs: a byte was lost, repeated or reordered");
		} else {
			io_all(fd, msg, sizeof msg, 0);
			memcpy(&seq, msg, 8);
			if (seq != (uint64_t)i)
				fail("message out of sequence");
			fill(want, mix(digest, seq));
			if (memcmp(want, msg + 8, PAYLOAD) != 0)
				fail("message bytes differ");
			digest = mix(digest, mix(seq, msg[8 + PAYLOAD - 1]));
			io_all(fd, &digest, 8, 1);
		}
		if (i % 100 == 0) {
			char buf[32];
			snprintf(buf, sizeof buf, "%ld", i);
			write_file("progress", buf);
		}
		nanosleep(&pace, NULL);
	}
	struct sockaddr_in local, peer;
	socklen_t ll = sizeof local, pl = sizeof peer;
	char lbuf[INET_ADDRSTRLEN], pbuf[INET_ADDRSTRLEN], ends[128];
	if (getsockname(fd, (struct sockaddr *)&local, &ll) != 0 ||
	    getpeername(fd, (struct sockaddr *)&peer, &pl) != 0)
		fail("getsockname/getpeername");
	inet_ntop(AF_INET, &local.sin_addr, lbuf, sizeof lbuf);
	inet_ntop(AF_INET, &peer.sin_addr, pbuf, sizeof pbuf);
	snprintf(ends, sizeof ends, "%s:%u %s:%u", lbuf, ntohs(local.sin_port), pbuf,
		 ntohs(peer.sin_port));
	write_file("endpoints", ends);
	char buf[64];
	snprintf(buf, sizeof buf, "PASS %016llx", (unsigned long long)digest);
	write_file("result", buf);
	return 0;
}
