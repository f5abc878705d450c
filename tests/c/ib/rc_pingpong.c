/*
 * RC send/recv ping-pong over a real verbs device (rxe0 in the SoftRoCE VM of
 * scripts/ib-vm.sh): the future victim of the InfiniBand checkpoint tests.
 *
 *   rc_pingpong [DEVICE [MESSAGES [--server PORT | --client PORT [HOST]]]]
 *                                       (defaults: rxe0, 1000)
 *
 * Two processes (parent = client, child = server) each open the device and
 * create a PD, a CQ, an RC QP and a registered buffer; they swap QP numbers,
 * PSNs and GIDs over a socketpair (no network), connect, and then the client
 * sends MESSAGES messages, each waiting for the server's echo.  A message
 * carries a sequence number, a payload derived from it and the payload's
 * checksum; both sides check every message (order, content, checksum) and
 * fold it into a running stream checksum.  Each side ends with
 *
 *   <role>: stream ok messages=N checksum=HEX
 *
 * and exits 0, or prints "<role>: FAIL ..." and exits 1.
 *
 * With --server/--client, one side runs alone and the two swap their
 * endpoints over TCP on PORT (the server's HOST, default 127.0.0.1) instead, closing the connection
 * once connected: two separate process trees (two "nodes" of a job)
 * talking only over verbs.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define PAYLOAD_BYTES 240
#define BUF_BYTES 4096
#define PORT_NUM 1
#define CQ_DEPTH 16
#define POLL_TIMEOUT_SEC 60
#define WR_ID_SEND 1
#define WR_ID_RECV 2
#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL
#define CLIENT_PSN 0x1111
#define SERVER_PSN 0x2222

struct msg {
	uint64_t seq;
	uint64_t payload_sum;
	uint8_t payload[PAYLOAD_BYTES];
};

/* What each side tells the other to connect its QP (over the socketpair). */
struct endpoint {
	uint32_t qp_num;
	uint32_t psn;
	uint8_t gid_index;
	union ibv_gid gid;
};

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *send_mr;
	struct ibv_mr *recv_mr;
	struct msg *send_buf;
	struct msg *recv_buf;
	struct endpoint local;
	uint64_t stream_sum;
	uint64_t sends_posted, sends_done;
	uint64_t recvs_posted, recvs_done;
};

static const char *role = "rc_pingpong";

static void fail(const char *fmt, ...)
{
	va_list ap;
	fprintf(stdout, "%s: FAIL ", role);
	va_start(ap, fmt);
	vfprintf(stdout, fmt, ap);
	va_end(ap);
	fprintf(stdout, "\n");
	fflush(stdout);
	exit(1);
}

static uint64_t fnv(uint64_t h, const void *data, size_t len)
{
	const uint8_t *p = data;
	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= FNV_PRIME;
	}
	return h;
}

/* The payload of message `seq` (the same on both sides, so both can check it). */
static void fill_payload(uint8_t *out, uint64_t seq)
{
	uint64_t x = seq * 0x9e3779b97f4a7c15ULL + 1;
	for (size_t i = 0; i < PAYLOAD_BYTES; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		out[i] = (uint8_t)x;
	}
}

static void check_msg(struct side *s, const struct msg *m, uint64_t want_seq)
{
	uint8_t want[PAYLOAD_BYTES];
	if (m->seq != want_seq)
		fail("message out of order: got seq %" PRIu64 ", want %" PRIu64, m->seq, want_seq);
	fill_payload(want, want_seq);
	if (memcmp(m->payload, want, PAYLOAD_BYTES) != 0)
		fail("message %" PRIu64 ": payload corrupted", want_seq);
	if (fnv(FNV_OFFSET, m->payload, PAYLOAD_BYTES) != m->payload_sum)
		fail("message %" PRIu64 ": checksum mismatch", want_seq);
	s->stream_sum = fnv(s->stream_sum, m, sizeof(*m));
}

static struct ibv_context *open_device(const char *name)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;
	if (!list)
		fail("ibv_get_device_list: %s", strerror(errno));
	for (int i = 0; i < n; i++)
		if (strcmp(ibv_get_device_name(list[i]), name) == 0)
			ctx = ibv_open_device(list[i]);
	ibv_free_device_list(list);
	if (!ctx)
		fail("device %s not found or not openable (%d devices)", name, n);
	return ctx;
}

/* Whether gid is an IPv4-mapped one (::ffff:a.b.c.d). */
static int gid_is_ipv4(const union ibv_gid *gid)
{
	static const uint8_t prefix[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
	return memcmp(gid->raw, prefix, sizeof(prefix)) == 0;
}

/*
 * The port's IPv4-mapped GID, else its first GID that is set (rxe fills
 * its table as addresses appear). IPv4 first: the IPv6 link-local GID can
 * still be tentative (duplicate address detection) right after boot, and
 * connecting through it then times out.
 */
static uint8_t pick_gid(struct ibv_context *ctx, union ibv_gid *gid)
{
	struct ibv_port_attr port;
	static const union ibv_gid zero;
	int first = -1;
	if (ibv_query_port(ctx, PORT_NUM, &port))
		fail("ibv_query_port: %s", strerror(errno));
	if (port.state != IBV_PORT_ACTIVE)
		fail("port %d not active (state %d)", PORT_NUM, port.state);
	for (int i = 0; i < port.gid_tbl_len; i++) {
		if (ibv_query_gid(ctx, PORT_NUM, i, gid))
			continue;
		if (gid_is_ipv4(gid))
			return (uint8_t)i;
		if (first < 0 && memcmp(gid, &zero, sizeof(zero)) != 0)
			first = i;
	}
	if (first < 0)
		fail("no GID set on port %d", PORT_NUM);
	if (ibv_query_gid(ctx, PORT_NUM, first, gid))
		fail("ibv_query_gid %d: %s", first, strerror(errno));
	return (uint8_t)first;
}

static void setup_side(struct side *s, const char *dev, uint32_t psn)
{
	s->ctx = open_device(dev);
	s->pd = ibv_alloc_pd(s->ctx);
	if (!s->pd)
		fail("ibv_alloc_pd: %s", strerror(errno));
	s->cq = ibv_create_cq(s->ctx, CQ_DEPTH, NULL, NULL, 0);
	if (!s->cq)
		fail("ibv_create_cq: %s", strerror(errno));
	s->send_buf = aligned_alloc(BUF_BYTES, BUF_BYTES);
	s->recv_buf = aligned_alloc(BUF_BYTES, BUF_BYTES);
	if (!s->send_buf || !s->recv_buf)
		fail("out of memory");
	/* Two MRs, so the test shows two distinct keys per process. */
	s->send_mr = ibv_reg_mr(s->pd, s->send_buf, BUF_BYTES, IBV_ACCESS_LOCAL_WRITE);
	s->recv_mr = ibv_reg_mr(s->pd, s->recv_buf, BUF_BYTES, IBV_ACCESS_LOCAL_WRITE);
	if (!s->send_mr || !s->recv_mr)
		fail("ibv_reg_mr: %s", strerror(errno));
	struct ibv_qp_init_attr init = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	s->qp = ibv_create_qp(s->pd, &init);
	if (!s->qp)
		fail("ibv_create_qp: %s", strerror(errno));
	s->local.qp_num = s->qp->qp_num;
	s->local.psn = psn;
	s->local.gid_index = pick_gid(s->ctx, &s->local.gid);
	s->stream_sum = FNV_OFFSET;
}

static void post_recv(struct side *s)
{
	struct ibv_sge sge = {
		.addr = (uintptr_t)s->recv_buf, .length = sizeof(struct msg), .lkey = s->recv_mr->lkey,
	};
	struct ibv_recv_wr wr = { .wr_id = WR_ID_RECV, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(s->qp, &wr, &bad))
		fail("ibv_post_recv: %s", strerror(errno));
	s->recvs_posted++;
}

static void connect_qp(struct side *s, const struct endpoint *remote)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT,
		.pkey_index = 0,
		.port_num = PORT_NUM,
		.qp_access_flags = 0,
	};
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		fail("modify_qp INIT: %s", strerror(errno));
	post_recv(s);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = remote->qp_num;
	a.rq_psn = remote->psn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = remote->gid;
	a.ah_attr.grh.sgid_index = s->local.gid_index;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = PORT_NUM;
	if (ibv_modify_qp(s->qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		fail("modify_qp RTR: %s", strerror(errno));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = s->local.psn;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(s->qp, &a,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				  IBV_QP_MAX_QP_RD_ATOMIC))
		fail("modify_qp RTS: %s", strerror(errno));
}

/*
 * Polls until `sends` sends and `recvs` receives have completed in all.  The
 * send and receive completions of one QP share the CQ and their relative
 * order is not guaranteed (an ACK and the peer's next message race), so
 * completions are counted by kind; a completion nobody posted fails.
 */
static void wait_done(struct side *s, uint64_t sends, uint64_t recvs)
{
	time_t deadline = time(NULL) + POLL_TIMEOUT_SEC;
	while (s->sends_done < sends || s->recvs_done < recvs) {
		struct ibv_wc wc;
		int n = ibv_poll_cq(s->cq, 1, &wc);
		if (n < 0)
			fail("ibv_poll_cq: %d", n);
		if (n == 0) {
			if (time(NULL) > deadline)
				fail("waiting %d s for %" PRIu64 " sends and %" PRIu64
				     " receives: %" PRIu64 " and %" PRIu64 " done",
				     POLL_TIMEOUT_SEC, sends, recvs, s->sends_done, s->recvs_done);
			continue;
		}
		if (wc.status != IBV_WC_SUCCESS)
			fail("completion wr %" PRIu64 ": %s", wc.wr_id, ibv_wc_status_str(wc.status));
		if (wc.wr_id == WR_ID_SEND) {
			s->sends_done++;
		} else if (wc.wr_id == WR_ID_RECV) {
			if (wc.byte_len != sizeof(struct msg))
				fail("received %u bytes, expected %zu", wc.byte_len, sizeof(struct msg));
			s->recvs_done++;
		} else {
			fail("completion for unknown wr %" PRIu64, wc.wr_id);
		}
		if (s->sends_done > s->sends_posted || s->recvs_done > s->recvs_posted)
			fail("more completions than work requests (duplicate)");
	}
}

static void send_msg(struct side *s, const struct msg *m)
{
	*s->send_buf = *m;
	struct ibv_sge sge = {
		.addr = (uintptr_t)s->send_buf, .length = sizeof(struct msg), .lkey = s->send_mr->lkey,
	};
	struct ibv_send_wr wr = {
		.wr_id = WR_ID_SEND, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	if (ibv_post_send(s->qp, &wr, &bad))
		fail("ibv_post_send: %s", strerror(errno));
	s->sends_posted++;
}

static void xfer(int fd, void *buf, size_t len, int out)
{
	uint8_t *p = buf;
	while (len > 0) {
		ssize_t n = out ? write(fd, p, len) : read(fd, p, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			fail("endpoint exchange: %s", n == 0 ? "peer closed" : strerror(errno));
		p += n;
		len -= (size_t)n;
	}
}

static int run_side(int is_client, int sock, const char *dev, uint64_t count)
{
	struct side s = { 0 };
	struct endpoint remote;
	setup_side(&s, dev, is_client ? CLIENT_PSN : SERVER_PSN);
	printf("%s: qp_num=%u psn=%u gid_index=%u send_lkey=0x%x recv_lkey=0x%x pd_handle=%u\n", role,
	       s.local.qp_num, s.local.psn, s.local.gid_index, s.send_mr->lkey, s.recv_mr->lkey, s.pd->handle);
	fflush(stdout);
	xfer(sock, &s.local, sizeof(s.local), 1);
	xfer(sock, &remote, sizeof(remote), 0);
	connect_qp(&s, &remote);
	/* Both receive queues must hold a buffer before the first send. */
	char sync = 's';
	xfer(sock, &sync, 1, 1);
	xfer(sock, &sync, 1, 0);
	/* From here on only verbs: the sides may be checkpointed as separate
	 * trees with nothing else between them. */
	close(sock);

	for (uint64_t seq = 0; seq < count; seq++) {
		struct msg m = { .seq = seq };
		if (is_client) {
			fill_payload(m.payload, seq);
			m.payload_sum = fnv(FNV_OFFSET, m.payload, PAYLOAD_BYTES);
			send_msg(&s, &m);
			s.stream_sum = fnv(s.stream_sum, &m, sizeof(m));
			wait_done(&s, seq + 1, seq + 1);
			struct msg echo = *s.recv_buf;
			post_recv(&s);
			check_msg(&s, &echo, seq);
		} else {
			/* The previous echo must be out before its buffer is reused. */
			wait_done(&s, seq, seq + 1);
			m = *s.recv_buf;
			post_recv(&s);
			check_msg(&s, &m, seq);
			send_msg(&s, &m);
			/* Fold the echo too, so both sides' stream sums must agree. */
			s.stream_sum = fnv(s.stream_sum, &m, sizeof(m));
		}
	}
	wait_done(&s, count, count);
	/* No message may be left over (duplicated or unexpected). */
	struct ibv_wc wc;
	if (ibv_poll_cq(s.cq, 1, &wc) != 0)
		fail("unexpected extra completion (wr %" PRIu64 ")", wc.wr_id);
	printf("%s: stream ok messages=%" PRIu64 " checksum=%016" PRIx64 "\n", role, count, s.stream_sum);
	fflush(stdout);
	/* Everything comes down as made (a verb that fails here exits 1). */
	int rc;
	if ((rc = ibv_destroy_qp(s.qp)) || (rc = ibv_dereg_mr(s.send_mr)) ||
	    (rc = ibv_dereg_mr(s.recv_mr)) || (rc = ibv_destroy_cq(s.cq)) ||
	    (rc = ibv_dealloc_pd(s.pd)) || (rc = ibv_close_device(s.ctx)))
		fail("teardown: %s", strerror(rc));
	return 0;
}

/* The endpoint exchange of --server/--client: a TCP connection to the
 * server's host:port (the client retries until the server listens; the
 * server listens on every address). */
static int tcp_side(int is_client, int port, const char *host)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	a.sin_addr.s_addr = htonl(INADDR_ANY);
	if (is_client && inet_pton(AF_INET, host, &a.sin_addr) != 1)
		fail("bad server address %s", host);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	if (fd < 0)
		fail("socket: %s", strerror(errno));
	if (is_client) {
		for (int i = 0; connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0; i++) {
			if (i > 200)
				fail("connect to port %d: %s", port, strerror(errno));
			usleep(50000);
		}
		return fd;
	}
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 1))
		fail("listen on port %d: %s", port, strerror(errno));
	int c = accept(fd, NULL, NULL);
	if (c < 0)
		fail("accept: %s", strerror(errno));
	close(fd);
	return c;
}

int main(int argc, char **argv)
{
	const char *dev = argc > 1 ? argv[1] : "rxe0";
	uint64_t count = argc > 2 ? strtoull(argv[2], NULL, 10) : 1000;
	if (argc > 4) {
		int is_client = strcmp(argv[3], "--client") == 0;
		if (!is_client && strcmp(argv[3], "--server") != 0)
			fail("usage: rc_pingpong DEVICE MESSAGES [--server PORT | --client PORT [HOST]]");
		role = is_client ? "client" : "server";
		fflush(stdout);
		const char *host = argc > 5 ? argv[5] : "127.0.0.1";
		return run_side(is_client, tcp_side(is_client, atoi(argv[4]), host), dev, count);
	}
	int sv[2];
	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		fail("socketpair: %s", strerror(errno));
	fflush(stdout);
	pid_t child = fork();
	if (child < 0)
		fail("fork: %s", strerror(errno));
	if (child == 0) {
		role = "server";
		close(sv[0]);
		return run_side(0, sv[1], dev, count);
	}
	role = "client";
	close(sv[1]);
	run_side(1, sv[0], dev, count);
	int status;
	if (waitpid(child, &status, 0) != child)
		fail("waitpid: %s", strerror(errno));
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		fail("server exited with status 0x%x", status);
	return 0;
}
