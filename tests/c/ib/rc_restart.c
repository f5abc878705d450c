/*
 * Restart of RC verbs state in place, with messages in flight, driven by
 * the program itself through libckpt_ibverbs.so's ckpt_ib_* interface
 * (which ckpt drives in a restored process): the machinery of the shadow
 * layer (drain, recreate, replay, re-post, id translation) tested alone.
 *
 *   rc_restart [DEVICE [ROUNDS [--pause DIR [--hold-malloc]]]]
 *                                  (defaults: rxe0, 6; run with
 *                                   LD_PRELOAD=libckpt_ibverbs.so; --pause:
 *                                   ckpt does the restarts, ib_loopback.h;
 *                                   --hold-malloc: first a restart point 98
 *                                   where a thread holds the C library's
 *                                   malloc lock, which ckpt must refuse to
 *                                   dump, the program going on untouched)
 *
 * One process, two RC QPs on the device connected to each other (rxe
 * loops traffic to its own GIDs back). Each round the sender A posts
 * MSGS sends (unsignaled ones followed by a signaled one), an RDMA write
 * with immediate and an RDMA read, while the receiver B has fewer
 * receives posted than messages are coming (the rest wait on RNR); then
 * the resources are checkpointed and recreated (new QP numbers, keys and
 * CQs on the device; the old ones destroyed) and B posts the missing
 * receives. Every message carries a sequence number: B must see each
 * exactly once, in order, with its payload; A must see each signaled
 * completion exactly once; the RDMA read must bring B's bytes and the
 * write must land in B's buffer. The ids the program holds never change,
 * while `rdma resource show qp` must show the process's QPs under new
 * numbers after every round. A completion channel on A's CQ must keep its
 * descriptor number and still deliver events after the restarts. With
 * --pause, a last restart point (100) has a thread whose read of an event
 * returned but whose ibv_get_cq_event has not: the CQ must still come
 * down after the program acks every event it read.
 *
 * Ends with "rc_restart: ok rounds=N messages=M restarts=R" or
 * "rc_restart: FAIL ...".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <infiniband/verbs.h>

#define MSGS 4		 /* sends per round (the last signaled) */
#define RECVS_EARLY 2	 /* receives B has posted when the round starts */
#define MSG_BYTES 64
#define RDMA_BYTES 256
#define CQ_DEPTH 64
#define POLL_TIMEOUT_SEC 20
#define WR_SEND 0x1000
#define WR_WRITE_IMM 0x2000
#define WR_READ 0x3000
#define WR_RECV 0x4000
#define WR_NOTIFY 0x5000
/* The restart point of the event test (after the rounds'). */
#define EVENT_POINT 99
/* The restart point where malloc's lock is held (before the rounds'). */
#define HELD_POINT 98
/* The restart point where a thread has read an event and not yet come
 * back from ibv_get_cq_event (after the event test's; with --pause). */
#define EVENT_READ_POINT 100


static void fail(const char *fmt, ...)
{
	va_list ap;
	printf("rc_restart: FAIL ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
	exit(1);
}

#include "ib_loopback.h"

struct side {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	uint8_t *buf; /* messages (recv slots or send slots), then the RDMA area */
	struct ibv_mr *mr;
	uint32_t qpn_seen; /* the virtual QP number, which must never change */
	uint32_t lkey_seen, rkey_seen;
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_comp_channel *channel;
static int channel_fd;
static struct side a, b;
static uint8_t gid_index;
static union ibv_gid gid;

#define SLOTS 64
#define BUF_BYTES (SLOTS * MSG_BYTES + 2 * RDMA_BYTES)
#define RDMA_AT (SLOTS * MSG_BYTES)

static void make_side(struct side *s, struct ibv_comp_channel *ch)
{
	s->cq = ibv_create_cq(ctx, CQ_DEPTH, NULL, ch, 0);
	s->buf = aligned_alloc(4096, BUF_BYTES);
	if (!s->cq || !s->buf)
		fail("create_cq/alloc: %s", strerror(errno));
	memset(s->buf, 0, BUF_BYTES);
	s->mr = ibv_reg_mr(pd, s->buf, BUF_BYTES,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	struct ibv_qp_init_attr init = {
		.send_cq = s->cq,
		.recv_cq = s->cq,
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	s->qp = s->mr ? ibv_create_qp(pd, &init) : NULL;
	if (!s->qp)
		fail("reg_mr/create_qp: %s", strerror(errno));
	s->qpn_seen = s->qp->qp_num;
	s->lkey_seen = s->mr->lkey;
	s->rkey_seen = s->mr->rkey;
}

static void connect_to(struct side *s, uint32_t remote_qpn)
{
	connect_rc(s->qp, remote_qpn, &gid, gid_index, 0x77, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
}

static uint64_t recv_slot; /* next receive slot of B */
static uint64_t recvs_posted;

static void post_recv_b(void)
{
	uint64_t slot = recv_slot++ % SLOTS;
	struct ibv_sge sge = { .addr = (uintptr_t)(b.buf + slot * MSG_BYTES), .length = MSG_BYTES, .lkey = b.mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = WR_RECV | slot, .sg_list = &sge, .num_sge = 1 }, *bad;
	if (ibv_post_recv(b.qp, &wr, &bad))
		fail("post_recv: %s", strerror(errno));
	recvs_posted++;
}

static uint64_t next_seq;
static uint64_t signaled_posted, signaled_done;

static void fill_msg(uint8_t *m, uint64_t seq)
{
	memcpy(m, &seq, 8);
	for (int i = 8; i < MSG_BYTES; i++)
		m[i] = (uint8_t)(seq * 31 + i);
}

static void post_sends_a(int round)
{
	struct ibv_send_wr wrs[MSGS + 2], *bad;
	struct ibv_sge sges[MSGS + 2];
	memset(wrs, 0, sizeof(wrs));
	for (int i = 0; i < MSGS; i++) {
		uint64_t seq = next_seq++;
		uint8_t *m = a.buf + (seq % SLOTS) * MSG_BYTES;
		fill_msg(m, seq);
		sges[i] = (struct ibv_sge){ .addr = (uintptr_t)m, .length = MSG_BYTES, .lkey = a.mr->lkey };
		wrs[i] = (struct ibv_send_wr){ .wr_id = WR_SEND | seq, .sg_list = &sges[i], .num_sge = 1,
					       .opcode = IBV_WR_SEND, .next = &wrs[i + 1] };
	}
	wrs[MSGS - 1].send_flags = IBV_SEND_SIGNALED;
	/* An RDMA write with immediate (consumes a receive) of A's RDMA area
	 * into B's, carrying the next sequence number as immediate. */
	uint64_t seq = next_seq++;
	memset(a.buf + RDMA_AT, 0x40 + round, RDMA_BYTES);
	sges[MSGS] = (struct ibv_sge){ .addr = (uintptr_t)(a.buf + RDMA_AT), .length = RDMA_BYTES, .lkey = a.mr->lkey };
	wrs[MSGS] = (struct ibv_send_wr){ .wr_id = WR_WRITE_IMM | seq, .sg_list = &sges[MSGS], .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE_WITH_IMM, .send_flags = IBV_SEND_SIGNALED,
					  .imm_data = htonl((uint32_t)seq), .next = &wrs[MSGS + 1] };
	wrs[MSGS].wr.rdma.remote_addr = (uintptr_t)(b.buf + RDMA_AT);
	wrs[MSGS].wr.rdma.rkey = b.mr->rkey;
	/* An RDMA read of B's second RDMA area (filled with a round pattern). */
	memset(b.buf + RDMA_AT + RDMA_BYTES, 0x80 + round, RDMA_BYTES);
	memset(a.buf + RDMA_AT + RDMA_BYTES, 0, RDMA_BYTES);
	sges[MSGS + 1] = (struct ibv_sge){ .addr = (uintptr_t)(a.buf + RDMA_AT + RDMA_BYTES), .length = RDMA_BYTES,
					   .lkey = a.mr->lkey };
	wrs[MSGS + 1] = (struct ibv_send_wr){ .wr_id = WR_READ | (uint64_t)round, .sg_list = &sges[MSGS + 1],
					      .num_sge = 1, .opcode = IBV_WR_RDMA_READ,
					      .send_flags = IBV_SEND_SIGNALED };
	wrs[MSGS + 1].wr.rdma.remote_addr = (uintptr_t)(b.buf + RDMA_AT + RDMA_BYTES);
	wrs[MSGS + 1].wr.rdma.rkey = b.mr->rkey;
	if (ibv_post_send(a.qp, wrs, &bad))
		fail("post_send: %s", strerror(errno));
	signaled_posted += 3;
}

static uint64_t b_next_seq; /* the sequence number B must see next */
static int read_done_round = -1;

static void reap(int round)
{
	struct ibv_wc wc[8];
	int n;
	while ((n = ibv_poll_cq(b.cq, 8, wc)) > 0) {
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS)
				fail("B completion %s", ibv_wc_status_str(wc[i].status));
			if (wc[i].qp_num != b.qpn_seen)
				fail("B completion names qp %u, not %u", wc[i].qp_num, b.qpn_seen);
			uint64_t slot = wc[i].wr_id & 0xfff, seq;
			if (wc[i].opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
				seq = ntohl(wc[i].imm_data);
				for (int k = 0; k < RDMA_BYTES; k++)
					if (b.buf[RDMA_AT + k] != 0x40 + round)
						fail("RDMA write %" PRIu64 " did not land", seq);
			} else {
				uint8_t want[MSG_BYTES];
				memcpy(&seq, b.buf + slot * MSG_BYTES, 8);
				fill_msg(want, seq);
				if (memcmp(want, b.buf + slot * MSG_BYTES, MSG_BYTES) != 0)
					fail("message %" PRIu64 " corrupted", seq);
			}
			if (seq != b_next_seq)
				fail("B got message %" PRIu64 ", expected %" PRIu64 " (%s)", seq, b_next_seq,
				     seq < b_next_seq ? "duplicate" : "lost");
			b_next_seq++;
		}
	}
	if (n < 0)
		fail("poll B: %d", n);
	while ((n = ibv_poll_cq(a.cq, 8, wc)) > 0) {
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS)
				fail("A completion wr %" PRIx64 ": %s", wc[i].wr_id, ibv_wc_status_str(wc[i].status));
			if (wc[i].qp_num != a.qpn_seen)
				fail("A completion names qp %u, not %u", wc[i].qp_num, a.qpn_seen);
			if ((wc[i].wr_id & 0xf000) == WR_READ) {
				for (int k = 0; k < RDMA_BYTES; k++)
					if (a.buf[RDMA_AT + RDMA_BYTES + k] != 0x80 + round)
						fail("RDMA read brought the wrong bytes");
				read_done_round = round;
			}
			if ((wc[i].wr_id & 0xf000) == WR_NOTIFY)
				continue;
			signaled_done++;
			if (signaled_done > signaled_posted)
				fail("more send completions than signaled sends (duplicate wr %" PRIx64 ")", wc[i].wr_id);
		}
	}
	if (n < 0)
		fail("poll A: %d", n);
}

/* The process's QP numbers as the device shows them (rdma tool). */
static int device_qpns(uint32_t *out, int max)
{
	char line[512];
	FILE *p = popen("rdma resource show qp 2>&1", "r");
	int n = 0;
	while (p && fgets(line, sizeof(line), p)) {
		long qpn = -1, pid = -1;
		char *save = NULL, *tok = strtok_r(line, " \t\n", &save), *prev = NULL;
		for (; tok; prev = tok, tok = strtok_r(NULL, " \t\n", &save)) {
			if (prev && strcmp(prev, "lqpn") == 0)
				qpn = strtol(tok, NULL, 10);
			if (prev && strcmp(prev, "pid") == 0)
				pid = strtol(tok, NULL, 10);
		}
		if (qpn >= 0 && pid == (long)getpid() && n < max)
			out[n++] = (uint32_t)qpn;
	}
	if (p)
		pclose(p);
	return n;
}

static int restarts;

static void restart(int round)
{
	struct drain_report rep = { 0 };
	uint32_t before[8];
	int nb = device_qpns(before, 8);
	/* Odd rounds wait for a quiet window; even ones race the acks. */
	if (!pause_for_ckpt(round))
		restart_in_place((round % 2) ? 20 : 0, &rep);
	restarts++;
	uint32_t after[8];
	int na = device_qpns(after, 8);
	if (na != 2 || nb != 2)
		fail("the device shows %d QPs of this process before and %d after the restart", nb, na);
	for (int i = 0; i < na; i++)
		for (int k = 0; k < nb; k++)
			if (after[i] == before[k])
				fail("qp %u kept its device number across the restart", after[i]);
	if (a.qp->qp_num != a.qpn_seen || b.qp->qp_num != b.qpn_seen || a.mr->lkey != a.lkey_seen ||
	    b.mr->rkey != b.rkey_seen)
		fail("an id the program holds changed");
	printf("round %d: drained %" PRIu64 " completions in %" PRIu64 " us, %" PRIu64
	       " sends outstanding; device qps %u,%u -> %u,%u; program sees %u,%u\n",
	       round, rep.completions, rep.elapsed_us, rep.outstanding_sends, before[0], before[1], after[0],
	       after[1], a.qpn_seen, b.qpn_seen);
	fflush(stdout);
}

static void wait_all(int round)
{
	time_t deadline = time(NULL) + POLL_TIMEOUT_SEC;
	while (b_next_seq < next_seq || signaled_done < signaled_posted || read_done_round != round) {
		if (recvs_posted < next_seq)
			post_recv_b();
		reap(round);
		if (time(NULL) > deadline)
			fail("round %d: B saw %" PRIu64 " of %" PRIu64 " messages, A %" PRIu64 " of %" PRIu64
			     " completions",
			     round, b_next_seq, next_seq, signaled_done, signaled_posted);
	}
}

/* One signaled message of sequence `next_seq` from A to B, with B's
 * receive posted for it. */
static void send_one_a(uint64_t id)
{
	post_recv_b();
	uint8_t *m = a.buf;
	fill_msg(m, next_seq);
	struct ibv_sge sge = { .addr = (uintptr_t)m, .length = MSG_BYTES, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	next_seq++;
	if (ibv_post_send(a.qp, &wr, &bad))
		fail("post_send: %s", strerror(errno));
}

/* A completion channel still works after the restarts, on the same fd. */
static void check_channel(void)
{
	if (channel->fd != channel_fd)
		fail("completion channel fd moved from %d to %d", channel_fd, channel->fd);
	if (ibv_req_notify_cq(a.cq, 0))
		fail("req_notify_cq");
	signaled_posted++;
	send_one_a(WR_SEND | next_seq);
	struct pollfd pfd = { .fd = channel_fd, .events = POLLIN };
	if (poll(&pfd, 1, POLL_TIMEOUT_SEC * 1000) != 1)
		fail("no completion event on fd %d", channel_fd);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	if (ibv_get_cq_event(channel, &ev_cq, &ev_ctx) || ev_cq != a.cq)
		fail("get_cq_event returned another CQ");
	ibv_ack_cq_events(ev_cq, 1);
}

/* Arms A's CQ and sends one message: returns once the completion's event
 * is waiting in the channel (not read). */
static uint64_t send_until_event(void)
{
	if (ibv_req_notify_cq(a.cq, 0))
		fail("req_notify_cq");
	uint64_t id = WR_NOTIFY | next_seq;
	send_one_a(id);
	struct pollfd pfd = { .fd = channel_fd, .events = POLLIN };
	if (poll(&pfd, 1, POLL_TIMEOUT_SEC * 1000) != 1)
		fail("no completion event before the restart");
	return id;
}

/* After a restart that drained send `id`'s completion: its event comes
 * again on the new channel; `acks` events are acked (every one the
 * program read), then the completion is there, once. */
static void event_then_completion(uint64_t id, unsigned int acks)
{
	struct pollfd pfd = { .fd = channel_fd, .events = POLLIN };
	if (poll(&pfd, 1, POLL_TIMEOUT_SEC * 1000) != 1)
		fail("the event of a drained completion did not come again after the restart");
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	if (ibv_get_cq_event(channel, &ev_cq, &ev_ctx) || ev_cq != a.cq)
		fail("get_cq_event after the restart");
	ibv_ack_cq_events(ev_cq, acks);
	struct ibv_wc wc[4];
	int n = ibv_poll_cq(a.cq, 4, wc);
	if (n != 1 || wc[0].wr_id != id || wc[0].status != IBV_WC_SUCCESS)
		fail("after the event: %d completions (want the send's, once)", n);
}

/*
 * A completion whose event is waiting in the channel when the restart
 * drains it: the event must come again on the new channel (the program
 * armed the CQ and will wait for it), then the completion, once.
 */
static void check_event_across_restart(void)
{
	uint64_t id = send_until_event();
	struct drain_report rep = { 0 };
	if (!pause_for_ckpt(EVENT_POINT)) {
		restart_in_place(20, &rep);
		if (rep.completions < 1)
			fail("the drain found no completion on A's CQ");
	}
	event_then_completion(id, 1);
	printf("event across restart: drained %" PRIu64 " completions, the event came again\n",
	       rep.completions);
}

/* Whether thread `tid` is in syscall `nr` (from /proc). */
static int in_syscall(pid_t tid, int nr)
{
	char path[64], text[32] = "";
	snprintf(path, sizeof(path), "/proc/self/task/%d/syscall", tid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, text, sizeof(text) - 1);
	close(fd);
	return n > 0 && atoi(text) == nr;
}

/* Starts thread `fn` (which stores its tid in `*tid`) and waits until it
 * blocks in syscall `nr`. */
static void start_until_in_syscall(pthread_t *t, void *(*fn)(void *), volatile pid_t *tid, int nr,
				   const char *what)
{
	if (pthread_create(t, NULL, fn, NULL))
		fail("pthread_create");
	for (int i = 0; i < POLL_TIMEOUT_SEC * 100 && !(*tid && in_syscall(*tid, nr)); i++)
		usleep(10000);
	if (!*tid || !in_syscall(*tid, nr))
		fail("%s", what);
}

/* The layer's gate (libckpt_ibverbs.so): while non-zero, a thread
 * entering the layer waits. */
extern uint32_t CKPT_IB_GATE __attribute__((weak));

static pthread_t waiter;
static volatile pid_t waiter_tid;
static struct ibv_cq *waiter_cq;

static void *wait_for_event(void *arg)
{
	(void)arg;
	waiter_tid = gettid();
	void *ev_ctx;
	if (ibv_get_cq_event(channel, &waiter_cq, &ev_ctx))
		waiter_cq = NULL;
	return NULL;
}

/*
 * A thread whose read of an event returned just before the freeze, its
 * ibv_get_cq_event not yet back: the event is the old CQ's, which the new
 * one never reported. The program acks every event it read, as
 * rc_pingpong does at its end; the layer must ack on the new CQ only what
 * the new CQ reported, or ibv_destroy_cq (which waits until the two
 * counts are equal) never returns. The layer's gate holds the waiter at
 * that point: the event is queued first, then the gate closed (the main
 * thread calls no verb while it is), then the waiter reads the event and
 * stops where the layer takes it in. Only with --pause: a restart in
 * place opens the gate while it runs.
 */
static void check_event_read_across_restart(void)
{
	if (!pause_dir || !&CKPT_IB_GATE)
		return;
	uint64_t id = send_until_event();
	__atomic_store_n(&CKPT_IB_GATE, 1, __ATOMIC_SEQ_CST);
	start_until_in_syscall(&waiter, wait_for_event, &waiter_tid, 202 /* futex */,
			       "the event's reader never reached the layer's gate");
	pause_for_ckpt(EVENT_READ_POINT);
	if (pthread_join(waiter, NULL) || waiter_cq != a.cq)
		fail("the event read before the restart was not returned");
	/* Both events: the waiter's and the one raised again. */
	event_then_completion(id, 2);
	printf("event read across restart: both events acked\n");
}

static int held_pipe[2] = { -1, -1 };
static int saved_stderr = -1;
static pthread_t held_thread;
static volatile pid_t held_tid;

static void *print_malloc_stats(void *arg)
{
	(void)arg;
	held_tid = gettid();
	malloc_stats();
	return NULL;
}


/* A thread left inside malloc_stats(), which holds the main arena's lock
 * while it writes to stderr: stderr is a full pipe nobody reads. */
static void hold_malloc_lock(void)
{
	if (pipe2(held_pipe, O_CLOEXEC))
		fail("pipe: %s", strerror(errno));
	fcntl(held_pipe[1], F_SETPIPE_SZ, 4096);
	fcntl(held_pipe[1], F_SETFL, O_NONBLOCK);
	char junk[512];
	memset(junk, '.', sizeof(junk));
	while (write(held_pipe[1], junk, sizeof(junk)) > 0)
		;
	fcntl(held_pipe[1], F_SETFL, 0);
	fflush(stderr);
	saved_stderr = fcntl(2, F_DUPFD_CLOEXEC, 3);
	if (saved_stderr < 0 || dup2(held_pipe[1], 2) < 0)
		fail("dup: %s", strerror(errno));
	start_until_in_syscall(&held_thread, print_malloc_stats, &held_tid, 1 /* write */,
			       "the malloc_stats thread never blocked in write");
}

/* Lets the thread finish: stderr back, the pipe drained. */
static void release_malloc_lock(void)
{
	if (dup2(saved_stderr, 2) < 0)
		fail("dup2: %s", strerror(errno));
	close(saved_stderr);
	fcntl(held_pipe[0], F_SETFL, O_NONBLOCK);
	char buf[4096];
	for (int i = 0; i < 1000; i++) {
		while (read(held_pipe[0], buf, sizeof(buf)) > 0)
			;
		if (pthread_tryjoin_np(held_thread, NULL) == 0) {
			close(held_pipe[0]);
			close(held_pipe[1]);
			return;
		}
		usleep(10000);
	}
	fail("the malloc_stats thread did not finish");
}

static void teardown_hung(int sig)
{
	(void)sig;
	static const char msg[] = "rc_restart: FAIL the teardown hung (a CQ's events acked and reported differ)\n";
	ssize_t w = write(1, msg, sizeof(msg) - 1);
	(void)w;
	_exit(1);
}

int main(int argc, char **argv)
{
	const char *dev = argc > 1 ? argv[1] : "rxe0";
	int rounds = argc > 2 ? atoi(argv[2]) : 6;
	parse_pause(argc, argv, 3);
	if (!ckpt_ib_checkpoint || !ckpt_ib_restart_local || !ckpt_ib_restart_connect)
		fail("libckpt_ibverbs.so is not preloaded");
	ctx = open_loopback(dev, &gid, &gid_index);
	pd = ibv_alloc_pd(ctx);
	channel = pd ? ibv_create_comp_channel(ctx) : NULL;
	if (!channel)
		fail("alloc_pd/create_comp_channel: %s", strerror(errno));
	channel_fd = channel->fd;
	make_side(&a, channel);
	make_side(&b, NULL);
	connect_to(&a, b.qp->qp_num);
	connect_to(&b, a.qp->qp_num);
	int hold_malloc = argc > 5 && strcmp(argv[5], "--hold-malloc") == 0;
	if (hold_malloc) {
		hold_malloc_lock();
		if (!pause_for_ckpt(HELD_POINT))
			fail("--hold-malloc needs --pause");
		release_malloc_lock();
		printf("malloc lock held at point %d: the program went on\n", HELD_POINT);
		fflush(stdout);
	}
	for (int round = 0; round < rounds; round++) {
		while (recvs_posted < next_seq + RECVS_EARLY)
			post_recv_b();
		post_sends_a(round);
		restart(round);
		wait_all(round);
	}
	check_channel();
	wait_all(rounds - 1);
	reap(rounds - 1);
	check_event_across_restart();
	if (!hold_malloc)
		check_event_read_across_restart();
	/* B's receive of those messages. */
	time_t deadline = time(NULL) + POLL_TIMEOUT_SEC;
	while (b_next_seq < next_seq && time(NULL) <= deadline)
		reap(rounds - 1);
	if (b_next_seq != next_seq)
		fail("B did not receive the last message");
	/* Everything comes down as made: the layer's own objects on the
	 * application's CQs (the event's kick) must not hold them, and a CQ
	 * whose events were acked more or less often than it reported them
	 * would never be destroyed. */
	fflush(stdout);
	signal(SIGALRM, teardown_hung);
	alarm(POLL_TIMEOUT_SEC);
	MUST(ibv_destroy_qp(a.qp));
	MUST(ibv_destroy_qp(b.qp));
	MUST(ibv_dereg_mr(a.mr));
	MUST(ibv_dereg_mr(b.mr));
	MUST(ibv_destroy_cq(a.cq));
	MUST(ibv_destroy_cq(b.cq));
	MUST(ibv_destroy_comp_channel(channel));
	MUST(ibv_dealloc_pd(pd));
	MUST(ibv_close_device(ctx));
	printf("rc_restart: ok rounds=%d messages=%" PRIu64 " restarts=%d\n", rounds, next_seq, restarts);
	return 0;
}
