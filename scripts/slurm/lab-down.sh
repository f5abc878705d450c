#!/bin/bash
# Stops the lab of lab-up.sh by its pid files (never by process name):
# slurmd first (it retries "epilog complete" while the controller is gone),
# then slurmctld, then munged if lab-up.sh started it.
set -uo pipefail
LAB=${CKPT_SLURM_LAB:-/var/tmp/ckpt-slurm-lab}
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
stop "$LAB/run/slurmd.pid"
stop "$LAB/run/slurmctld.pid"
if [ -e "$LAB/run/munged.ours" ]; then
	stop /run/munge/munged.pid
	rm -f "$LAB/run/munged.ours"
fi
