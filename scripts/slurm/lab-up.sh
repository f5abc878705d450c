#!/bin/bash
# Brings up a one-node Slurm on localhost for ckpt's tests: munged,
# slurmctld and slurmd, started by hand (no systemd needed). Run as root.
# Idempotent: daemons already running are left alone.
#
# State, logs and the generated slurm.conf live in $CKPT_SLURM_LAB
# (default /var/tmp/ckpt-slurm-lab). Clients need
#   export SLURM_CONF=$CKPT_SLURM_LAB/slurm.conf
#
# `lab-up.sh --nodes 2`: the two-node lab instead (slurm.conf.2node.in):
# nodes n1 and n2, two slurmds of this host, in $CKPT_SLURM_LAB2 (default
# /var/tmp/ckpt-slurm-lab2), with its own cluster name and ports, so it
# runs beside the one-node lab. It has no site hooks.
# Prints "started" as its last line if it started slurmctld, "up" if the lab
# was already running (restarted, and "started", if slurm.conf.in changed
# since: slurmctld takes a new PrologSlurmctld only when it starts).
#
# The site hooks (PrologSlurmctld, its strigger program, Epilog) are wrappers in $LAB/hooks
# around this directory's scripts (trigger.sh included); they read $LAB/site.conf (see
# site.conf.example), which tests write, and do nothing without it.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
NODES=1
case "${1:-}" in
'') ;;
--nodes) NODES=${2:-} ;;
--nodes=*) NODES=${1#--nodes=} ;;
*) echo "usage: lab-up.sh [--nodes 1|2]" >&2; exit 2 ;;
esac
case "$NODES" in
1) LAB=${CKPT_SLURM_LAB:-/var/tmp/ckpt-slurm-lab} TEMPLATE=slurm.conf.in NODE_NAMES=$(hostname -s) ;;
2) LAB=${CKPT_SLURM_LAB2:-/var/tmp/ckpt-slurm-lab2} TEMPLATE=slurm.conf.2node.in NODE_NAMES="n1 n2" ;;
*) echo "lab-up: --nodes $NODES: the lab has 1 or 2 nodes" >&2; exit 2 ;;
esac
export SLURM_CONF=$LAB/slurm.conf

for bin in munged slurmctld slurmd sinfo scontrol; do
	command -v "$bin" >/dev/null || PATH=$PATH:/usr/sbin:/sbin
	command -v "$bin" >/dev/null || { echo "lab-up: $bin not found (apt-get install slurm-wlm munge)" >&2; exit 2; }
done
[ "$(id -u)" = 0 ] || { echo "lab-up: must run as root" >&2; exit 2; }

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
MUNGE_LOCK=/run/lock/ckpt-slurm-lab-munge.lock

install -d -m 0755 "$LAB" "$LAB/run" "$LAB/ctld" "$LAB/d" "$LAB/log" "$LAB/hooks"
for hook in prolog-slurmctld trigger epilog; do
	cat >"$LAB/hooks/$hook.new" <<-EOF
		#!/bin/sh
		export CKPT_SLURM_SITE=$LAB/site.conf SLURM_CONF=$SLURM_CONF
		export CKPT_TRIGGER_PROGRAM=$LAB/hooks/trigger
		exec $HERE/$hook.sh "\$@"
	EOF
	chmod 0755 "$LAB/hooks/$hook.new"
	mv "$LAB/hooks/$hook.new" "$LAB/hooks/$hook"
done
HOST=$(hostname -s)
# The node line as slurmd detects this machine (CPUs, sockets, memory);
# each fake node of the two-node lab has the same hardware (@HW@).
NODE=$(slurmd -C | head -n 1)
case "$NODE" in NodeName=*) ;; *) echo "lab-up: slurmd -C printed: $NODE" >&2; exit 1 ;; esac
HW=${NODE#NodeName=* }
sed -e "s|@HOST@|$HOST|g" -e "s|@LAB@|$LAB|g" -e "s|@NODE@|$NODE|g" -e "s|@HW@|$HW|g" \
	"$HERE/$TEMPLATE" >"$LAB/slurm.conf.new"
changed=yes
cmp -s "$LAB/slurm.conf.new" "$LAB/slurm.conf" && changed=no
mv "$LAB/slurm.conf.new" "$LAB/slurm.conf"

if [ "$changed" = yes ] && alive "$LAB/run/slurmctld.pid"; then
	"$HERE/lab-down.sh" --nodes "$NODES"
fi
# munge: one per host, shared by both labs and anything else using it.
# Both labs' scripts take the same lock around munged, so one lab's
# lab-down.sh never stops it while the other's lab-up.sh counts on it, and
# a munged still shutting down is waited for before another one starts.
# $LAB/run/munge.user says this lab uses it; /run/munge/ckpt-lab.ours that
# a lab script started it (then the last lab down stops it).
exec 9>"$MUNGE_LOCK"
flock 9
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
	if [ ! -s /etc/munge/munge.key ]; then
		install -d -o munge -g munge -m 0700 /etc/munge
		dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
		chown munge:munge /etc/munge/munge.key
		chmod 0400 /etc/munge/munge.key
	fi
	install -d -o munge -g munge -m 0755 /run/munge
	for _ in $(seq 60); do alive /run/munge/munged.pid || break; sleep 0.5; done
	runuser -u munge -- munged
	touch /run/munge/ckpt-lab.ours
	for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi
touch "$LAB/run/munge.user"
flock -u 9
exec 9>&-
state=up
if ! alive "$LAB/run/slurmctld.pid"; then
	slurmctld -f "$SLURM_CONF"
	state=started
fi
if [ "$NODES" = 1 ]; then
	alive "$LAB/run/slurmd.pid" || slurmd -f "$SLURM_CONF"
else
	for n in $NODE_NAMES; do
		install -d -m 1777 "$LAB/tmp-$n"
		alive "$LAB/run/slurmd-$n.pid" || slurmd -f "$SLURM_CONF" -N "$n"
	done
fi

# Wait for every node to register; a node left down by an earlier run is
# resumed.
st=
node_up() {
	st=$(sinfo -h -N -n "$1" -o %t 2>/dev/null | head -n 1 || true)
	case "$st" in
	idle | alloc | mix) return 0 ;;
	down* | drain* | drng*) scontrol update nodename="$1" state=resume 2>/dev/null || true ;;
	esac
	return 1
}
for n in $NODE_NAMES; do
	up=no
	for _ in $(seq 60); do
		node_up "$n" && { up=yes; break; }
		sleep 0.5
	done
	if [ "$up" = no ]; then
		echo "lab-up: node $n not up (state '$st'); see $LAB/log/" >&2
		exit 1
	fi
done
echo "$state"
