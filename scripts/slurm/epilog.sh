#!/bin/bash
# Epilog (slurm.conf, every node of the job, root, after the job's
# processes are gone): `ckpt slurm epilog` verifies the job's committed
# checkpoint (seal and checksums) and removes what a killed dump left, and
# `ckpt gc` removes the temporary directories of dumpers that were killed.
# Both act as the job's user (root tidying a user's directory could be led
# elsewhere by a symlink): `--as-user` makes ckpt read the site's image key
# as root first, then become the job's user in-process, not dumpable, so
# the user never gets to read the key. The directory is the one the job
# registered in its comment; other jobs are left alone. Always exits 0: a
# failing Epilog drains the node.
set -u
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
SITE=${CKPT_SLURM_SITE:-/etc/ckpt/slurm-site.conf}
[ -r "$SITE" ] || exit 0
# shellcheck source=site.conf.example
. "$SITE"
# Opened as root, before ckpt drops to the job's user.
exec >>"${CKPT_SLURM_LOG:-/var/log/ckpt-slurm.log}" 2>&1 </dev/null
job=${SLURM_JOB_ID:-}
case "$job" in '' | *[!0-9]*) exit 0 ;; esac
uid=${SLURM_JOB_UID:-}
case "$uid" in '' | *[!0-9]*) uid=$(id -u) ;; esac
gid=${SLURM_JOB_GID:-}
case "$gid" in '' | *[!0-9]*) gid=$(id -g "$uid" 2>/dev/null) || gid=$uid ;; esac
ckpt=${CKPT:-ckpt}
run=("$ckpt" slurm epilog --job "$job" --as-user "$uid:$gid")
[ -n "${CKPT_IMAGE_KEY:-}" ] && run+=(--image-key "$CKPT_IMAGE_KEY")
"${run[@]}" || echo "ckpt slurm epilog: job $job: exit $?"
"$ckpt" gc --slurm-job "$job" --as-user "$uid:$gid" || echo "ckpt gc: job $job: exit $?"
exit 0
