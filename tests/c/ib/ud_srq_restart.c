/*
 * UD with address handles, and an SRQ shared by two RC QPs, across
 * in-place restarts of the verbs state driven through libckpt_ibverbs.so's
 * ckpt_ib_* interface (as rc_restart.c does for RC).
 *
 *   ud_srq_restart [DEVICE [ROUNDS [--pause DIR]]]   (defaults: rxe0, 4; run
 *                                       with LD_PRELOAD=libckpt_ibverbs.so;
 *                                       --pause: ckpt does the restarts)
 *
 * UD: QP U1 sends datagrams to QP U2 through an address handle made
 * before the first restart; U2's completions must name U1's QP number as
 * the program knows it (src_qp), and every datagram must arrive once, in
 * order. SRQ: RC QPs A1->B1 and A2->B2, B1 and B2 receiving from one
 * SRQ that has fewer receives posted than messages are coming (the rest
 * wait on RNR); each round restarts with messages in flight, then posts
 * the missing receives. Every message must arrive exactly once, on the
 * QP it was sent to, with its payload.
 *
 * Ends with "ud_srq_restart: ok rounds=N ud=U srq=S" or
 * "ud_srq_restart: FAIL ...".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define QKEY 0x11111111
#define MSG_BYTES 64
#define GRH_BYTES 40
#define SLOTS 64
#define CQ_DEPTH 128
#define TIMEOUT_SEC 20
#define UD_PER_ROUND 3
#define SRQ_PER_ROUND 3 /* per RC QP */
#define SRQ_EARLY 2     /* receives on the SRQ when a round starts */


static void fail(const char *fmt, ...)
{
	va_list ap;
	printf("ud_srq_restart: FAIL ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(1);
}

#include "ib_loopback.h"

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq; /* one CQ for everything */
static union ibv_gid gid;
static uint8_t gid_index;
static uint8_t *buf; /* send slots, then receive slots */
static struct ibv_mr *mr;

#define SEND_AT(i) (buf + ((i) % SLOTS) * MSG_BYTES)
#define RECV_AT(i) (buf + SLOTS * MSG_BYTES + ((i) % SLOTS) * (MSG_BYTES + GRH_BYTES))
#define BUF_BYTES (SLOTS * MSG_BYTES + SLOTS * (MSG_BYTES + GRH_BYTES))

static struct ibv_qp *make_qp(enum ibv_qp_type type, struct ibv_srq *srq)
{
	struct ibv_qp_init_attr init = {
		.send_cq = cq, .recv_cq = cq, .srq = srq, .qp_type = type,
		.cap = { .max_send_wr = 16, .max_recv_wr = srq ? 0 : 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	if (!qp)
		fail("create_qp: %s", strerror(errno));
	return qp;
}

static void ud_up(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = PORT_NUM, .qkey = QKEY };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		fail("UD INIT: %s", strerror(errno));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		fail("UD RTR: %s", strerror(errno));
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0x42;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		fail("UD RTS: %s", strerror(errno));
}

static void rc_up(struct ibv_qp *qp, uint32_t remote)
{
	connect_rc(qp, remote, &gid, gid_index, 0x99, 0);
}

/* A message: its stream (0 = UD, 1, 2 = the RC pairs) and sequence. */
struct tag {
	uint32_t stream;
	uint32_t seq;
};

static uint64_t slot_next;

static void fill(uint8_t *m, struct tag t)
{
	memcpy(m, &t, sizeof(t));
	for (int i = sizeof(t); i < MSG_BYTES; i++)
		m[i] = (uint8_t)(t.stream * 7 + t.seq * 13 + i);
}

static void post_send(struct ibv_qp *qp, struct ibv_ah *ah, uint32_t remote_qpn, struct tag t)
{
	uint8_t *m = SEND_AT(slot_next++);
	fill(m, t);
	struct ibv_sge sge = { .addr = (uintptr_t)m, .length = MSG_BYTES, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = ((uint64_t)t.stream << 32) | t.seq, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad;
	if (ah) {
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = remote_qpn;
		wr.wr.ud.remote_qkey = QKEY;
	}
	if (ibv_post_send(qp, &wr, &bad))
		fail("post_send stream %u: %s", t.stream, strerror(errno));
}

static uint64_t recv_next;

static void post_recv(struct ibv_qp *qp, struct ibv_srq *srq)
{
	uint64_t i = recv_next++;
	struct ibv_sge sge = { .addr = (uintptr_t)RECV_AT(i), .length = MSG_BYTES + GRH_BYTES, .lkey = mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = 0x8000000000000000ULL | (i % SLOTS), .sg_list = &sge, .num_sge = 1 },
			   *bad;
	int rc = srq ? ibv_post_srq_recv(srq, &wr, &bad) : ibv_post_recv(qp, &wr, &bad);
	if (rc)
		fail("post_recv: %s", strerror(rc));
}

static struct ibv_qp *u1, *u2, *a1, *a2, *b1, *b2;
static struct ibv_srq *srq;
static struct ibv_ah *ah;
static uint32_t u1_qpn, u2_qpn, b1_qpn, b2_qpn;
static uint32_t sent[3], got[3], sends_done, sends_posted, srq_posted;

static void reap(void)
{
	struct ibv_wc wc[16];
	int n;
	while ((n = ibv_poll_cq(cq, 16, wc)) > 0) {
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS)
				fail("completion wr %" PRIx64 ": %s", wc[i].wr_id, ibv_wc_status_str(wc[i].status));
			if (!(wc[i].opcode & IBV_WC_RECV)) {
				if (++sends_done > sends_posted)
					fail("more send completions than sends (duplicate)");
				continue;
			}
			uint8_t *r = RECV_AT(wc[i].wr_id & 0xffff);
			if (wc[i].qp_num == u2_qpn) {
				if (wc[i].src_qp != u1_qpn)
					fail("UD datagram from qp %u, not %u (the sender as the program knows it)",
					     wc[i].src_qp, u1_qpn);
				r += GRH_BYTES;
			} else if (wc[i].qp_num != b1_qpn && wc[i].qp_num != b2_qpn) {
				fail("receive on qp %u, which is none of the program's", wc[i].qp_num);
			}
			struct tag t;
			memcpy(&t, r, sizeof(t));
			uint32_t want_stream = wc[i].qp_num == u2_qpn ? 0 : wc[i].qp_num == b1_qpn ? 1 : 2;
			uint8_t want[MSG_BYTES];
			fill(want, t);
			if (t.stream != want_stream)
				fail("stream %u message arrived on stream %u's QP", t.stream, want_stream);
			if (memcmp(want, r, MSG_BYTES) != 0)
				fail("stream %u message %u corrupted", t.stream, t.seq);
			if (t.seq != got[t.stream])
				fail("stream %u: got message %u, expected %u (%s)", t.stream, t.seq, got[t.stream],
				     t.seq < got[t.stream] ? "duplicate" : "lost");
			got[t.stream]++;
		}
	}
	if (n < 0)
		fail("poll_cq: %d", n);
}

static void restart(int round)
{
	struct drain_report rep = { 0 };
	if (!pause_for_ckpt(round))
		restart_in_place(round % 2 ? 20 : 0, &rep);
	if (u1->qp_num != u1_qpn || u2->qp_num != u2_qpn || b1->qp_num != b1_qpn || b2->qp_num != b2_qpn)
		fail("a QP number the program holds changed");
	printf("round %d: drained %" PRIu64 " completions, %" PRIu64 " sends outstanding\n", round,
	       rep.completions, rep.outstanding_sends);
	fflush(stdout);
}

static void wait_all(void)
{
	time_t deadline = time(NULL) + TIMEOUT_SEC;
	while (got[0] < sent[0] || got[1] < sent[1] || got[2] < sent[2] || sends_done < sends_posted) {
		while (srq_posted < sent[1] + sent[2]) {
			post_recv(NULL, srq);
			srq_posted++;
		}
		reap();
		if (time(NULL) > deadline)
			fail("waiting: UD %u/%u, RC1 %u/%u, RC2 %u/%u, sends %u/%u", got[0], sent[0], got[1], sent[1],
			     got[2], sent[2], sends_done, sends_posted);
	}
}

int main(int argc, char **argv)
{
	const char *dev = argc > 1 ? argv[1] : "rxe0";
	int rounds = argc > 2 ? atoi(argv[2]) : 4;
	parse_pause(argc, argv, 3);
	if (!ckpt_ib_checkpoint || !ckpt_ib_restart_local || !ckpt_ib_restart_connect)
		fail("libckpt_ibverbs.so is not preloaded");
	ctx = open_loopback(dev, &gid, &gid_index);
	pd = ibv_alloc_pd(ctx);
	cq = pd ? ibv_create_cq(ctx, CQ_DEPTH, NULL, NULL, 0) : NULL;
	buf = aligned_alloc(4096, (BUF_BYTES + 4095) / 4096 * 4096);
	mr = cq && buf ? ibv_reg_mr(pd, buf, BUF_BYTES, IBV_ACCESS_LOCAL_WRITE) : NULL;
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 32, .max_sge = 1 } };
	srq = mr ? ibv_create_srq(pd, &sa) : NULL;
	if (!srq)
		fail("setup: %s", strerror(errno));
	u1 = make_qp(IBV_QPT_UD, NULL);
	u2 = make_qp(IBV_QPT_UD, NULL);
	ud_up(u1);
	ud_up(u2);
	struct ibv_ah_attr aa = { .is_global = 1, .port_num = PORT_NUM,
				  .grh = { .dgid = gid, .sgid_index = gid_index, .hop_limit = 1 } };
	ah = ibv_create_ah(pd, &aa);
	if (!ah)
		fail("create_ah: %s", strerror(errno));
	a1 = make_qp(IBV_QPT_RC, NULL);
	a2 = make_qp(IBV_QPT_RC, NULL);
	b1 = make_qp(IBV_QPT_RC, srq);
	b2 = make_qp(IBV_QPT_RC, srq);
	rc_up(a1, b1->qp_num);
	rc_up(b1, a1->qp_num);
	rc_up(a2, b2->qp_num);
	rc_up(b2, a2->qp_num);
	u1_qpn = u1->qp_num;
	u2_qpn = u2->qp_num;
	b1_qpn = b1->qp_num;
	b2_qpn = b2->qp_num;
	for (int round = 0; round < rounds; round++) {
		/* UD is unreliable: every datagram has its receive before it is sent. */
		for (int i = 0; i < UD_PER_ROUND; i++)
			post_recv(u2, NULL);
		for (int i = 0; i < SRQ_EARLY; i++, srq_posted++)
			post_recv(NULL, srq);
		for (int i = 0; i < UD_PER_ROUND; i++, sends_posted++)
			post_send(u1, ah, u2_qpn, (struct tag){ 0, sent[0]++ });
		for (int i = 0; i < SRQ_PER_ROUND; i++, sends_posted += 2) {
			post_send(a1, NULL, 0, (struct tag){ 1, sent[1]++ });
			post_send(a2, NULL, 0, (struct tag){ 2, sent[2]++ });
		}
		restart(round);
		/* The SRQ gets the rest of this round's receives in wait_all. */
		wait_all();
	}
	struct ibv_qp *qps[] = { u1, u2, a1, a2, b1, b2 };
	for (size_t i = 0; i < sizeof(qps) / sizeof(qps[0]); i++)
		MUST(ibv_destroy_qp(qps[i]));
	MUST(ibv_destroy_ah(ah));
	MUST(ibv_destroy_srq(srq));
	MUST(ibv_dereg_mr(mr));
	MUST(ibv_destroy_cq(cq));
	MUST(ibv_dealloc_pd(pd));
	MUST(ibv_close_device(ctx));
	printf("ud_srq_restart: ok rounds=%d ud=%u srq=%u\n", rounds, got[0], got[1] + got[2]);
	return 0;
}
