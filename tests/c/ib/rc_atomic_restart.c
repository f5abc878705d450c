/*
 * Exactly once for work that consumes no receive: RDMA fetch-and-adds
 * (and an RDMA write) executed by the responder before a checkpoint whose
 * drain did not see their completions must not be executed again by the
 * restart.
 *
 *   rc_atomic_restart [DEVICE [--pause DIR]]
 *                                  (default rxe0; run with
 *                                   LD_PRELOAD=libckpt_ibverbs.so; --pause:
 *                                   ckpt does the restarts, ib_loopback.h)
 *
 * One process, two RC QPs on the device connected to each other: A does
 * fetch-and-add on a counter in B's memory region. Restart point 1: A has
 * posted ATOMICS signaled fetch-and-adds of 1, the counter shows every
 * one applied, and A has polled none of their completions. Restart point
 * 2: A has posted ATOMICS more, unsignaled, and an unsignaled RDMA write
 * of a mark into B's region, all applied, and nothing after them that
 * would complete. After each restart the counter must be exactly what the
 * program added (a fetch-and-add executed twice adds twice), each signaled
 * fetch-and-add must complete once with a value no other one fetched, and
 * a signaled RDMA read must then find the counter and the mark as they
 * should be.
 *
 * The test sets CKPT_IB_TEST_DRAIN_BLIND_MS so the layer's drain does not
 * see the device's completions at first, as when they come back late.
 *
 * Ends with "rc_atomic_restart: ok counter=N" or "rc_atomic_restart: FAIL ...".
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define ATOMICS 8	     /* fetch-and-adds per restart point */
#define QUEUE_DEPTH 32	     /* more than a point ever has outstanding */
#define MARK 0x6d61726b2d6f6b21ull /* what the RDMA write puts in B's region */
#define WAIT_SEC 30

static void fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	printf("rc_atomic_restart: FAIL ");
	vprintf(fmt, ap);
	printf("\n");
	va_end(ap);
	fflush(stdout);
	exit(1);
}

#include "ib_loopback.h"

/* B's region: what A's atomics and write target. */
struct target {
	uint64_t counter;
	uint64_t mark;
};

/* A's region: what its atomics fetch, the write's source, what the read
 * brings back. */
struct local {
	uint64_t fetched[2 * ATOMICS];
	uint64_t mark;
	struct target seen;
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_cq *cq_a, *cq_b;
static struct ibv_qp *qp_a, *qp_b;
static struct ibv_mr *mr_target, *mr_local;
static struct target target __attribute__((aligned(64)));
static struct local local __attribute__((aligned(64)));

static struct ibv_qp *make_qp(struct ibv_cq *cq)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = QUEUE_DEPTH, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!qp)
		fail("create_qp: %s", strerror(errno));
	return qp;
}

/* Posts one request on A towards B's region. */
static void post_a(enum ibv_wr_opcode op, uint64_t wr_id, unsigned int flags, void *buf, uint32_t len,
		   uint64_t remote)
{
	struct ibv_sge sge = { .addr = (uintptr_t)buf, .length = len, .lkey = mr_local->lkey };
	struct ibv_send_wr wr = {
		.wr_id = wr_id,
		.sg_list = &sge,
		.num_sge = 1,
		.opcode = op,
		.send_flags = flags,
	}, *bad;
	if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = remote;
		wr.wr.atomic.rkey = mr_target->rkey;
		wr.wr.atomic.compare_add = 1;
	} else {
		wr.wr.rdma.remote_addr = remote;
		wr.wr.rdma.rkey = mr_target->rkey;
	}
	int rc = ibv_post_send(qp_a, &wr, &bad);
	if (rc)
		fail("post_send (opcode %d, wr_id %" PRIu64 "): %s", op, wr_id, strerror(rc));
}

/* Waits until B's region shows what the responder executed. */
static void wait_applied(uint64_t counter, uint64_t mark)
{
	time_t deadline = time(NULL) + WAIT_SEC;
	while (__atomic_load_n(&target.counter, __ATOMIC_SEQ_CST) != counter ||
	       __atomic_load_n(&target.mark, __ATOMIC_SEQ_CST) != mark) {
		if (time(NULL) > deadline)
			fail("the responder did not execute the requests: counter %" PRIu64 " of %" PRIu64,
			     target.counter, counter);
		usleep(1000);
	}
}

/* Polls A's CQ for `n` completions; fills `ids` with their wr_ids. */
static void reap_a(int n, uint64_t *ids)
{
	time_t deadline = time(NULL) + WAIT_SEC;
	int got = 0;
	while (got < n) {
		struct ibv_wc wc;
		int k = ibv_poll_cq(cq_a, 1, &wc);
		if (k < 0)
			fail("poll_cq: %d", k);
		if (k == 0) {
			if (time(NULL) > deadline)
				fail("%d of %d completions", got, n);
			usleep(1000);
			continue;
		}
		if (wc.status != IBV_WC_SUCCESS)
			fail("completion wr_id %" PRIu64 ": %s", wc.wr_id, ibv_wc_status_str(wc.status));
		ids[got++] = wc.wr_id;
	}
	struct ibv_wc extra;
	usleep(50000);
	if (ibv_poll_cq(cq_a, 1, &extra) != 0)
		fail("a completion more than requests were signaled (wr_id %" PRIu64 ")", extra.wr_id);
}

/* Reads B's region back through A (a signaled RDMA read, after whatever
 * A has outstanding: RC executes in order) and checks it. */
static void check_target(uint64_t counter, uint64_t mark)
{
	uint64_t id;
	post_a(IBV_WR_RDMA_READ, 1000, IBV_SEND_SIGNALED, &local.seen, sizeof(local.seen), (uintptr_t)&target);
	reap_a(1, &id);
	if (id != 1000)
		fail("the read's completion has wr_id %" PRIu64, id);
	if (local.seen.counter != counter)
		fail("counter %" PRIu64 ", the program added %" PRIu64 ": a fetch-and-add was executed %s",
		     local.seen.counter, counter, local.seen.counter > counter ? "twice" : "never");
	if (local.seen.mark != mark)
		fail("mark %#" PRIx64 ", expected %#" PRIx64, local.seen.mark, mark);
}

/* Restart point `point`: ckpt's (--pause) or in place. */
static void restart(int point)
{
	struct drain_report rep;
	if (!pause_for_ckpt(point))
		restart_in_place(20, &rep);
}

int main(int argc, char **argv)
{
	const char *dev = argc > 1 ? argv[1] : "rxe0";
	parse_pause(argc, argv, 2);
	if (!ckpt_ib_checkpoint || !ckpt_ib_restart_local || !ckpt_ib_restart_connect)
		fail("libckpt_ibverbs.so is not preloaded");
	union ibv_gid gid;
	uint8_t gid_index;
	ctx = open_loopback(dev, &gid, &gid_index);
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		fail("alloc_pd: %s", strerror(errno));
	mr_target = ibv_reg_mr(pd, &target, sizeof(target),
			       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				       IBV_ACCESS_REMOTE_ATOMIC);
	mr_local = ibv_reg_mr(pd, &local, sizeof(local), IBV_ACCESS_LOCAL_WRITE);
	cq_a = ibv_create_cq(ctx, 4 * QUEUE_DEPTH, NULL, NULL, 0);
	cq_b = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	if (!mr_target || !mr_local || !cq_a || !cq_b)
		fail("reg_mr/create_cq: %s", strerror(errno));
	qp_a = make_qp(cq_a);
	qp_b = make_qp(cq_b);
	unsigned int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			      IBV_ACCESS_REMOTE_ATOMIC;
	connect_rc(qp_a, qp_b->qp_num, &gid, gid_index, 0x1234, access);
	connect_rc(qp_b, qp_a->qp_num, &gid, gid_index, 0x1234, access);

	/* Point 1: signaled fetch-and-adds, applied, completions not polled. */
	for (int i = 0; i < ATOMICS; i++)
		post_a(IBV_WR_ATOMIC_FETCH_AND_ADD, (uint64_t)i, IBV_SEND_SIGNALED, &local.fetched[i], 8,
		       (uintptr_t)&target.counter);
	wait_applied(ATOMICS, 0);
	restart(1);
	uint64_t ids[ATOMICS];
	reap_a(ATOMICS, ids);
	check_target(ATOMICS, 0);
	uint64_t seen = 0;
	for (int i = 0; i < ATOMICS; i++) {
		if (ids[i] != (uint64_t)i)
			fail("completion %d has wr_id %" PRIu64, i, ids[i]);
		if (local.fetched[i] >= ATOMICS || seen & (1ull << local.fetched[i]))
			fail("fetch-and-add %d fetched %" PRIu64, i, local.fetched[i]);
		seen |= 1ull << local.fetched[i];
	}
	printf("point 1: counter %" PRIu64 "\n", local.seen.counter);
	fflush(stdout);

	/* Point 2: unsignaled fetch-and-adds and an unsignaled write, applied,
	 * nothing behind them that would complete. */
	for (int i = 0; i < ATOMICS; i++)
		post_a(IBV_WR_ATOMIC_FETCH_AND_ADD, (uint64_t)(ATOMICS + i), 0, &local.fetched[ATOMICS + i], 8,
		       (uintptr_t)&target.counter);
	local.mark = MARK;
	post_a(IBV_WR_RDMA_WRITE, 2 * ATOMICS, 0, &local.mark, sizeof(local.mark), (uintptr_t)&target.mark);
	wait_applied(2 * ATOMICS, MARK);
	restart(2);
	check_target(2 * ATOMICS, MARK);
	printf("point 2: counter %" PRIu64 "\n", local.seen.counter);

	MUST(ibv_destroy_qp(qp_a));
	MUST(ibv_destroy_qp(qp_b));
	MUST(ibv_dereg_mr(mr_target));
	MUST(ibv_dereg_mr(mr_local));
	MUST(ibv_destroy_cq(cq_a));
	MUST(ibv_destroy_cq(cq_b));
	MUST(ibv_dealloc_pd(pd));
	MUST(ibv_close_device(ctx));
	printf("rc_atomic_restart: ok counter=%" PRIu64 "\n", local.seen.counter);
	return 0;
}
