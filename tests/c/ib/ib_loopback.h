/*
 * What the in-place restart programs (rc_restart.c, ud_srq_restart.c)
 * share: opening the device with its IPv4-mapped GID (rxe loops traffic
 * to its own GIDs back), connecting an RC QP to another QP of the same
 * device, and the ckpt_ib_* interface of libckpt_ibverbs.so (weak: the
 * programs check the layer is preloaded).
 *
 * The including file defines `fail(fmt, ...)` (prints and exits 1) before
 * including this.
 */
#ifndef IB_LOOPBACK_H
#define IB_LOOPBACK_H

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <infiniband/verbs.h>

#define PORT_NUM 1

struct drain_report {
	uint64_t completions, outstanding_sends, elapsed_us;
};
int ckpt_ib_checkpoint(uint32_t quiet_ms, uint32_t max_wait_ms, struct drain_report *out)
	__attribute__((weak));
int ckpt_ib_restart_local(uint32_t flags, const uint8_t **blob, size_t *len) __attribute__((weak));
int ckpt_ib_restart_connect(const uint8_t *blobs, size_t len) __attribute__((weak));
const char *ckpt_ib_last_error(void) __attribute__((weak));
/* ckpt_ib_restart_local: the old resources are alive; destroy them first. */
#define CKPT_IB_RETIRE_OLD 1

static void fail(const char *fmt, ...);

/* Opens device `name`; its port's IPv4-mapped GID and that GID's index. */
static struct ibv_context *open_loopback(const char *name, union ibv_gid *gid, uint8_t *gid_index)
{
	struct ibv_context *ctx = NULL;
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	for (int i = 0; list && i < n; i++)
		if (strcmp(ibv_get_device_name(list[i]), name) == 0)
			ctx = ibv_open_device(list[i]);
	if (list)
		ibv_free_device_list(list);
	if (!ctx)
		fail("device %s not found", name);
	struct ibv_port_attr port;
	if (ibv_query_port(ctx, PORT_NUM, &port) || port.state != IBV_PORT_ACTIVE)
		fail("port %d not active", PORT_NUM);
	static const uint8_t v4[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };
	for (int i = 0; i < port.gid_tbl_len; i++)
		if (ibv_query_gid(ctx, PORT_NUM, i, gid) == 0 && memcmp(gid->raw, v4, 12) == 0) {
			*gid_index = (uint8_t)i;
			return ctx;
		}
	fail("no IPv4-mapped GID on port %d", PORT_NUM);
	return NULL;
}

/* Brings RC QP `qp` to RTS towards `remote_qpn` on the same device, with
 * remote `access`, the given PSN both ways and infinite RNR retries (a
 * send waits for its receive). */
static void connect_rc(struct ibv_qp *qp, uint32_t remote_qpn, const union ibv_gid *gid,
		       uint8_t gid_index, uint32_t psn, unsigned int access)
{
	struct ibv_qp_attr at = {
		.qp_state = IBV_QPS_INIT,
		.port_num = PORT_NUM,
		.qp_access_flags = access,
	};
	if (ibv_modify_qp(qp, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		fail("INIT: %s", strerror(errno));
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTR;
	at.path_mtu = IBV_MTU_1024;
	at.dest_qp_num = remote_qpn;
	at.rq_psn = psn;
	at.max_dest_rd_atomic = 1;
	at.min_rnr_timer = 1; /* 0.01 ms: RNR retries come fast */
	at.ah_attr.is_global = 1;
	at.ah_attr.grh.dgid = *gid;
	at.ah_attr.grh.sgid_index = gid_index;
	at.ah_attr.grh.hop_limit = 1;
	at.ah_attr.port_num = PORT_NUM;
	if (ibv_modify_qp(qp, &at,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		fail("RTR: %s", strerror(errno));
	memset(&at, 0, sizeof(at));
	at.qp_state = IBV_QPS_RTS;
	at.timeout = 14;
	at.retry_cnt = 7;
	at.rnr_retry = 7;
	at.sq_psn = psn;
	at.max_rd_atomic = 1;
	if (ibv_modify_qp(qp, &at,
			  IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				  IBV_QP_MAX_QP_RD_ATOMIC))
		fail("RTS: %s", strerror(errno));
}

#endif
