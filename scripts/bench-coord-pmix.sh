#!/bin/sh
# Round time of a checkpoint round through PMIx (`srun --mpi=pmix` + PmixBackend) against
# the TCP coordinator, in the two-node Slurm lab (not part of the test suite).
#
#   scripts/bench-coord-pmix.sh [--ranks 2,4,8,16] [--rounds 20] [--tcp-runs 5]
#
# For each rank count N: `srun --mpi=pmix -N2 -nN coord/examples/pmix_bench.rs` runs 1 +
# ROUNDS checkpoint rounds (rank 0 commits each epoch's manifest, fsynced, to a state
# directory under /var/tmp) and prints the rounds' min/median/max; then TCP-RUNS runs of
# `coord/examples/bench.rs --agents N --mode flat --procs 1` (one round each, its
# coordinator's state directory in the same file system) give the TCP round's
# min/median/max. Both in milliseconds.
#
# The lab is the tests' (scripts/slurm/lab-up.sh --nodes 2, $CKPT_SLURM_LAB2): it is taken
# with the tests' lock file ($CKPT_SLURM_LAB2.lock, as tests/slurm_lab.rs takes it),
# brought up if needed, and brought down again only if this script started it.
set -eu
cd "$(dirname "$0")/.."
RANKS=2,4,8,16
ROUNDS=20
TCP_RUNS=5
while [ "$#" -gt 0 ]; do
	case "$1" in
	--ranks) RANKS=$2; shift 2 ;;
	--rounds) ROUNDS=$2; shift 2 ;;
	--tcp-runs) TCP_RUNS=$2; shift 2 ;;
	*) echo "bench-coord-pmix: unknown argument $1" >&2; exit 2 ;;
	esac
done
LAB=${CKPT_SLURM_LAB2:-/var/tmp/ckpt-slurm-lab2}
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release -q -p ckpt-coord --features pmix --example pmix_bench --example bench
PMIX_BENCH=$(realpath "$TARGET/release/examples/pmix_bench")
TCP_BENCH=$(realpath "$TARGET/release/examples/bench")

# Holding the lab's lock from here to the end (fd 9).
exec 9>"$LAB.lock"
flock 9
started=no
scripts/slurm/lab-up.sh --nodes 2 | tail -n 1 | grep -q started && started=yes
export SLURM_CONF="$LAB/slurm.conf"
STATE=$(mktemp -d /var/tmp/bench-coord-pmix.XXXXXX)
cleanup() {
	rm -rf "$STATE"
	[ "$started" = no ] || scripts/slurm/lab-down.sh --nodes 2
}
trap cleanup EXIT
# sh runs the EXIT trap on a signal only if the signal is trapped too.
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# min, median and max of the numbers on stdin, one per line.
stats() {
	sort -n | awk '{ v[NR] = $1 } END { printf "%.2f %.2f %.2f", v[1], v[int(NR / 2) + 1], v[NR] }'
}

echo "ranks/agents over 2 nodes; round = REGISTER..RESUME barriers, ms (min median max)"
printf '%-8s %-28s %-28s %s\n' N "pmix round (${ROUNDS} rounds)" "tcp round (${TCP_RUNS} runs)" "pmix init ms"
for n in $(echo "$RANKS" | tr , ' '); do
	rm -rf "${STATE:?}"/*
	line=$(srun --mpi=pmix --nodes=2 --ntasks="$n" --overcommit --chdir=/tmp \
		"$PMIX_BENCH" --rounds "$ROUNDS" --state-dir "$STATE")
	pmix=$(echo "$line" | sed -n 's/.*round_ms_min=\([0-9.]*\) round_ms_median=\([0-9.]*\) round_ms_max=\([0-9.]*\).*/\1 \2 \3/p')
	init=$(echo "$line" | sed -n 's/.*init_ms=\([0-9.]*\).*/\1/p')
	tcp=$(for _ in $(seq "$TCP_RUNS"); do
		TMPDIR=/var/tmp "$TCP_BENCH" --agents "$n" --mode flat --procs 1 2>/dev/null |
			awk '$1 == "flat" { print $5 * 1000 }'
	done | stats)
	printf '%-8s %-28s %-28s %s\n' "$n" "$pmix" "$tcp" "$init"
done
