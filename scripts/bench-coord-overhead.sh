#!/usr/bin/env bash
# Coordination overhead (a benchmark, not a test; run by hand, as root): N "nodes" on
# this host, each a process tree of M processes holding MIB MiB of anonymous memory
# each, with its own checkpoint directory. Interleaved, RUNS times each:
#   single       each node dumped alone (`ckpt dump --tree PID --dir D`, trees keep running)
#   parallel     all N nodes dumped at once, uncoordinated (what the machine does when N
#                dumps share it, without any coordinator)
#   coordinated  one coordinated checkpoint: `ckpt coord --expect N` and one
#                `ckpt dump --coord` agent per node, from the agents' start (they register
#                with intent Checkpoint, which starts the round) to the last agent's exit
# and prints the medians with coordinated / slowest single, coordinated / sum of singles
# and coordinated / parallel (the last is the coordination overhead proper on one host:
# same work, same contention, plus the coordinator's barriers and commit record).
#
#   scripts/bench-coord-overhead.sh [--nodes N] [--procs M] [--mib MIB] [--runs R] [--dir BASE]
#   defaults: 2 nodes, 4 processes per node, 64 MiB per process, 3 runs, a temp dir under
#   /var/tmp. Needs `cargo build --release -p ckpt` and a C compiler.
set -euo pipefail
cd "$(dirname "$0")/.."

nodes=2 procs=4 mib=64 runs=3 base=""
while [ $# -gt 0 ]; do
	case "$1" in
	--nodes) nodes=$2; shift 2 ;;
	--procs) procs=$2; shift 2 ;;
	--mib) mib=$2; shift 2 ;;
	--runs) runs=$2; shift 2 ;;
	--dir) base=$2; shift 2 ;;
	*) echo "usage: $0 [--nodes N] [--procs M] [--mib MIB] [--runs R] [--dir BASE]" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" -eq 0 ] || { echo "$0: needs root (ckpt dumps with ptrace)" >&2; exit 1; }
CKPT=${CKPT:-${CARGO_TARGET_DIR:-$PWD/target}/release/ckpt}
[ -x "$CKPT" ] || { echo "$0: no $CKPT: run cargo build --release -p ckpt" >&2; exit 1; }
base=${base:-$(mktemp -d /var/tmp/ckpt-coord-overhead.XXXXXX)}
mkdir -p "$base"
job=overhead-$$
port=$(( 20000 + $$ % 20000 ))
addr=127.0.0.1:$port
pids=()
coord_pid=""

cleanup() {
	set +e
	[ -n "$coord_pid" ] && kill "$coord_pid" 2>/dev/null && wait "$coord_pid" 2>/dev/null
	for p in "${pids[@]}"; do
		# The tree: the root and its children.
		pkill -KILL -P "$p" 2>/dev/null
		kill -KILL "$p" 2>/dev/null
	done
	[ -n "${KEEP:-}" ] || rm -rf "$base"
}
trap cleanup EXIT INT TERM

# The workload: M processes (a root and M-1 children), each writing MIB MiB of
# incompressible-enough data (every page different) and then sleeping; no fds beyond 0-2.
cat >"$base/hog.c" <<'EOF'
#define _GNU_SOURCE
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	int n = argc > 2 ? atoi(argv[1]) : 1;
	size_t len = (size_t)(argc > 2 ? atol(argv[2]) : 64) << 20;
	for (int fd = 3; fd < 1024; fd++)
		close(fd);
	for (int i = 1; i < n; i++)
		if (fork() == 0)
			break;
	uint64_t *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED)
		return 1;
	uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)getpid();
	for (size_t i = 0; i < len / 8; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		m[i] = x;
	}
	for (;;)
		pause();
}
EOF
cc -O2 -o "$base/hog" "$base/hog.c"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f\n", b - a }'; }
json_num() { sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p" "$2"; }
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# Start the nodes' trees and wait until every process has its memory written.
for i in $(seq 1 "$nodes"); do
	setsid "$base/hog" "$procs" "$mib" </dev/null >/dev/null 2>&1 &
	pids+=("$!")
	disown "$!"
done
want_kb=$(( mib * 1024 ))
for p in "${pids[@]}"; do
	for _ in $(seq 1 600); do
		ready=0
		for q in "$p" $(pgrep -P "$p" || true); do
			rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$q/status" 2>/dev/null || echo 0)
			[ "${rss:-0}" -ge "$want_kb" ] && ready=$(( ready + 1 ))
		done
		[ "$ready" -ge "$procs" ] && break
		sleep 0.1
	done
	[ "$ready" -ge "$procs" ] || { echo "$0: tree $p did not start" >&2; exit 1; }
done

alive() {
	for p in "${pids[@]}"; do
		kill -0 "$p" 2>/dev/null || { echo "$0: tree $p died" >&2; exit 1; }
		[ "$(pgrep -c -P "$p")" -eq $(( procs - 1 )) ] || { echo "$0: tree $p lost processes" >&2; exit 1; }
	done
}

mkdir -p "$base/state"
"$CKPT" coord --listen "$addr" --job "$job" --expect "$nodes" --state-dir "$base/state" \
	--phase-deadline 300 2>"$base/coord.log" &
coord_pid=$!
for _ in $(seq 1 100); do [ -s "$base/state/$job.secret" ] && break; sleep 0.1; done
[ -s "$base/state/$job.secret" ] || { echo "$0: coordinator did not start:" >&2; cat "$base/coord.log" >&2; exit 1; }

: >"$base/single" >"$base/sum" >"$base/max" >"$base/parallel" >"$base/coord" >"$base/frozen-single" >"$base/frozen-coord"
for r in $(seq 1 "$runs"); do
	# (a) each node alone, one after the other.
	sum=0 max=0
	for i in $(seq 1 "$nodes"); do
		d=$base/single-$i
		t0=$(now)
		"$CKPT" dump --tree "${pids[$((i - 1))]}" --dir "$d" --json >"$base/s$i.json" 2>"$base/s$i.err" ||
			{ cat "$base/s$i.err" >&2; exit 1; }
		t=$(since "$t0")
		echo "$t" >>"$base/single"
		json_num frozen_ms "$base/s$i.json" >>"$base/frozen-single"
		sum=$(awk -v a="$sum" -v b="$t" 'BEGIN { print a + b }')
		max=$(awk -v a="$max" -v b="$t" 'BEGIN { print (b > a) ? b : a }')
		rm -rf "$d"
	done
	echo "$sum" >>"$base/sum"
	echo "$max" >>"$base/max"
	alive

	# (b) all nodes at once, no coordinator.
	t0=$(now)
	bg=()
	for i in $(seq 1 "$nodes"); do
		"$CKPT" dump --tree "${pids[$((i - 1))]}" --dir "$base/par-$i" --json >"$base/p$i.json" 2>"$base/p$i.err" &
		bg+=("$!")
	done
	for b in "${bg[@]}"; do wait "$b" || { cat "$base"/p*.err >&2; exit 1; }; done
	since "$t0" >>"$base/parallel"
	rm -rf "$base"/par-*
	alive

	# (c) one coordinated checkpoint of all nodes.
	t0=$(now)
	bg=()
	for i in $(seq 1 "$nodes"); do
		"$CKPT" dump --tree "${pids[$((i - 1))]}" --dir "$base/node-$i" --coord "$addr" --job "$job" \
			--node "n$i" --secret-file "$base/state/$job.secret" --json >"$base/c$i.json" 2>"$base/c$i.err" &
		bg+=("$!")
	done
	for b in "${bg[@]}"; do wait "$b" || { cat "$base"/c*.err "$base/coord.log" >&2; exit 1; }; done
	since "$t0" >>"$base/coord"
	for i in $(seq 1 "$nodes"); do json_num frozen_ms "$base/c$i.json" >>"$base/frozen-coord"; done
	epoch=$(json_num epoch "$base/c1.json")
	record=$base/state/$job/$(printf 'epoch-%016d.json' "$epoch")
	[ -s "$record" ] || { echo "$0: epoch $epoch has no commit record" >&2; exit 1; }
	rm -rf "$base"/node-*
	alive
done

single=$(median <"$base/single")
sum=$(median <"$base/sum")
max=$(median <"$base/max")
par=$(median <"$base/parallel")
coord=$(median <"$base/coord")
echo "$nodes nodes x $procs processes x $mib MiB; medians of $runs runs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-44s %8s\n' "measurement" "seconds"
printf '%-44s %8.3f\n' "one node alone (median over nodes and runs)" "$single"
printf '%-44s %8.3f\n' "slowest single node" "$max"
printf '%-44s %8.3f\n' "sum of single nodes" "$sum"
printf '%-44s %8.3f\n' "all nodes at once, uncoordinated" "$par"
printf '%-44s %8.3f\n' "coordinated (ckpt coord + agents)" "$coord"
printf 'frozen ms (median, from --json): single %s, coordinated %s\n' \
	"$(median <"$base/frozen-single")" "$(median <"$base/frozen-coord")"
awk -v c="$coord" -v m="$max" -v s="$sum" -v p="$par" 'BEGIN {
	printf "coordinated / slowest single: %.3f   coordinated / sum of singles: %.3f   coordinated / uncoordinated parallel: %.3f\n", c / m, c / s, c / p }'
