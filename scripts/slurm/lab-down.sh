#!/bin/bash
# Stops the lab of lab-up.sh by its pid files (never by process name):
# slurmd first (it retries "epilog complete" while the controller is gone),
# then slurmctld, then munged if a lab's lab-up.sh started it and the
# other lab does not use it.
# `lab-down.sh --nodes 2` stops the two-node lab ($CKPT_SLURM_LAB2).
set -uo pipefail
case "${1:-}" in
--nodes) NODES=${2:-} ;;
--nodes=*) NODES=${1#--nodes=} ;;
*) NODES=1 ;;
esac
LAB1=${CKPT_SLURM_LAB:-/var/tmp/ckpt-slurm-lab}
LAB2=${CKPT_SLURM_LAB2:-/var/tmp/ckpt-slurm-lab2}
case "$NODES" in
2) LAB=$LAB2 OTHER=$LAB1 ;;
*) LAB=$LAB1 OTHER=$LAB2 ;;
esac
stop() {
	[ -s "$1" ] || return 0
	local pid
	pid=$(cat "$1")
	kill "$pid" 2>/dev/null || return 0
	for _ in $(seq 60); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.5
	done
	echo "lab-down: pid $pid ($1) still running after 30 s" >&2
	return 1
}
for pidfile in "$LAB"/run/slurmd.pid "$LAB"/run/slurmd-*.pid; do
	[ -e "$pidfile" ] && stop "$pidfile"
done
stop "$LAB/run/slurmctld.pid"
# munged: under lab-up.sh's lock; stopped only if a lab script started it
# and the other lab does not use it.
exec 9>/run/lock/ckpt-slurm-lab-munge.lock
flock 9
rm -f "$LAB/run/munge.user" "$LAB/run/munged.ours"
if [ -e /run/munge/ckpt-lab.ours ] && [ ! -e "$OTHER/run/munge.user" ]; then
	stop /run/munge/munged.pid && rm -f /run/munge/ckpt-lab.ours
fi
flock -u 9
exec 9>&-
