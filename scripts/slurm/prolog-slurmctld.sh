#!/bin/bash
# PrologSlurmctld (slurm.conf, controller host, runs as SlurmUser at every
# allocation, including a requeued job's): arms a one-shot strigger that,
# CKPT_TRIGGER_LEAD seconds before the job's time limit, runs trigger.sh,
# which asks the job to checkpoint if it is a ckpt slurm job (strigger runs
# it with slurmctld's environment: set CKPT_TRIGGER_PROGRAM to a wrapper if
# the site file is not in its default place). Always exits
# 0: a failing PrologSlurmctld would hold or requeue the job.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SITE=${CKPT_SLURM_SITE:-/etc/ckpt/slurm-site.conf}
[ -r "$SITE" ] || exit 0
# shellcheck source=site.conf.example
. "$SITE"
HERE=$(cd "$(dirname "$0")" && pwd)
exec >>"${CKPT_SLURM_LOG:-/var/log/ckpt-slurm.log}" 2>&1
job=${SLURM_JOB_ID:-}
lead=${CKPT_TRIGGER_LEAD:-300}
case "$job" in '' | *[!0-9]*) exit 0 ;; esac
if [ -n "${CKPT_TRIGGER_PARTITIONS:-}" ]; then
	case " $CKPT_TRIGGER_PARTITIONS " in
	*" ${SLURM_JOB_PARTITION:-} "*) ;;
	*) exit 0 ;;
	esac
fi
if strigger --set --jobid="$job" --time --offset=-"$lead" --program="${CKPT_TRIGGER_PROGRAM:-$HERE/trigger.sh}" >/dev/null; then
	echo "ckpt slurm prolog-slurmctld: job $job: trigger armed ${lead} s before its time limit"
else
	echo "ckpt slurm prolog-slurmctld: job $job: strigger --set failed (exit $?)"
fi
exit 0
