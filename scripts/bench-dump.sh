#!/usr/bin/env bash
# Dump/restore throughput against the raw speed of the same storage, measured
# in the same run (the machines are noisy: compare the ratios, not the MB/s).
#   scripts/bench-dump.sh [SIZE_MIB] [DIR]     defaults: 1024, a temp dir under /var/tmp
set -euo pipefail
cd "$(dirname "$0")/.."
mib=${1:-1024}
base=${2:-$(mktemp -d /var/tmp/ckpt-bench.XXXXXX)}
cargo build --release --quiet -p ckpt
CKPT=$PWD/target/release/ckpt
gcc -O2 -o "$base/bigmem" scripts/demo/bigmem.c
now() { date +%s.%N; }
rate() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.0f", b / 1048576 / s }'; }

# Baselines on the same storage: write + fsync the same amount (dd), and
# read it back (from the page cache, as restore reads a fresh checkpoint).
sync
t0=$(now); dd if=/dev/zero of="$base/raw" bs=1M count="$mib" conv=fsync status=none; t1=$(now)
raw_write=$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')
t0=$(now); cat "$base/raw" >/dev/null; t1=$(now)
raw_read=$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')
rm -f "$base/raw"
sync

(
	for fd in /proc/$BASHPID/fd/*; do fd=${fd##*/}; [ "$fd" -gt 2 ] && eval "exec $fd>&-" 2>/dev/null || true; done
	exec setsid "$base/bigmem" "$mib" </dev/null >"$base/out" 2>&1
) &
pid=$!
until grep -q ready "$base/out" 2>/dev/null; do sleep 0.1; done

t0=$(now); "$CKPT" dump --tree "$pid" --dir "$base/img" --kill --json >"$base/dump.json"; t1=$(now)
dump=$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')
wait "$pid" 2>/dev/null || true
sleep 1.5
t0=$(now); "$CKPT" restore --dir "$base/img" --detach >/dev/null 2>&1; t1=$(now)
restore=$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')
kill -9 "$pid" 2>/dev/null || true

bytes=$(( mib * 1048576 ))
printf 'size %d MiB of incompressible anonymous memory\n' "$mib"
printf '%-34s %8s %10s\n' "operation" "seconds" "MiB/s"
printf '%-34s %8.2f %10s\n' "raw write + fsync (dd, baseline)" "$raw_write" "$(rate $bytes $raw_write)"
printf '%-34s %8.2f %10s\n' "ckpt dump --kill (incl. fsync)" "$dump" "$(rate $bytes $dump)"
printf '%-34s %8.2f %10s\n' "raw read (cat, baseline)" "$raw_read" "$(rate $bytes $raw_read)"
printf '%-34s %8.2f %10s\n' "ckpt restore --detach" "$restore" "$(rate $bytes $restore)"
awk -v d="$dump" -v w="$raw_write" -v r="$restore" -v rr="$raw_read" \
	'BEGIN { printf "dump / raw write speed: %.2f   restore / raw read speed: %.2f\n", w/d, rr/r }'
cat "$base/dump.json"
rm -rf "$base"
