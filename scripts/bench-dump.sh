#!/usr/bin/env bash
# Dump/restore benchmark (not a test): ckpt against the limits of the machine
# (dd + fsync of the same bytes to the same storage while the workload holds
# its memory, memcpy) and against CRIU,
# all measured in the same run, interleaved (the machines are noisy: compare
# the ratios, not the absolute figures). Needs root.
#
#   scripts/bench-dump.sh [--quick] [--scale] [--runs N] [--workloads a,b] [--storage disk,tmpfs]
#                         [--disk-dir DIR] [--json FILE] [--no-criu] [--short-freezes] [--load N]
# Environment: CKPT (a ckpt binary; default: build this tree's), CRIU.
#
# Workloads (scripts/demo/benchload.c): mem1g-mixed mem1g-random mem4g-mixed
# mem4g-random tree16x256m vmas20k ("mixed": 1/4 mapped but never written,
# 1/4 repetitive text, 1/2 random; "random": incompressible; the tree is 16
# processes of 256 MiB mixed; vmas20k is one process with 20,000 one-page
# VMAs of alternating protections). Where the work is objects, not bytes
# (--scale: these, on disk): threads2000 (one process of 2,000 sleeping
# threads, each checking a word on its stack), vmas30k, tree64x64m (64
# processes of 64 MiB mixed), tree256x1m (256 small processes). Storage:
# "disk" (a directory under --disk-dir, default /var/tmp) and "tmpfs" (a
# tmpfs mounted for the run).
# --quick: mem1g-mixed on disk, one run. Default: the memory workloads and
# vmas20k, 3 runs (median).
# --load N: N CPU-bound processes (busy loops) run beside everything timed,
# as on a busy compute node; the table's header says so.
#
# Per workload, storage and run: ckpt dump --kill (durable: ckpt fsyncs) wall
# time, its frozen time (stats.frozen_ms) and image size; caches dropped;
# ckpt restore --detach wall time; the same with `ckpt dump --background` when
# this ckpt has it; CRIU when $CRIU or scripts/build-criu.sh's binary
# (/var/tmp/ckpt-criu/criu/criu/criu) exists: criu dump + fsync of its images,
# frozen time from its stats-dump image, criu restore -d. Every restored
# process checks its memory against the checksum it took at setup; a
# mismatch or a failure is reported and counted, never timed.
# --short-freezes (mem workloads): also a pre-dump, then 5 % of the memory
# rewritten (benchload's SIGUSR2), then `dump --prev --background`: its
# frozen time against the full dump's; and `restore --lazy` of the full
# dump: time-to-running (stats.lazy.running_ms), cold cache.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

runs=3
workloads=mem1g-mixed,mem1g-random,mem4g-mixed,mem4g-random,tree16x256m,vmas20k
storages=disk,tmpfs
disk_root=/var/tmp
json_out=
use_criu=1
short_freezes=0
load=0
usage() { sed -n '2,31p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
	case $1 in
	--quick) runs=1 workloads=mem1g-mixed storages=disk ;;
	--scale) workloads=threads2000,vmas30k,tree64x64m,tree256x1m storages=disk ;;
	--load) load=$2; shift ;;
	--runs) runs=$2; shift ;;
	--workloads) workloads=$2; shift ;;
	--storage) storages=$2; shift ;;
	--disk-dir) disk_root=$2; shift ;;
	--json) json_out=$(realpath -m "$2"); shift ;;
	--no-criu) use_criu=0 ;;
	--short-freezes) short_freezes=1 ;;
	*) usage ;;
	esac
	shift
done
[ "$(id -u)" -eq 0 ] || { echo "bench-dump: needs root (ptrace, drop_caches, tmpfs mount)" >&2; exit 1; }

MIB=1048576
PAGE=$(getconf PAGESIZE)
# Seconds to wait for a workload to be ready or a restored one to report.
READY_TIMEOUT_S=120
# CRIU's stats-dump image: an 8-byte magic pair and a 4-byte length before
# the StatsEntry message (criu/images/stats.proto: dump = 1, in it
# frozen_time = 2, in microseconds).
CRIU_IMG_HEADER_BYTES=12

log() { printf 'bench-dump: %s\n' "$*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.3f", b - a }'; }

# name -> benchload arguments, processes, bytes the workload wrote (what a
# dump must save; dd writes as many).
wl_args() {
	case $1 in
	mem1g-mixed) echo "mem 1024 mixed" ;;
	mem1g-random) echo "mem 1024 random" ;;
	mem4g-mixed) echo "mem 4096 mixed" ;;
	mem4g-random) echo "mem 4096 random" ;;
	tree16x256m) echo "tree 16 256 mixed" ;;
	vmas20k) echo "vmas 20000" ;;
	vmas30k) echo "vmas 30000" ;;
	threads2000) echo "threads 2000" ;;
	tree64x64m) echo "tree 64 64 mixed" ;;
	tree256x1m) echo "tree 256 1 mixed" ;;
	*) log "unknown workload $1"; exit 2 ;;
	esac
}
wl_procs() {
	case $1 in
	tree16x256m) echo 16 ;;
	tree64x64m) echo 64 ;;
	tree256x1m) echo 256 ;;
	*) echo 1 ;;
	esac
}
wl_bytes() {
	case $1 in
	mem1g-mixed) echo $((1024 * MIB * 3 / 4)) ;;
	mem1g-random) echo $((1024 * MIB)) ;;
	mem4g-mixed) echo $((4096 * MIB * 3 / 4)) ;;
	mem4g-random) echo $((4096 * MIB)) ;;
	tree16x256m) echo $((16 * 256 * MIB * 3 / 4)) ;;
	vmas20k) echo $((20000 * PAGE)) ;;
	vmas30k) echo $((30000 * PAGE)) ;;
	threads2000) echo $((4 * MIB * 3 / 4)) ;;
	tree64x64m) echo $((64 * 64 * MIB * 3 / 4)) ;;
	tree256x1m) echo $((256 * MIB * 3 / 4)) ;;
	esac
}
for w in ${workloads//,/ }; do wl_args "$w" >/dev/null; done
for s in ${storages//,/ }; do
	case $s in disk | tmpfs) ;; *) log "unknown storage $s (disk, tmpfs)"; exit 2 ;; esac
done

# --- binaries -------------------------------------------------------------
if [ -z "${CKPT:-}" ]; then
	log "building ckpt (release)"
	cargo build --release --quiet -p ckpt
	CKPT=${CARGO_TARGET_DIR:-$repo/target}/release/ckpt
fi
base=$(mktemp -d "$disk_root/ckpt-bench.XXXXXX")
tmpfs_dir=$base/tmpfs
# The workload (or restored tree) alive now, a process group of its own.
wl_pid=
# The --load busy loops.
hogs=()
cleanup() {
	if [ -n "$wl_pid" ]; then kill -9 -- "-$wl_pid" 2>/dev/null || true; fi
	if [ ${#hogs[@]} -gt 0 ]; then kill -9 "${hogs[@]}" 2>/dev/null || true; fi
	mountpoint -q "$tmpfs_dir" && umount "$tmpfs_dir"
	rm -rf "$base"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
BL=$base/benchload
gcc -O2 -o "$BL" scripts/demo/benchload.c -lpthread

CRIU=${CRIU:-/var/tmp/ckpt-criu/criu/criu/criu}
have_criu=0
if [ "$use_criu" = 1 ] && [ -x "$CRIU" ] && "$CRIU" --version >/dev/null 2>&1; then
	have_criu=1
	criu_version=$("$CRIU" --version | awk '/Version/ { print $2 }')
	log "CRIU $criu_version: $CRIU"
else
	criu_version=
	log "no CRIU (set \$CRIU or run scripts/build-criu.sh): ckpt and baselines only"
fi
have_bg=0
# (Not a pipe into grep -q: under pipefail, ckpt's SIGPIPE would read as "absent".)
dump_help=$("$CKPT" dump --help 2>&1 || true)
if [[ $dump_help == *--background* ]]; then have_bg=1; fi

# --- storage --------------------------------------------------------------
storage_dir() {
	case $1 in
	disk) echo "$base/disk" ;;
	tmpfs) echo "$tmpfs_dir" ;;
	esac
}
mkdir -p "$base/disk"
if [[ ,$storages, == *,tmpfs,* ]]; then
	mkdir -p "$tmpfs_dir"
	mount -t tmpfs -o mode=0700,size=50% ckpt-bench "$tmpfs_dir"
fi

# --- results: one line per figure, "storage workload tool metric value" ----
results=$base/results.tsv
: >"$results"
record() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$results"; }

drop_caches() { sync; echo 3 >/proc/sys/vm/drop_caches; }

# Starts workload $1 in its own session, without stray fds (benchload
# closes fds > 2); sets wl_pid and wl_out.
start_workload() {
	local w=$1 t0
	wl_out=$base/out.$RANDOM$RANDOM
	: >"$wl_out"
	# In a subshell: the workload is not this shell's child (init reaps it,
	# and bash does not report its death).
	# shellcheck disable=SC2046
	(setsid "$BL" $(wl_args "$w") </dev/null >>"$wl_out" 2>&1 &)
	t0=$SECONDS
	until grep -q '^ready' "$wl_out"; do
		if [ $((SECONDS - t0)) -gt $READY_TIMEOUT_S ]; then
			log "$w did not get ready: $(cat "$wl_out")"
			return 1
		fi
		sleep 0.1
	done
	wl_pid=$(awk '/^ready/ { print $2; exit }' "$wl_out")
}

# Waits for the dumped (killed) tree to be gone, so that its pids are free.
wait_gone() {
	local t0=$SECONDS
	while [ -e "/proc/$1" ]; do
		[ $((SECONDS - t0)) -gt $READY_TIMEOUT_S ] && { log "pid $1 still there"; return 1; }
		sleep 0.05
	done
}

# After a restore: every process of the workload checks its memory. Then the
# restored tree is killed.
verify_restored() {
	local w=$1 want t0=$SECONDS ok=0
	want=$(wl_procs "$w")
	kill -USR1 "$wl_pid"
	while [ $((SECONDS - t0)) -le $READY_TIMEOUT_S ]; do
		if grep -q 'verify BAD' "$wl_out"; then break; fi
		if [ "$(grep -c 'verify ok' "$wl_out")" -ge "$want" ]; then ok=1; break; fi
		sleep 0.1
	done
	kill -9 -- "-$wl_pid" 2>/dev/null || true
	wait_gone "$wl_pid" || true
	wl_pid=
	[ $ok = 1 ] || log "$w: restored memory check failed: $(tail -3 "$wl_out" | tr '\n' ' ')"
	[ $ok = 1 ]
}

# One ckpt dump + restore. $3: extra dump option ("" or --background).
run_ckpt() {
	local st=$1 w=$2 opt=$3 tool=ckpt d t0 dump_s restore_s err
	[ -n "$opt" ] && tool=ckpt-bg
	d=$(storage_dir "$st")/ckpt
	rm -rf "$d"
	start_workload "$w" || { record "$st" "$w" "$tool" failed 1; return; }
	log "$st $w $tool: dump of pid $wl_pid"
	t0=$(now)
	# --background leaves the tree running (it does not go with --kill):
	# killed here, after the timed part.
	local end=--kill
	[ -n "$opt" ] && end=$opt
	if ! "$CKPT" dump --tree "$wl_pid" --dir "$d" "$end" --json >"$base/ckpt.json" 2>"$base/ckpt.err"; then
		err=$(tail -1 "$base/ckpt.err")
		log "FAILED: $CKPT dump --tree $wl_pid --dir $d $end --json: $err"
		record "$st" "$w" "$tool" failed 1
		kill -9 -- "-$wl_pid" 2>/dev/null || true
		wait_gone "$wl_pid" || true
		wl_pid=
		return
	fi
	dump_s=$(since "$t0")
	[ -n "$opt" ] && kill -9 -- "-$wl_pid"
	wait_gone "$wl_pid"
	record "$st" "$w" "$tool" dump_s "$dump_s"
	record "$st" "$w" "$tool" frozen_ms "$(jq -r '.stats.frozen_ms' "$base/ckpt.json")"
	record "$st" "$w" "$tool" image_bytes "$(du -sb "$d" | cut -f1)"
	drop_caches
	t0=$(now)
	if ! "$CKPT" restore --dir "$d" --detach >/dev/null 2>"$base/ckpt.err"; then
		log "FAILED: $CKPT restore --dir $d --detach: $(tail -1 "$base/ckpt.err")"
		record "$st" "$w" "$tool" failed 1
		wl_pid=
		rm -rf "$d"
		return
	fi
	restore_s=$(since "$t0")
	if verify_restored "$w"; then
		record "$st" "$w" "$tool" restore_s "$restore_s"
	else
		record "$st" "$w" "$tool" failed 1
	fi
	rm -rf "$d"
}

# --short-freezes: pre-dump, 5 % rewritten, `dump --prev --background`
# (frozen time); then `restore --lazy` of that checkpoint (time-to-running)
# and the memory check once the page server has filled everything.
run_ckpt_short() {
	local st=$1 w=$2 p d stats t0
	p=$(storage_dir "$st")/ckpt-pre
	d=$(storage_dir "$st")/ckpt-inc
	stats=$base/lazy-stats.json
	rm -rf "$p" "$d"
	start_workload "$w" || { record "$st" "$w" ckpt-inc failed 1; return; }
	log "$st $w ckpt-inc: pre-dump, 5 % rewritten, dump --prev --background of pid $wl_pid"
	if ! "$CKPT" dump --tree "$wl_pid" --dir "$p" --pre-dump >/dev/null 2>"$base/ckpt.err"; then
		log "FAILED: pre-dump: $(tail -1 "$base/ckpt.err")"
		record "$st" "$w" ckpt-inc failed 1
		kill -9 -- "-$wl_pid" 2>/dev/null || true
		return
	fi
	kill -USR2 -- "$wl_pid"
	t0=$SECONDS
	until [ "$(grep -c '^rewrote' "$wl_out")" -ge "$(wl_procs "$w")" ]; do
		[ $((SECONDS - t0)) -gt $READY_TIMEOUT_S ] && break
		sleep 0.1
	done
	if ! "$CKPT" dump --tree "$wl_pid" --dir "$d" --prev "$p" --background --json >"$base/ckpt.json" 2>"$base/ckpt.err"; then
		log "FAILED: dump --prev --background: $(tail -1 "$base/ckpt.err")"
		record "$st" "$w" ckpt-inc failed 1
		kill -9 -- "-$wl_pid" 2>/dev/null || true
		return
	fi
	record "$st" "$w" ckpt-inc frozen_ms "$(jq -r '.stats.frozen_ms' "$base/ckpt.json")"
	kill -9 -- "-$wl_pid"
	wait_gone "$wl_pid"
	rm -rf "$p"
	drop_caches
	rm -f "$stats"
	if ! "$CKPT" restore --dir "$d" --lazy --detach --stats-file "$stats" >/dev/null 2>"$base/ckpt.err"; then
		log "FAILED: restore --lazy: $(tail -1 "$base/ckpt.err")"
		record "$st" "$w" ckpt-lazy failed 1
		wl_pid=
		rm -rf "$d"
		return
	fi
	record "$st" "$w" ckpt-lazy running_ms "$(jq -r '.lazy.running_ms' "$stats")"
	t0=$SECONDS
	until [ "$(jq -r '.lazy.resident_ms' "$stats" 2>/dev/null)" != null ]; do
		[ $((SECONDS - t0)) -gt $READY_TIMEOUT_S ] && break
		sleep 0.2
	done
	record "$st" "$w" ckpt-lazy resident_ms "$(jq -r '.lazy.resident_ms // empty' "$stats")"
	verify_restored "$w" || record "$st" "$w" ckpt-lazy failed 1
	rm -rf "$d"
}

# CRIU's frozen time in ms, from its stats-dump image: crit when it runs
# (it needs the generated Python modules next to the binary), else the raw
# protobuf decoded by protoc.
criu_frozen_ms() {
	local img=$1/stats-dump src us
	src=$(dirname "$(dirname "$CRIU")")
	us=$(PYTHONPATH=$src/lib:$src/crit /usr/bin/python3 -m crit show "$img" 2>/dev/null |
		jq -r '.entries[0].dump.frozen_time' 2>/dev/null) || us=
	if [ -z "$us" ] || [ "$us" = null ]; then
		us=$(tail -c +$((CRIU_IMG_HEADER_BYTES + 1)) "$img" | protoc --decode_raw 2>/dev/null |
			awk '$1 == "2:" { print $2; exit }')
	fi
	awk -v us="$us" 'BEGIN { printf "%.1f", us / 1000 }'
}

run_criu() {
	local st=$1 w=$2 d t0 dump_s restore_s
	d=$(storage_dir "$st")/criu
	rm -rf "$d"
	mkdir -p "$d"
	start_workload "$w" || { record "$st" "$w" criu failed 1; return; }
	log "$st $w criu: dump of pid $wl_pid"
	t0=$(now)
	# CRIU does not fsync its images: sync them (and the directory) like
	# ckpt does, inside the timed part.
	if ! { "$CRIU" dump -t "$wl_pid" -D "$d" --shell-job -o dump.log && sync "$d"/* "$d"; }; then
		log "FAILED: $CRIU dump -t $wl_pid -D $d --shell-job: $(grep Error "$d/dump.log" | grep -v RLIMIT_NOFILE | tail -1)"
		record "$st" "$w" criu failed 1
		kill -9 -- "-$wl_pid" 2>/dev/null || true
		wait_gone "$wl_pid" || true
		wl_pid=
		return
	fi
	dump_s=$(since "$t0")
	wait_gone "$wl_pid"
	record "$st" "$w" criu dump_s "$dump_s"
	record "$st" "$w" criu frozen_ms "$(criu_frozen_ms "$d")"
	record "$st" "$w" criu image_bytes "$(du -sb --exclude=dump.log "$d" | cut -f1)"
	drop_caches
	t0=$(now)
	if ! "$CRIU" restore -D "$d" -d --shell-job -o restore.log; then
		log "FAILED: $CRIU restore -D $d -d --shell-job: $(grep Error "$d/restore.log" | grep -v RLIMIT_NOFILE | tail -1)"
		record "$st" "$w" criu failed 1
		wl_pid=
		rm -rf "$d"
		return
	fi
	restore_s=$(since "$t0")
	if verify_restored "$w"; then
		record "$st" "$w" criu restore_s "$restore_s"
	else
		record "$st" "$w" criu failed 1
	fi
	rm -rf "$d"
}

# The limits of the machine for the same bytes: dd + fsync to the same
# storage, and memcpy. dd writes while the workload holds its memory, as
# every dump does: on a VM that hands freed memory back to its host, fresh
# pages then cost several times more (2 GiB into tmpfs: 1.6-1.8 s alone,
# 6.8 s beside a 4 GiB workload).
run_baselines() {
	local st=$1 w=$2 bytes f t0
	bytes=$(wl_bytes "$w")
	f=$(storage_dir "$st")/raw
	start_workload "$w" || { record "$st" "$w" dd failed 1; return; }
	drop_caches
	t0=$(now)
	dd if=/dev/zero of="$f" bs=1M count="$bytes" iflag=count_bytes conv=fsync status=none
	record "$st" "$w" dd write_s "$(since "$t0")"
	kill -9 -- "-$wl_pid" 2>/dev/null || true
	wait_gone "$wl_pid" || true
	wl_pid=
	rm -f "$f"
	record "$st" "$w" memcpy copy_s "$("$BL" memcpy $(((bytes + MIB - 1) / MIB)) | cut -d' ' -f1)"
}

# --- the runs -------------------------------------------------------------
for ((i = 0; i < load; i++)); do
	# Each in its own session: not part of any dumped tree.
	setsid sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 &
	hogs+=($!)
done
[ "$load" -gt 0 ] && log "$load CPU-bound processes run beside the benchmark"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
log "load average before: $load_before; $(nproc) CPUs; runs: $runs"
started=$(now)
for st in ${storages//,/ }; do
	for w in ${workloads//,/ }; do
		for ((r = 1; r <= runs; r++)); do
			log "=== $st $w run $r/$runs"
			run_ckpt "$st" "$w" ""
			[ $have_criu = 1 ] && run_criu "$st" "$w"
			[ $have_bg = 1 ] && run_ckpt "$st" "$w" --background
			[ $short_freezes = 1 ] && [[ $w == mem* ]] && run_ckpt_short "$st" "$w"
			run_baselines "$st" "$w"
		done
	done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
log "done in $(since "$started") s; load average after: $load_after"

# --- medians, tables, JSON ------------------------------------------------
# medians.tsv: storage workload tool metric median n(values) values(comma)
sort -k1,1 -k2,2 -k3,3 -k4,4 -k5,5g "$results" | awk -F'\t' -v OFS='\t' '
	function flush() {
		if (key == "") return
		m = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
		if (metric == "failed") m = n
		print s, w, t, metric, m, n, list
	}
	{ k = $1 FS $2 FS $3 FS $4
	  if (k != key) { flush(); key = k; n = 0; list = ""; s = $1; w = $2; t = $3; metric = $4 }
	  v[++n] = $5; list = list (n > 1 ? "," : "") $5 }
	END { flush() }' >"$base/medians.tsv"

echo "ckpt $(git -C "$repo" describe --always --dirty 2>/dev/null || echo '?'), CRIU ${criu_version:-absent}; $(nproc) CPUs, $(uname -r);" \
	"load average $load_before before, $load_after after; $load CPU-bound process(es) beside; median of $runs run(s)"
for st in ${storages//,/ }; do
	echo
	echo "storage: $st ($([ "$st" = disk ] && echo "$base/disk on $(df --output=source "$base" | tail -1)" || echo tmpfs))"
	awk -F'\t' -v st="$st" -v wls="$workloads" -v bg="$have_bg" -v MIB=$MIB '
		$1 == st { m[$2, $3, $4] = $5 }
		$1 == "bytes" { wb[$2] = $3 }
		function g(w, t, k) { return ((w, t, k) in m) ? m[w, t, k] : "" }
		function f(x, fmt) { return x == "" ? "–" : sprintf(fmt, x) }
		function mib(x) { return x == "" ? "–" : sprintf("%.0f", x / MIB) }
		function ratio(a, b) { return (a == "" || b == "" || b == 0) ? "–" : sprintf("%.2f", a / b) }
		function fail(w, t) { return g(w, t, "failed") == "" ? "" : " (" t " failed " g(w, t, "failed") "×)" }
		END {
			printf "| workload | MiB | memcpy s | dd s | dump s ckpt / criu | criu/ckpt | ckpt vs dd |"
			printf " frozen ms ckpt / criu | restore s ckpt / criu | criu/ckpt | image MiB ckpt / criu |"
			if (bg) printf " ckpt --background dump s / frozen ms |"
			printf "\n|---|---|---|---|---|---|---|---|---|---|---|"
			if (bg) printf "---|"
			printf "\n"
			n = split(wls, ws, ",")
			for (i = 1; i <= n; i++) {
				w = ws[i]
				printf "| %s | %.0f | %s | %s | %s / %s%s%s | %s | %s | %s / %s | %s / %s | %s | %s / %s |", w,
					wb[w] / MIB, f(g(w, "memcpy", "copy_s"), "%.2f"), f(g(w, "dd", "write_s"), "%.2f"),
					f(g(w, "ckpt", "dump_s"), "%.2f"), f(g(w, "criu", "dump_s"), "%.2f"),
					fail(w, "ckpt"), fail(w, "criu"),
					ratio(g(w, "criu", "dump_s"), g(w, "ckpt", "dump_s")),
					ratio(g(w, "dd", "write_s"), g(w, "ckpt", "dump_s")),
					f(g(w, "ckpt", "frozen_ms"), "%.0f"), f(g(w, "criu", "frozen_ms"), "%.0f"),
					f(g(w, "ckpt", "restore_s"), "%.2f"), f(g(w, "criu", "restore_s"), "%.2f"),
					ratio(g(w, "criu", "restore_s"), g(w, "ckpt", "restore_s")),
					mib(g(w, "ckpt", "image_bytes")), mib(g(w, "criu", "image_bytes"))
				if (bg) printf " %s / %s%s |", f(g(w, "ckpt-bg", "dump_s"), "%.2f"),
					f(g(w, "ckpt-bg", "frozen_ms"), "%.0f"), fail(w, "ckpt-bg")
				printf "\n"
			}
		}' <(for w in ${workloads//,/ }; do printf 'bytes\t%s\t%s\n' "$w" "$(wl_bytes "$w")"; done) "$base/medians.tsv"
done
if [ $short_freezes = 1 ]; then
	echo
	echo "short freezes (mem workloads): full dump frozen, pre-dump + 5 % rewritten + dump --prev --background frozen, restore --lazy of it (cold cache)"
	echo
	echo "| storage | workload | full dump frozen ms | --prev --background frozen ms | ratio | --lazy running ms | --lazy resident ms |"
	echo "|---|---|---|---|---|---|---|"
	awk -F'\t' '
		{ m[$1, $2, $3, $4] = $5; seen[$1, $2] = 1; if (!(($1, $2) in order)) { order[$1, $2] = ++n; key[n] = $1 SUBSEP $2 } }
		function g(s, w, t, k) { return ((s, w, t, k) in m) ? m[s, w, t, k] : "" }
		function f(x) { return x == "" ? "–" : sprintf("%.0f", x) }
		END {
			for (i = 1; i <= n; i++) {
				split(key[i], sw, SUBSEP)
				s = sw[1]; w = sw[2]
				inc = g(s, w, "ckpt-inc", "frozen_ms")
				if (inc == "") continue
				full = g(s, w, "ckpt", "frozen_ms")
				printf "| %s | %s | %s | %s | %s | %s | %s |\n", s, w, f(full), f(inc),
					(full == "" || full == 0) ? "–" : sprintf("%.2f", inc / full),
					f(g(s, w, "ckpt-lazy", "running_ms")), f(g(s, w, "ckpt-lazy", "resident_ms"))
			}
		}' "$base/medians.tsv"
fi
echo
echo "dump: wall time to durable images (ckpt fsyncs; CRIU's images are fsynced after it);" \
	"ckpt vs dd = dd's time / ckpt's (> 1: faster than writing the same bytes raw);" \
	"criu/ckpt > 1: ckpt faster. Restore: cold page cache, until the tree runs."

if [ -n "$json_out" ]; then
	jq -n --rawfile tsv "$base/medians.tsv" \
		--arg ckpt "$(git -C "$repo" describe --always --dirty 2>/dev/null || echo '?')" \
		--arg criu "$criu_version" --arg kernel "$(uname -r)" --argjson cpus "$(nproc)" \
		--arg load_before "$load_before" --arg load_after "$load_after" --argjson runs "$runs" \
		--argjson hogs "$load" '
		{ ckpt: $ckpt, criu: (if $criu == "" then null else $criu end), kernel: $kernel, cpus: $cpus,
		  load_before: $load_before, load_after: $load_after, cpu_bound_beside: $hogs, runs: $runs,
		  results: [ $tsv | split("\n")[] | select(length > 0) | split("\t")
			| { storage: .[0], workload: .[1], tool: .[2], metric: .[3],
			    median: (.[4] | tonumber), values: (.[6] | split(",") | map(tonumber)) } ] }' >"$json_out"
	log "figures written to $json_out"
fi
