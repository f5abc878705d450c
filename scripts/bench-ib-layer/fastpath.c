/*
 * Per-call cost of the fast-path verbs (ibv_post_send, ibv_post_recv,
 * ibv_poll_cq), as an application calls them: verbs.h's inline functions,
 * which jump through the context's ops table. Run over fake_ibverbs.c
 * alone, that is the provider's cost; with LD_PRELOAD=libckpt_ibverbs.so
 * the application holds the layer's shadow objects and every call goes
 * through the layer's datapath first. scripts/bench-ib-layer.sh runs both.
 *
 *   fastpath [ROUNDS [THREADS]]
 *
 * Each round times a batch of calls of one kind with clock_gettime around
 * the batch; the figure printed per kind is the median over the rounds of
 * ns per call (per request, or per completion, for the chained kinds), so
 * a round preempted by another process does not move it. With THREADS > 1,
 * that many threads run the same rounds at once, each on a QP and CQs of
 * its own in the one context (what a multi-threaded application does), and
 * the figures are the median over every thread's rounds: what is shared
 * between threads on the fast path shows there.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <libgen.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define BATCH 64  /* calls per timed batch, at most the queue depth */
#define CHAIN 16  /* requests per chained post, completions per poll */
#define DEPTH 256

enum { POST_SEND, POST_RECV, POLL_ONE, POLL_EMPTY, POST_SEND_CHAIN, POLL_BATCH, KINDS };
static const char *const names[KINDS] = {
	"post_send", "post_recv", "poll_cq_1", "poll_cq_empty", "post_send_chain16", "poll_cq_16",
};

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void die(const char *what)
{
	fprintf(stderr, "fastpath: %s\n", what);
	exit(1);
}

struct worker {
	struct ibv_qp *qp;
	struct ibv_cq *scq, *rcq;
	uint64_t addr;
	uint32_t lkey;
	long rounds;
	double *samples[KINDS];
	double start, end, cpu;
};

static double thread_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static pthread_barrier_t go;

/* Polls `want` completions, `per_call` at a time, checking they are the
 * next ones of the QP (so a layer that lost or reordered one is caught). */
static void poll_n(struct ibv_cq *cq, struct ibv_qp *qp, int want, int per_call, uint64_t *expect)
{
	struct ibv_wc wc[CHAIN];
	int got = 0;
	while (got < want) {
		int n = ibv_poll_cq(cq, per_call, wc);
		if (n <= 0)
			die("poll_cq returned no completion where one was due");
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS || wc[i].wr_id != (*expect)++ ||
			    wc[i].qp_num != qp->qp_num)
				die("a completion is not the one due");
		}
		got += n;
	}
}

static void *run(void *arg)
{
	struct worker *w = arg;
	struct ibv_qp *qp = w->qp;
	struct ibv_sge sge = { .addr = w->addr, .length = 64, .lkey = w->lkey };
	struct ibv_send_wr swr[CHAIN];
	for (int i = 0; i < CHAIN; i++) {
		swr[i] = (struct ibv_send_wr){
			.sg_list = &sge,
			.num_sge = 1,
			.opcode = IBV_WR_SEND,
			.send_flags = IBV_SEND_SIGNALED,
			.next = i + 1 < CHAIN ? &swr[i + 1] : NULL,
		};
	}
	struct ibv_send_wr one_send = swr[0], *bad_s;
	one_send.next = NULL;
	struct ibv_recv_wr rwr = { .sg_list = &sge, .num_sge = 1 }, *bad_r;
	struct ibv_wc wc[CHAIN];
	uint64_t send_id = 0, recv_id = 0, expect_send = 0, expect_recv = 0;

	pthread_barrier_wait(&go);
	w->start = now_ns();
	double cpu0 = thread_cpu_ns();
	for (long r = -w->rounds / 10; r < w->rounds; r++) { /* the first tenth warms up */
		double t[8];
		t[0] = now_ns();
		for (int i = 0; i < BATCH; i++) {
			one_send.wr_id = send_id++;
			if (ibv_post_send(qp, &one_send, &bad_s))
				die("post_send");
		}
		t[1] = now_ns();
		poll_n(w->scq, qp, BATCH, 1, &expect_send);
		t[2] = now_ns();
		for (int i = 0; i < BATCH; i++) {
			rwr.wr_id = recv_id++;
			if (ibv_post_recv(qp, &rwr, &bad_r))
				die("post_recv");
		}
		t[3] = now_ns();
		poll_n(w->rcq, qp, BATCH, 1, &expect_recv);
		t[4] = now_ns();
		for (int i = 0; i < BATCH; i++)
			if (ibv_poll_cq(w->scq, 1, wc) != 0)
				die("poll_cq found a completion on an empty CQ");
		t[5] = now_ns();
		for (int c = 0; c < BATCH / CHAIN; c++) {
			for (int i = 0; i < CHAIN; i++)
				swr[i].wr_id = send_id++;
			if (ibv_post_send(qp, swr, &bad_s))
				die("post_send (chain)");
		}
		t[6] = now_ns();
		poll_n(w->scq, qp, BATCH, CHAIN, &expect_send);
		t[7] = now_ns();
		if (r < 0)
			continue;
		w->samples[POST_SEND][r] = (t[1] - t[0]) / BATCH;
		w->samples[POLL_ONE][r] = (t[2] - t[1]) / BATCH;
		w->samples[POST_RECV][r] = (t[3] - t[2]) / BATCH;
		w->samples[POLL_EMPTY][r] = (t[5] - t[4]) / BATCH;
		w->samples[POST_SEND_CHAIN][r] = (t[6] - t[5]) / BATCH;
		w->samples[POLL_BATCH][r] = (t[7] - t[6]) / BATCH;
	}
	w->end = now_ns();
	w->cpu = thread_cpu_ns() - cpu0;
	return NULL;
}

int main(int argc, char **argv)
{
	long rounds = argc > 1 ? atol(argv[1]) : 20000;
	int threads = argc > 2 ? atoi(argv[2]) : 1;
	if (rounds < 1 || threads < 1 || threads > 64)
		die("usage: fastpath [ROUNDS [THREADS]]");
	struct ibv_device **devs = ibv_get_device_list(NULL);
	if (!devs || !devs[0])
		die("no device");
	struct ibv_context *ctx = ibv_open_device(devs[0]);
	if (!ctx)
		die("open_device");
	/* Which library the inline verbs jump to: the script checks it is
	 * the layer exactly when the layer is preloaded. */
	Dl_info di;
	if (!dladdr((void *)ctx->ops.post_send, &di) || !di.dli_fname)
		die("post_send is in no loaded object");
	printf("ops_from %s\n", basename((char *)di.dli_fname));
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	static char region[4096];
	struct ibv_mr *mr = pd ? ibv_reg_mr(pd, region, sizeof(region), IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!mr)
		die("pd or mr");
	struct worker *ws = calloc((size_t)threads, sizeof(*ws));
	if (!ws)
		die("calloc");
	for (int t = 0; t < threads; t++) {
		struct worker *w = &ws[t];
		w->rounds = rounds;
		w->addr = (uintptr_t)region;
		w->lkey = mr->lkey;
		w->scq = ibv_create_cq(ctx, 2 * DEPTH, NULL, NULL, 0);
		w->rcq = ibv_create_cq(ctx, 2 * DEPTH, NULL, NULL, 0);
		if (!w->scq || !w->rcq)
			die("create_cq");
		struct ibv_qp_init_attr ia = {
			.send_cq = w->scq,
			.recv_cq = w->rcq,
			.cap = { .max_send_wr = DEPTH, .max_recv_wr = DEPTH, .max_send_sge = 1, .max_recv_sge = 1 },
			.qp_type = IBV_QPT_RC,
		};
		if (!(w->qp = ibv_create_qp(pd, &ia)))
			die("create_qp");
		for (int k = 0; k < KINDS; k++)
			if (!(w->samples[k] = malloc(sizeof(double) * (size_t)rounds)))
				die("malloc");
	}
	pthread_t *tids = calloc((size_t)threads, sizeof(*tids));
	if (!tids)
		die("calloc");
	if (pthread_barrier_init(&go, NULL, (unsigned)threads))
		die("pthread_barrier_init");
	for (int t = 0; t < threads; t++)
		if (pthread_create(&tids[t], NULL, run, &ws[t]))
			die("pthread_create");
	for (int t = 0; t < threads; t++)
		pthread_join(tids[t], NULL);
	/* How much of the run the threads spent running at the same time (1:
	 * all of it; 1/THREADS: they took turns): on a loaded machine they may
	 * share one CPU, and then nothing is contended. Their CPU time over
	 * THREADS times the run's length says it; the run's wall-clock span
	 * alone would not. */
	double first_start = ws[0].start, last_end = ws[0].end, cpu = 0;
	for (int t = 0; t < threads; t++) {
		first_start = ws[t].start < first_start ? ws[t].start : first_start;
		last_end = ws[t].end > last_end ? ws[t].end : last_end;
		cpu += ws[t].cpu;
	}
	printf("parallel %.2f\n", cpu / ((double)threads * (last_end - first_start)));
	size_t all = (size_t)rounds * (size_t)threads;
	double *merged = malloc(sizeof(double) * all);
	if (!merged)
		die("malloc");
	for (int k = 0; k < KINDS; k++) {
		for (int t = 0; t < threads; t++)
			memcpy(merged + (size_t)t * (size_t)rounds, ws[t].samples[k], sizeof(double) * (size_t)rounds);
		qsort(merged, all, sizeof(double), cmp_double);
		printf("%s %.1f\n", names[k], merged[all / 2]);
	}
	for (int t = 0; t < threads; t++)
		if (ibv_destroy_qp(ws[t].qp) || ibv_destroy_cq(ws[t].scq) || ibv_destroy_cq(ws[t].rcq))
			die("teardown");
	if (ibv_dereg_mr(mr) || ibv_dealloc_pd(pd) || ibv_close_device(ctx))
		die("teardown");
	ibv_free_device_list(devs);
	return 0;
}
