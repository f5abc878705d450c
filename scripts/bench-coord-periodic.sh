#!/usr/bin/env bash
# Periodic checkpoints of a multi-node job (a benchmark, not a test; run by hand, as
# root): N "nodes" on this host, each one process holding MIB MiB of anonymous memory
# (every page different), each with its own checkpoint root, one `ckpt coord --expect N`.
# In order:
#   frozen        a coordinated checkpoint (`ckpt dump --coord`): every part frozen until
#                 the epoch commits
#   background    `ckpt dump --coord --background`: every part frozen until every part
#                 captured its frozen state, then all thaw and write their pages running
#   incremental   `ckpt dump --coord --incremental` twice, the job rewriting PCT % of its
#                 pages in between (`--touch block`: one contiguous stretch; `--touch spread`:
#                 every (100/PCT)-th page, which leaves no 1 MiB chunk of pages unwritten,
#                 the worst case for an increment, which reuses whole chunks): bytes read
#                 from the tree by each
# Prints, per round, the largest frozen time over the parts (`frozen_ms` of --json) and
# the wall time, and for the incremental pair the page bytes read from the tree
# (pages_planned_bytes - reused_bytes) and stored (pages_written_bytes) by each epoch.
#
#   scripts/bench-coord-periodic.sh [--nodes N] [--mib MIB] [--pct PCT] [--touch block|spread] [--dir BASE]
#   defaults: 2 nodes, 1024 MiB each, 5 %, block, a temp dir under /var/tmp.
#   Needs `cargo build --release -p ckpt` and a C compiler.
set -euo pipefail
cd "$(dirname "$0")/.."

nodes=2 mib=1024 pct=5 touch=block base=""
while [ $# -gt 0 ]; do
	case "$1" in
	--nodes) nodes=$2; shift 2 ;;
	--mib) mib=$2; shift 2 ;;
	--pct) pct=$2; shift 2 ;;
	--touch) touch=$2; shift 2 ;;
	--dir) base=$2; shift 2 ;;
	*) echo "usage: $0 [--nodes N] [--mib MIB] [--pct PCT] [--touch block|spread] [--dir BASE]" >&2; exit 2 ;;
	esac
done
case "$touch" in
block) spread=0 ;;
spread) spread=1 ;;
*) echo "$0: --touch block or spread, not $touch" >&2; exit 2 ;;
esac
[ "$(id -u)" -eq 0 ] || { echo "$0: needs root (ckpt dumps with ptrace)" >&2; exit 1; }
CKPT=${CKPT:-${CARGO_TARGET_DIR:-$PWD/target}/release/ckpt}
[ -x "$CKPT" ] || { echo "$0: no $CKPT: run cargo build --release -p ckpt" >&2; exit 1; }
base=${base:-$(mktemp -d /var/tmp/ckpt-coord-periodic.XXXXXX)}
mkdir -p "$base"
job=periodic-$$
port=$(( 20000 + $$ % 20000 ))
addr=127.0.0.1:$port
pids=()
coord_pid=""

cleanup() {
	set +e
	[ -n "$coord_pid" ] && kill "$coord_pid" 2>/dev/null && wait "$coord_pid" 2>/dev/null
	for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
	[ -n "${KEEP:-}" ] || rm -rf "$base"
}
trap cleanup EXIT INT TERM

# The workload: MIB MiB, every page different; on SIGUSR1 it rewrites PCT % of its pages
# once (argv[4] 1: every (100 / PCT)-th page, 0: the first PCT %), then writes its pid to
# the file named by argv[3].
cat >"$base/hog.c" <<'EOF'
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile sig_atomic_t touch;
static void on_usr1(int sig) { (void)sig; touch = 1; }

int main(int argc, char **argv)
{
	size_t len = (size_t)atol(argv[1]) << 20;
	size_t pct = (size_t)atol(argv[2]);
	int spread = atoi(argv[4]);
	for (int fd = 3; fd < 1024; fd++)
		close(fd);
	signal(SIGUSR1, on_usr1);
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
	for (;;) {
		pause();
		if (!touch)
			continue;
		touch = 0;
		size_t pages = len / 4096;
		size_t step = spread ? 100 / pct : 1;
		size_t end = spread ? pages : pages * pct / 100;
		for (size_t page = 0; page < end; page += step)
			for (size_t w = 0; w < 512; w++)
				m[page * 512 + w] ^= 0x5bd1e995ull + w;
		FILE *f = fopen(argv[3], "w");
		if (f) {
			fprintf(f, "%d\n", getpid());
			fclose(f);
		}
	}
}
EOF
cc -O2 -o "$base/hog" "$base/hog.c"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f\n", b - a }'; }

for i in $(seq 1 "$nodes"); do
	setsid "$base/hog" "$mib" "$pct" "$base/touched-$i" "$spread" </dev/null >/dev/null 2>&1 &
	pids+=("$!")
	disown "$!"
done
want_kb=$(( mib * 1024 ))
for p in "${pids[@]}"; do
	for _ in $(seq 1 1200); do
		rss=$(awk '/^VmRSS/ { print $2 }' "/proc/$p/status" 2>/dev/null || echo 0)
		[ "${rss:-0}" -ge "$want_kb" ] && break
		sleep 0.1
	done
	[ "${rss:-0}" -ge "$want_kb" ] || { echo "$0: process $p did not fill its memory" >&2; exit 1; }
done

mkdir -p "$base/state"
"$CKPT" coord --listen "$addr" --job "$job" --expect "$nodes" --state-dir "$base/state" \
	--phase-deadline 300 2>"$base/coord.log" &
coord_pid=$!
for _ in $(seq 1 100); do [ -s "$base/state/$job.secret" ] && break; sleep 0.1; done
[ -s "$base/state/$job.secret" ] || { echo "$0: coordinator did not start:" >&2; cat "$base/coord.log" >&2; exit 1; }

# One coordinated round with the extra dump flags "$@" (by name in $1); leaves
# $base/NAME-I.json per node and prints "NAME max-frozen-ms wall-s".
round() {
	local name=$1
	shift
	local t0 bg=()
	t0=$(now)
	for i in $(seq 1 "$nodes"); do
		"$CKPT" dump --tree "${pids[$((i - 1))]}" --dir "$base/node-$i" --coord "$addr" --job "$job" \
			--node "n$i" --secret-file "$base/state/$job.secret" --json "$@" \
			>"$base/$name-$i.json" 2>"$base/$name-$i.err" &
		bg+=("$!")
	done
	for b in "${bg[@]}"; do wait "$b" || { cat "$base"/"$name"-*.err "$base/coord.log" >&2; exit 1; }; done
	local wall frozen
	wall=$(since "$t0")
	frozen=$(for i in $(seq 1 "$nodes"); do jq .frozen_ms "$base/$name-$i.json"; done | sort -n | tail -1)
	printf '%-22s %12s %10s\n' "$name" "$frozen" "$wall"
}

# Sum over the nodes of a figure of round NAME's reports (jq expression).
total() {
	for i in $(seq 1 "$nodes"); do jq "$2" "$base/$1-$i.json"; done | awk '{ s += $1 } END { printf "%.0f\n", s }'
}

echo "$nodes nodes x $mib MiB, rewriting $pct % of the pages ($touch) between the incremental epochs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-22s %12s %10s\n' "round" "max frozen ms" "wall s"
round frozen
round background --background
round incremental-1 --incremental
for i in $(seq 1 "$nodes"); do
	rm -f "$base/touched-$i"
	kill -USR1 "${pids[$((i - 1))]}"
done
for i in $(seq 1 "$nodes"); do
	for _ in $(seq 1 600); do [ -s "$base/touched-$i" ] && break; sleep 0.1; done
	[ -s "$base/touched-$i" ] || { echo "$0: node $i did not rewrite its pages" >&2; exit 1; }
done
round incremental-2 --incremental
read_expr='.stats.pages_planned_bytes - (.stats.reused_bytes // 0)'
for r in incremental-1 incremental-2; do
	printf '%s: %s bytes read from the trees, %s bytes of pages stored\n' "$r" \
		"$(total "$r" "$read_expr")" "$(total "$r" .stats.pages_written_bytes)"
done
