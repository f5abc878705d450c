#!/bin/bash
# Epilog (slurm.conf, every node of the job, root, after the job's
# processes are gone): `ckpt slurm epilog` verifies the job's committed
# checkpoint (seal and checksums) and removes what a killed dump left, as
# the job's user (root tidying a user's directory could be led elsewhere by
# a symlink). The directory is the one the job registered in its comment;
# other jobs are left alone. Always exits 0: a failing Epilog drains the
# node.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SITE=${CKPT_SLURM_SITE:-/etc/ckpt/slurm-site.conf}
[ -r "$SITE" ] || exit 0
# shellcheck source=site.conf.example
. "$SITE"
# Opened as root, before dropping to the job's user.
exec >>"${CKPT_SLURM_LOG:-/var/log/ckpt-slurm.log}" 2>&1
job=${SLURM_JOB_ID:-}
case "$job" in '' | *[!0-9]*) exit 0 ;; esac
run=("${CKPT:-ckpt}" slurm epilog --job "$job")
[ -n "${CKPT_IMAGE_KEY:-}" ] && run+=(--image-key "$CKPT_IMAGE_KEY")
uid=${SLURM_JOB_UID:-0}
if [ "$(id -u)" = 0 ] && [ "$uid" != 0 ]; then
	gid=${SLURM_JOB_GID:-$(id -g "$uid")}
	run=(setpriv --reuid="$uid" --regid="$gid" --clear-groups -- "${run[@]}")
fi
"${run[@]}" || echo "ckpt slurm epilog: job $job: exit $?"
exit 0
