/*
 * What the restart programs (rc_restart.c, ud_srq_restart.c) share:
 * opening the device with its IPv4-mapped GID (rxe loops traffic to its
 * own GIDs back), connecting an RC QP to another QP of the same device,
 * the ckpt_ib_* interface of libckpt_ibverbs.so (weak: the programs check
 * the layer is preloaded), and their restart points: in place, or by ckpt
 * (--pause).
 *
 * The including file defines `fail(fmt, ...)` (prints and exits 1) before
 * including this.
 */
#ifndef IB_LOOPBACK_H
#define IB_LOOPBACK_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#define PORT_NUM 1

/* A teardown verb that must succeed: destroying an object the device
 * still uses (a CQ with a QP of the layer's own on it, say) fails. */
#define MUST(call)                                                    \
	do {                                                          \
		int must_rc_ = (call);                                \
		if (must_rc_)                                         \
			fail("%s: %s", #call, strerror(must_rc_));    \
	} while (0)

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

/*
 * `--pause DIR`: the restarts are ckpt's (dump --kill, restore) instead of
 * in place: at each restart point the program says so (DIR/ready-N) and
 * waits, frozen, killed and restored meanwhile, until told to go on
 * (DIR/go-N).
 */
static const char *pause_dir;

/* Restart point `n`: waits for ckpt with --pause (returns 1), else 0. */
static int pause_for_ckpt(int n)
{
	char path[512];
	if (!pause_dir)
		return 0;
	snprintf(path, sizeof(path), "%s/ready-%d", pause_dir, n);
	int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
	if (fd < 0)
		fail("%s: %s", path, strerror(errno));
	close(fd);
	snprintf(path, sizeof(path), "%s/go-%d", pause_dir, n);
	while (access(path, F_OK) != 0)
		usleep(20000);
	return 1;
}

/* Checkpoints and recreates the verbs state in place (the old resources
 * destroyed), as a restore would. */
static void restart_in_place(uint32_t quiet_ms, struct drain_report *rep)
{
	const uint8_t *blob;
	size_t len;
	int rc = ckpt_ib_checkpoint(quiet_ms, 2000, rep);
	if (rc)
		fail("ckpt_ib_checkpoint: %d %s", rc, ckpt_ib_last_error());
	rc = ckpt_ib_restart_local(CKPT_IB_RETIRE_OLD, &blob, &len);
	if (rc)
		fail("ckpt_ib_restart_local: %d %s", rc, ckpt_ib_last_error());
	rc = ckpt_ib_restart_connect(blob, len);
	if (rc)
		fail("ckpt_ib_restart_connect: %d %s", rc, ckpt_ib_last_error());
}

/* Parses `[--pause DIR]` at argv[i]. */
static void parse_pause(int argc, char **argv, int i)
{
	if (argc > i + 1 && strcmp(argv[i], "--pause") == 0)
		pause_dir = argv[i + 1];
	else if (argc > i)
		fail("usage: %s [DEVICE [ROUNDS [--pause DIR]]]", argv[0]);
}

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
