/*
 * A PMIx client reduced to its link with the server, for
 * tests/pmix_link.rs: `pmix_link WORKDIR URI NSPACE RANK` puts the three
 * PMIx variables a task of `srun --mpi=pmix` has into its own environment
 * (re-executing itself, so /proc/PID/environ holds them), connects to the
 * server at URI (`pmix-server.PID;tcp4://IP:PORT`) and performs the
 * client's connect handshake as libpmix 4 does. Ready, it waits for go
 * without touching the connection; then, on the same fd, it sends the
 * finalize request (libpmix's PMIx_Finalize) and passes if the server
 * answers it with success. Restored after a dump with --pmix-reconnect,
 * that fd must be a connection to the restore's server, already
 * handshaken.
 */
#include "victim.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

/* PMIx_Finalize's command, and the count of one packed before it. */
#define FINALIZE_CMD 5
#define ONE_VALUE 2
#define REQUEST_TAG 1

static void put_string(char *buf, size_t *at, const char *s)
{
	size_t n = strlen(s) + 1;
	memcpy(buf + *at, s, n);
	*at += n;
}

static void put_be32(char *buf, size_t *at, uint32_t v)
{
	uint32_t be = htonl(v);
	memcpy(buf + *at, &be, 4);
	*at += 4;
}

static void read_all(int fd, void *buf, size_t len)
{
	char *p = buf;
	while (len > 0) {
		ssize_t r = read(fd, p, len);
		if (r <= 0)
			die("read from the PMIx server");
		p += r;
		len -= (size_t)r;
	}
}

static int connect_server(const char *uri)
{
	const char *addr = strstr(uri, "tcp4://");
	if (!addr)
		die("URI without tcp4://");
	addr += strlen("tcp4://");
	char host[64];
	const char *colon = strrchr(addr, ':');
	if (!colon || (size_t)(colon - addr) >= sizeof(host))
		die("URI without a port");
	memcpy(host, addr, (size_t)(colon - addr));
	host[colon - addr] = '\0';
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1)) };
	if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		die("inet_pton");
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
		die("connect to the PMIx server");
	return fd;
}

static void handshake(int fd, const char *nspace, uint32_t rank)
{
	char body[512];
	size_t at = 0;
	uint32_t ids[2] = { geteuid(), getegid() };
	put_string(body, &at, "native");
	put_be32(body, &at, sizeof(ids));
	memcpy(body + at, ids, sizeof(ids));
	at += sizeof(ids);
	body[at++] = 0; /* a simple client */
	put_string(body, &at, nspace);
	put_be32(body, &at, rank);
	put_string(body, &at, "4.2.2");
	put_string(body, &at, "v41");
	body[at++] = 1; /* non-described buffers */
	put_string(body, &at, "hash");
	uint32_t header[4] = { (uint32_t)-1, UINT32_MAX, (uint32_t)at, 0 };
	victim_write_all(fd, (const char *)header, sizeof(header));
	victim_write_all(fd, body, at);
	uint32_t reply[2];
	read_all(fd, reply, sizeof(reply));
	CHECK(ntohl(reply[0]) == 0, "handshake status %d", (int)ntohl(reply[0]));
}

static void finalize(int fd)
{
	uint32_t header[4] = { htonl(UINT32_MAX), htonl(REQUEST_TAG), htonl(2), 0 };
	char body[2] = { ONE_VALUE, FINALIZE_CMD };
	victim_write_all(fd, (const char *)header, sizeof(header));
	victim_write_all(fd, body, sizeof(body));
	uint32_t answer[4];
	read_all(fd, answer, sizeof(answer));
	CHECK(ntohl(answer[1]) == REQUEST_TAG, "answer to tag %u", ntohl(answer[1]));
	uint32_t len = ntohl(answer[2]);
	char status[16];
	CHECK(len >= 2 && len <= sizeof(status), "answer of %u bytes", len);
	if (len < 2 || len > sizeof(status))
		return;
	read_all(fd, status, len);
	CHECK(status[0] == ONE_VALUE && status[1] == 0, "finalize status bytes %d %d",
	      status[0], status[1]);
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	if (argc < 5)
		die("usage: pmix_link WORKDIR URI NSPACE RANK");
	if (!getenv("PMIX_NAMESPACE")) {
		setenv("PMIX_SERVER_URI4", argv[2], 1);
		setenv("PMIX_NAMESPACE", argv[3], 1);
		setenv("PMIX_RANK", argv[4], 1);
		execv("/proc/self/exe", argv);
		die("execv");
	}
	int fd = connect_server(getenv("PMIX_SERVER_URI4"));
	handshake(fd, getenv("PMIX_NAMESPACE"), (uint32_t)atoi(getenv("PMIX_RANK")));
	victim_ready_and_wait(NULL);
	finalize(fd);
	victim_finish();
}
