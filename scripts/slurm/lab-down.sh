#!/bin/bash
# Stops the lab of lab-up.sh by its pid files (never by process name):
# slurmd first (it retries "epilog complete" while the controller is gone),
# then slurmctld, then munged if lab-up.sh started it for this lab and the
# other lab does not run (it then takes munged over).
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
if [ -e "$LAB/run/munged.ours" ]; then
	if [ -s "$OTHER/run/slurmctld.pid" ] && kill -0 "$(cat "$OTHER/run/slurmctld.pid")" 2>/dev/null; then
		mv "$LAB/run/munged.ours" "$OTHER/run/munged.ours"
	else
		stop /run/munge/munged.pid
		rm -f "$LAB/run/munged.ours"
	fi
fi
