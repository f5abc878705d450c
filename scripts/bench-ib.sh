#!/usr/bin/env bash
# Cost of the shadow verbs layer (not a test): perftest's ib_send_bw
# (message rate, 64-byte sends) and ib_send_lat (round-trip latency) over
# rxe0 in the SoftRoCE VM of scripts/ib-vm.sh, without and with
# LD_PRELOAD=libckpt_ibverbs.so, interleaved in one boot; medians and the
# ratio layer/plain. The VM is emulated (QEMU TCG) and rxe is software:
# compare the ratio, not the absolute figures. Needs root.
#
#   scripts/bench-ib.sh [--runs N] [--iters N] [--json FILE]
# Environment: CKPT_IB_LAYER (default: build this tree's release layer).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
runs=5
iters=3000
json_out=
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
	case $1 in
	--runs) runs=$2; shift 2 ;;
	--iters) iters=$2; shift 2 ;;
	--json) json_out=$2; shift 2 ;;
	*) usage ;;
	esac
done
command -v ib_send_bw >/dev/null 2>&1 || {
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq perftest >/dev/null
}
layer=${CKPT_IB_LAYER:-}
if [ -z "$layer" ]; then
	cargo build --release -q -p ckpt-ib-shadow
	layer=$repo/target/release/libckpt_ibverbs.so
fi
scripts/ib-vm.sh setup >/dev/null
scratch=$(mktemp -d /var/tmp/ckpt-bench-ib.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
cp "$layer" "$scratch/libckpt_ibverbs.so"
cat >"$scratch/guest.sh" <<GUEST
#!/bin/sh
cd "\$CKPT_IB_SCRATCH"
one() { # MODE TOOL ITERS: one server/client pair; prints the client's result line
	pre=
	[ "\$1" = layer ] && pre="env LD_PRELOAD=\$CKPT_IB_SCRATCH/libckpt_ibverbs.so"
	\$pre \$2 -d rxe0 -x 1 -n \$3 -s 64 -F >srv.out 2>&1 &
	sleep 0.5
	\$pre \$2 -d rxe0 -x 1 -n \$3 -s 64 -F 127.0.0.1 >cli.out 2>&1
	wait
	grep -m1 '^ *64 ' cli.out
}
for i in \$(seq $runs); do
	for m in plain layer; do
		echo "bw \$m \$(one \$m ib_send_bw $iters)"
		# Round trips take milliseconds under TCG: fewer of them.
		echo "lat \$m \$(one \$m ib_send_lat $((iters / 10 + 1)))"
	done
done
GUEST
chmod +x "$scratch/guest.sh"
out=$(scripts/ib-vm.sh run --timeout $((120 + runs * 60)) --scratch "$scratch" -- "$scratch/guest.sh")
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2)}'; }
# The client's result line: ib_send_bw's message rate is its last field,
# ib_send_lat's typical latency its fifth (after "KIND MODE").
pick() { echo "$out" | awk -v k="$1" -v m="$2" '$1 == k && $2 == m {print (k == "bw" ? $NF : $7)}' | median; }
bw_plain=$(pick bw plain); bw_layer=$(pick bw layer)
lat_plain=$(pick lat plain); lat_layer=$(pick lat layer)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b + 0 == 0) print "nan"; else printf "%.3f", a / b}'; }
echo "ib_send_bw 64 B, message rate (Mpps, median of $runs): plain $bw_plain, layer $bw_layer, layer/plain $(ratio "$bw_layer" "$bw_plain")"
echo "ib_send_lat 64 B, typical latency (us, median of $runs): plain $lat_plain, layer $lat_layer, layer/plain $(ratio "$lat_layer" "$lat_plain")"
if [ -n "$json_out" ]; then
	printf '{"runs":%d,"iters":%d,"bw_mpps":{"plain":%s,"layer":%s},"lat_us":{"plain":%s,"layer":%s}}\n' \
		"$runs" "$iters" "$bw_plain" "$bw_layer" "$lat_plain" "$lat_layer" >"$json_out"
fi
