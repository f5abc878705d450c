#!/bin/bash
# strigger program (armed by prolog-slurmctld.sh; controller host, runs as
# the trigger's creator, $1 = job id): `ckpt slurm trigger` sends the job's
# checkpoint signal to its batch step if it is a running ckpt slurm job
# (registered in its comment), and leaves any other job alone.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SITE=${CKPT_SLURM_SITE:-/etc/ckpt/slurm-site.conf}
[ -r "$SITE" ] || exit 0
# shellcheck source=site.conf.example
. "$SITE"
exec >>"${CKPT_SLURM_LOG:-/var/log/ckpt-slurm.log}" 2>&1
"${CKPT:-ckpt}" slurm trigger "${1:-}" || echo "ckpt slurm trigger: job ${1:-}: exit $?"
exit 0
