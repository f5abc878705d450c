/*
 * A stand-in for libibverbs.so.1 with a provider that needs no device, for
 * scripts/bench-ib-layer.sh (a benchmark, not a test).
 *
 * It exports every entry point the shadow layer resolves with
 * dlvsym(RTLD_NEXT, name, version), under the versions the layer asks for
 * (fake_ibverbs.map), so the layer runs unmodified on top of it. Its
 * "device" completes every request at once: a post pushes the completion
 * the hardware would report on the QP's CQ (sends when signaled, receives
 * as if a message had arrived), and poll_cq pops them. What a verb costs
 * here is the price of a function call and a few stores, so the difference
 * with the layer preloaded is the layer's own work on the fast path.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

struct fake_cq {
	struct ibv_cq cq;
	uint32_t head, len, cap;
	struct ibv_wc *wcs;
};

struct fake_qp {
	struct ibv_qp qp;
	int sq_sig_all;
};

static struct ibv_device fake_device = {
	.node_type = IBV_NODE_CA,
	.transport_type = IBV_TRANSPORT_IB,
	.name = "fake0",
	.dev_name = "uverbs_fake0",
};

static uint32_t next_qpn = 0x11;
static uint32_t next_key = 0x100;

/* Pushes a completion, as the hardware writes a CQE; a full CQ is an
 * overrun (the benchmark never lets it happen). */
static int push_wc(struct ibv_cq *cq, const struct ibv_wc *wc)
{
	struct fake_cq *c = (struct fake_cq *)cq;
	if (c->len == c->cap)
		return ENOMEM;
	c->wcs[(c->head + c->len) % c->cap] = *wc;
	c->len++;
	return 0;
}

static int fake_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct fake_qp *q = (struct fake_qp *)qp;
	for (; wr; wr = wr->next) {
		if (!q->sq_sig_all && !(wr->send_flags & IBV_SEND_SIGNALED))
			continue;
		struct ibv_wc wc = {
			.wr_id = wr->wr_id,
			.status = IBV_WC_SUCCESS,
			.opcode = wr->opcode == IBV_WR_RDMA_WRITE ? IBV_WC_RDMA_WRITE : IBV_WC_SEND,
			.qp_num = qp->qp_num,
		};
		int rc = push_wc(qp->send_cq, &wc);
		if (rc) {
			*bad = wr;
			return rc;
		}
	}
	return 0;
}

static int fake_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	for (; wr; wr = wr->next) {
		struct ibv_wc wc = {
			.wr_id = wr->wr_id,
			.status = IBV_WC_SUCCESS,
			.opcode = IBV_WC_RECV,
			.byte_len = wr->num_sge ? wr->sg_list[0].length : 0,
			.qp_num = qp->qp_num,
			.src_qp = qp->qp_num,
		};
		int rc = push_wc(qp->recv_cq, &wc);
		if (rc) {
			*bad = wr;
			return rc;
		}
	}
	return 0;
}

static int fake_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	(void)srq;
	*bad = wr;
	return EOPNOTSUPP;
}

static int fake_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct fake_cq *c = (struct fake_cq *)cq;
	int got = 0;
	while (got < n && c->len) {
		wc[got++] = c->wcs[c->head];
		c->head = (c->head + 1) % c->cap;
		c->len--;
	}
	return got;
}

static int fake_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	(void)cq;
	(void)solicited_only;
	return 0;
}

struct ibv_device **ibv_get_device_list(int *num)
{
	struct ibv_device **list = calloc(2, sizeof(*list));
	if (!list)
		return NULL;
	list[0] = &fake_device;
	if (num)
		*num = 1;
	return list;
}

void ibv_free_device_list(struct ibv_device **list)
{
	free(list);
}

const char *ibv_get_device_name(struct ibv_device *device)
{
	return device->name;
}

struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct ibv_context *ctx = calloc(1, sizeof(*ctx));
	if (!ctx)
		return NULL;
	ctx->device = device;
	ctx->cmd_fd = -1;
	ctx->async_fd = -1;
	ctx->num_comp_vectors = 1;
	ctx->ops.post_send = fake_post_send;
	ctx->ops.post_recv = fake_post_recv;
	ctx->ops.post_srq_recv = fake_post_srq_recv;
	ctx->ops.poll_cq = fake_poll_cq;
	ctx->ops.req_notify_cq = fake_req_notify_cq;
	return ctx;
}

int ibv_close_device(struct ibv_context *ctx)
{
	free(ctx);
	return 0;
}

int ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
	(void)ctx;
	memset(attr, 0, sizeof(*attr));
	attr->max_qp_wr = 4096;
	attr->max_sge = 4;
	attr->max_cqe = 65536;
	return 0;
}

/* A macro in verbs.h too. The exported symbol fills the old, shorter
 * struct: only its fields are written. */
#undef ibv_query_port
int ibv_query_port(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *compat)
{
	(void)ctx;
	(void)port;
	struct ibv_port_attr *attr = (struct ibv_port_attr *)compat;
	attr->state = IBV_PORT_ACTIVE;
	attr->lid = 1;
	return 0;
}

int ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
	(void)ctx;
	(void)port;
	memset(gid, 0, sizeof(*gid));
	gid->raw[15] = (uint8_t)(index + 1);
	return 0;
}

int ibv_query_pkey(struct ibv_context *ctx, uint8_t port, int index, __be16 *pkey)
{
	(void)ctx;
	(void)port;
	(void)index;
	*pkey = 0xffff;
	return 0;
}

int ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *event)
{
	(void)ctx;
	(void)event;
	errno = EAGAIN;
	return -1;
}

void ibv_ack_async_event(struct ibv_async_event *event)
{
	(void)event;
}

struct ibv_pd *ibv_alloc_pd(struct ibv_context *ctx)
{
	struct ibv_pd *pd = calloc(1, sizeof(*pd));
	if (pd)
		pd->context = ctx;
	return pd;
}

int ibv_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
				unsigned int access)
{
	(void)iova;
	(void)access;
	struct ibv_mr *mr = calloc(1, sizeof(*mr));
	if (!mr)
		return NULL;
	mr->context = pd->context;
	mr->pd = pd;
	mr->addr = addr;
	mr->length = length;
	mr->lkey = next_key++;
	mr->rkey = next_key++;
	return mr;
}

/* verbs.h makes ibv_reg_mr a macro; the symbol is still libibverbs'. */
#undef ibv_reg_mr
struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned int)access);
}

int ibv_dereg_mr(struct ibv_mr *mr)
{
	free(mr);
	return 0;
}

struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *ctx)
{
	struct ibv_comp_channel *ch = calloc(1, sizeof(*ch));
	if (ch) {
		ch->context = ctx;
		ch->fd = -1;
	}
	return ch;
}

int ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	free(ch);
	return 0;
}

struct ibv_cq *ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
			     struct ibv_comp_channel *channel, int comp_vector)
{
	(void)comp_vector;
	struct fake_cq *c = calloc(1, sizeof(*c));
	if (!c)
		return NULL;
	c->cap = cqe > 0 ? (uint32_t)cqe : 1;
	c->wcs = calloc(c->cap, sizeof(*c->wcs));
	if (!c->wcs) {
		free(c);
		return NULL;
	}
	c->cq.context = ctx;
	c->cq.channel = channel;
	c->cq.cq_context = cq_context;
	c->cq.cqe = (int)c->cap;
	return &c->cq;
}

int ibv_destroy_cq(struct ibv_cq *cq)
{
	struct fake_cq *c = (struct fake_cq *)cq;
	free(c->wcs);
	free(c);
	return 0;
}

int ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq, void **cq_context)
{
	(void)ch;
	(void)cq;
	(void)cq_context;
	errno = EAGAIN;
	return -1;
}

void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	(void)cq;
	(void)nevents;
}

struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct fake_qp *q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->qp.context = pd->context;
	q->qp.qp_context = attr->qp_context;
	q->qp.pd = pd;
	q->qp.send_cq = attr->send_cq;
	q->qp.recv_cq = attr->recv_cq;
	q->qp.srq = attr->srq;
	q->qp.qp_num = next_qpn++;
	q->qp.state = IBV_QPS_RESET;
	q->qp.qp_type = attr->qp_type;
	q->sq_sig_all = attr->sq_sig_all;
	return &q->qp;
}

int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	if (mask & IBV_QP_STATE)
		qp->state = attr->qp_state;
	return 0;
}

int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
		 struct ibv_qp_init_attr *init)
{
	(void)mask;
	memset(attr, 0, sizeof(*attr));
	memset(init, 0, sizeof(*init));
	attr->qp_state = qp->state;
	return 0;
}

int ibv_destroy_qp(struct ibv_qp *qp)
{
	free(qp);
	return 0;
}

struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	(void)pd;
	(void)attr;
	errno = EOPNOTSUPP;
	return NULL;
}

int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
	(void)srq;
	(void)attr;
	(void)mask;
	return EOPNOTSUPP;
}

int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	(void)srq;
	(void)attr;
	return EOPNOTSUPP;
}

int ibv_destroy_srq(struct ibv_srq *srq)
{
	(void)srq;
	return EOPNOTSUPP;
}

struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	(void)attr;
	struct ibv_ah *ah = calloc(1, sizeof(*ah));
	if (ah) {
		ah->context = pd->context;
		ah->pd = pd;
	}
	return ah;
}

int ibv_destroy_ah(struct ibv_ah *ah)
{
	free(ah);
	return 0;
}
