#!/usr/bin/env bash
# What the shadow verbs layer (libckpt_ibverbs.so) costs on the fast path.
# A benchmark, not a test: it prints figures and fails only when a run
# breaks.
#
#   scripts/bench-ib-layer.sh [--pairs N] [--rounds N] [--threads "1 2"]
#       On this host, no RDMA device needed: bench-ib-layer/fastpath.c
#       calls ibv_post_send, ibv_post_recv and ibv_poll_cq (verbs.h's
#       inline verbs) over bench-ib-layer/fake_ibverbs.c, a stand-in
#       libibverbs whose device completes every request at once, without
#       and with LD_PRELOAD=libckpt_ibverbs.so, N pairs interleaved
#       (default 5); prints ns per call, medians over the pairs, and what
#       the layer adds; with 1 thread, then with 2 (each on a QP of its
#       own, at once).
#   scripts/bench-ib-layer.sh --guest [--pairs N] [--iters N] [--json FILE] [--control]
#       In the SoftRoCE VM of scripts/ib-vm.sh (QEMU TCG, rxe0, server and
#       client on the one device): perftest's ib_send_bw and ib_write_bw
#       (64-byte messages, busy polling) and ib_send_lat (64 bytes, on
#       completion events), ib_send_bw with 64 KiB messages, and the
#       fast-path program above, without and with the layer, N pairs
#       interleaved in one boot (default 5); medians and layer/plain.
#       --control preloads an empty library instead of the layer: the
#       ratios it prints are the harness's own bias and spread. Needs
#       root.
#
# Pairs alternate their order (plain first, then layer first, ...), so
# neither side always runs first in a fresh state or last in a drifted
# one.
#
# Environment: CKPT_IB_LAYER (default: build this tree's release layer).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
mode=host
pairs=5
rounds=20000
threads="1 2"
iters=4000
json_out=
control=0
usage() { sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
	case $1 in
	--guest) mode=guest; shift ;;
	--pairs) pairs=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--threads) threads=$2; shift 2 ;;
	--iters) iters=$2; shift 2 ;;
	--json) json_out=$2; shift 2 ;;
	--control) control=1; shift ;;
	*) usage ;;
	esac
done

layer=${CKPT_IB_LAYER:-}
if [ -z "$layer" ]; then
	nice -n 10 cargo build --release -q -p ckpt-ib-shadow
	layer=${CARGO_TARGET_DIR:-$repo/target}/release/libckpt_ibverbs.so
fi
[ -f "$layer" ] || { echo "bench-ib-layer: no layer at $layer" >&2; exit 1; }

# Pair I's order: odd pairs run plain first, even pairs the layer first.
pair_order() { if [ $(($1 % 2)) = 1 ]; then echo plain layer; else echo layer plain; fi; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2)}'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b + 0 == 0) print "nan"; else printf "%.3f", a / b}'; }
cpu=$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)
echo "host: $cpu, $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"

# Builds the stand-in libibverbs and the fast-path program into DIR, with
# the layer beside them.
build_fastpath() {
	local dir=$1 src=$repo/scripts/bench-ib-layer
	gcc -O2 -Wall -Wextra -fPIC -shared -Wl,--version-script="$src/fake_ibverbs.map" \
		-Wl,-soname,libibverbs.so.1 -o "$dir/libibverbs.so.1" "$src/fake_ibverbs.c"
	ln -sf libibverbs.so.1 "$dir/libibverbs.so"
	# The runpath makes the stand-in, not the system's libibverbs, the one
	# the program and the layer's dlvsym(RTLD_NEXT) find.
	gcc -O2 -Wall -Wextra -o "$dir/fastpath" "$src/fastpath.c" \
		-L"$dir" -libverbs -Wl,-rpath,"$dir" -ldl -lpthread
	cp "$layer" "$dir/libckpt_ibverbs.so"
}

# Prints the table of FILE's lines "MODE KIND NS" (MODE plain or layer).
fastpath_table() {
	local file=$1 k p l
	printf '%-20s %8s %8s %8s\n' verb plain layer added
	for k in post_send post_recv poll_cq_1 poll_cq_empty post_send_chain16 poll_cq_16; do
		p=$(awk -v k="$k" '$1 == "plain" && $2 == k {print $3}' "$file" | median)
		l=$(awk -v k="$k" '$1 == "layer" && $2 == k {print $3}' "$file" | median)
		printf '%-20s %8.1f %8.1f %8.1f\n' "$k" "$p" "$l" "$(awk -v a="$l" -v b="$p" 'BEGIN {print a - b}')"
	done
}

host_bench() {
	# Global: the EXIT trap runs after this function returned.
	work=$(mktemp -d /var/tmp/ckpt-bench-ib-layer.XXXXXX)
	trap 'rm -rf "$work"' EXIT
	build_fastpath "$work"
	local t i m
	for t in $threads; do
		local out="$work/results-$t"
		for i in $(seq "$pairs"); do
			for m in $(pair_order "$i"); do
				local pre=() want=libibverbs.so.1 res
				if [ "$m" = layer ]; then
					pre=(env LD_PRELOAD="$work/libckpt_ibverbs.so")
					want=libckpt_ibverbs.so
				fi
				res=$(nice -n 10 "${pre[@]}" "$work/fastpath" "$rounds" "$t")
				grep -qx "ops_from $want" <<<"$res" || {
					echo "bench-ib-layer: the $m run's verbs went to the wrong library:" >&2
					echo "$res" >&2
					exit 1
				}
				grep -v '^ops_from ' <<<"$res" | sed "s/^/$m /" >>"$out"
			done
		done
		echo
		echo "fast-path verbs over a device-less provider, $t thread(s), ns per call (median of $pairs pairs of $rounds rounds x 64 calls):"
		fastpath_table "$out"
		if [ "$t" -gt 1 ]; then
			local par
			par=$(awk '$1 == "layer" && $2 == "parallel" {print $3}' "$out" | median)
			echo "threads running at the same time, share of the run (median): plain $(awk '$1 == "plain" && $2 == "parallel" {print $3}' "$out" | median), layer $par"
			if awk -v p="$par" 'BEGIN {exit !(p < 0.9)}'; then
				echo "WARNING: the threads mostly took turns on a CPU (the machine is busy): these are not contended figures"
			fi
		fi
	done
	echo "(post_send_chain16: per request of a 16-request chain; poll_cq_16: per completion, 16 per call; poll_cq_empty: a poll that finds nothing)"
}

guest_bench() {
	command -v ib_send_bw >/dev/null 2>&1 || {
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq perftest >/dev/null
	}
	scripts/ib-vm.sh setup >/dev/null
	# Global, as in host_bench.
	scratch=$(mktemp -d /var/tmp/ckpt-bench-ib.XXXXXX)
	trap 'rm -rf "$scratch"' EXIT
	build_fastpath "$scratch"
	# What the "layer" side preloads: the layer, or for --control a
	# library with nothing in it.
	local want_layer=preload.so
	cp "$scratch/libckpt_ibverbs.so" "$scratch/preload.so"
	if [ "$control" = 1 ]; then
		echo 'int ckpt_bench_control;' | gcc -x c -shared -fPIC -o "$scratch/preload.so" -
		want_layer=libibverbs.so.1
	fi
	local lat_iters=$((iters / 8 + 1)) big_iters=$((iters / 8 + 5)) guest_rounds=$((rounds / 10 + 1))
	# --use_old_post_send: perftest posts with ibv_post_send, the verb the
	# layer shadows, and never with the extended ibv_wr_* API, which the
	# layer's context does not offer. perftest 4.5 says "ibv_wr* API : OFF"
	# on rxe0 without the flag too, with and without the layer; the flag
	# keeps both sides on the same code whatever a perftest picks by
	# default.
	# ib_send_lat on completion events (-e): busy polling, the guest's one
	# vCPU only runs rxe's kernel work when the timer tick preempts the
	# poller, and every round trip takes 4 ms whatever the layer does.
	cat >"$scratch/guest.sh" <<GUEST
#!/bin/sh
cd "\$CKPT_IB_SCRATCH"
one() { # NAME MODE SIZE TOOL ARGS...: one server/client pair; prints the client's result line
	name=\$1 mode=\$2 size=\$3 tool=\$4; shift 4
	pre=
	[ "\$mode" = layer ] && pre="env LD_PRELOAD=\$CKPT_IB_SCRATCH/preload.so"
	\$pre \$tool -d rxe0 -x 1 -s \$size -F --use_old_post_send "\$@" >srv.out 2>&1 &
	sleep 0.5
	\$pre \$tool -d rxe0 -x 1 -s \$size -F --use_old_post_send "\$@" 127.0.0.1 >cli.out 2>&1
	rc=\$?
	wait
	line=\$(grep -m1 "^ *\$size " cli.out)
	if [ \$rc != 0 ] || [ -z "\$line" ]; then
		echo "failed \$name \$mode rc=\$rc"; cat cli.out srv.out
		return
	fi
	echo "\$name \$mode \$line"
}
for i in \$(seq $pairs); do
	order="plain layer"
	[ \$((i % 2)) = 0 ] && order="layer plain"
	for m in \$order; do
		one send_bw \$m 64 ib_send_bw -n $iters
		one write_bw \$m 64 ib_write_bw -n $iters
		one send_lat_ev \$m 64 ib_send_lat -n $lat_iters -e
		one send_bw_64k \$m 65536 ib_send_bw -n $big_iters
		pre=
		[ "\$m" = layer ] && pre="env LD_PRELOAD=\$CKPT_IB_SCRATCH/preload.so"
		\$pre ./fastpath $guest_rounds 1 | sed "s/^/fp \$m /"
	done
done
GUEST
	chmod +x "$scratch/guest.sh"
	local out
	out=$(nice -n 10 scripts/ib-vm.sh run --timeout $((120 + pairs * 180)) --scratch "$scratch" -- "$scratch/guest.sh")
	if grep -q '^failed ' <<<"$out"; then
		echo "bench-ib-layer: a perftest run failed in the guest:" >&2
		echo "$out" >&2
		exit 1
	fi
	if [ "$(grep -c '^fp plain ops_from libibverbs.so.1$' <<<"$out")" != "$pairs" ] ||
		[ "$(grep -c "^fp layer ops_from $want_layer\$" <<<"$out")" != "$pairs" ]; then
		echo "bench-ib-layer: the fast-path program did not run as expected in the guest:" >&2
		echo "$out" >&2
		exit 1
	fi
	# Result lines, after "NAME MODE": bw tests "SIZE iters BWpeak BWavg
	# MsgRate" (MB/s, Mpps), ib_send_lat "SIZE iters t_min t_max t_typical
	# t_avg ..." (us).
	# A figure of 0 is perftest failing to time its run (seen once in 18
	# runs of ib_send_bw 64 KiB), not a measurement: left out.
	pick() { awk -v k="$1" -v m="$2" -v f="$3" '$1 == k && $2 == m && $(f + 2) + 0 != 0 {print $(f + 2)}' <<<"$out" | median; }
	# The median of each pair's layer/plain: the pairs ran one after the
	# other, so this cancels what drifts over the boot.
	pair_ratio() {
		awk -v k="$1" -v f="$2" '$1 == k && $2 == "plain" {p[++np] = $(f + 2)}
			$1 == k && $2 == "layer" {l[++nl] = $(f + 2)}
			END {for (i = 1; i <= nl; i++) if (p[i] + 0 != 0 && l[i] + 0 != 0) print l[i] / p[i]}' <<<"$out" | median
	}
	echo
	[ "$control" = 0 ] || echo "CONTROL: the \"layer\" side preloads an empty library, not the layer"
	echo "perftest in the SoftRoCE guest (QEMU TCG, 1 vCPU, rxe0 loopback), median of $pairs interleaved pairs:"
	printf '%-40s %10s %10s %12s %12s\n' figure plain layer layer/plain "pairwise"
	local json="" k name p l
	for k in "send_bw 5 ib_send_bw 64 B message rate (Mpps)" "send_bw 4 ib_send_bw 64 B bandwidth (MB/s)" \
		"write_bw 5 ib_write_bw 64 B message rate (Mpps)" "write_bw 4 ib_write_bw 64 B bandwidth (MB/s)" \
		"send_bw_64k 4 ib_send_bw 64 KiB bandwidth (MB/s)" \
		"send_lat_ev 5 ib_send_lat -e 64 B typical (us)" "send_lat_ev 6 ib_send_lat -e 64 B average (us)"; do
		set -- $k
		name=${k#* * }
		p=$(pick "$1" plain "$2")
		l=$(pick "$1" layer "$2")
		printf '%-40s %10s %10s %12s %12.3f\n' "$name" "$p" "$l" "$(ratio "$l" "$p")" "$(pair_ratio "$1" "$2")"
		json+="${json:+,}\"$1.$2\":{\"plain\":$p,\"layer\":$l}"
	done
	echo "(64 B: ib_send_bw/ib_write_bw -n $iters, ib_send_lat -n $lat_iters; 64 KiB: -n $big_iters; all with --use_old_post_send;"
	echo " layer/plain: of the medians; pairwise: median of each pair's ratio)"
	echo
	echo "the fast-path program in the guest (TCG), ns per call (median of $pairs pairs of $guest_rounds rounds x 64 calls):"
	grep '^fp ' <<<"$out" | grep -v ' ops_from ' | cut -d' ' -f2- >"$scratch/fp"
	fastpath_table "$scratch/fp"
	if [ -n "$json_out" ]; then
		printf '{"pairs":%d,"iters":%d,"lat_iters":%d,"big_iters":%d,%s}\n' "$pairs" "$iters" "$lat_iters" "$big_iters" "$json" >"$json_out"
	fi
	echo
	echo "raw:"
	grep -v '^fp ' <<<"$out"
}

if [ "$mode" = guest ]; then guest_bench; else host_bench; fi
