#!/usr/bin/env bash
# The ckpt demo: start a sample program, checkpoint it, kill it, restore it
# from the images and show it carrying on with the same pid and counter.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet -p ckpt
CKPT=$PWD/target/release/ckpt
work=$(mktemp -d /tmp/ckpt-demo.XXXXXX)
trap 'kill -9 "${pid:-0}" 2>/dev/null || true; rm -rf "$work"' EXIT
gcc -O1 -o "$work/counter" scripts/demo/counter.c

echo "== ckpt check"
"$CKPT" check || true

echo "== starting the sample program (output in $work/out.log)"
# No terminal or pipe fds: this version restores files, /dev/null and ttys.
# Close whatever else this shell inherited (CI runners leave pipes open).
(
	for fd in /proc/$BASHPID/fd/*; do
		fd=${fd##*/}
		[ "$fd" -gt 2 ] && eval "exec $fd>&-" 2>/dev/null || true
	done
	exec setsid "$work/counter" </dev/null >"$work/out.log" 2>&1
) &
pid=$!
sleep 1.2
tail -n 2 "$work/out.log"

echo "== ckpt dump --tree $pid --dir $work/img --kill"
"$CKPT" dump --tree "$pid" --dir "$work/img" --kill
"$CKPT" show "$work/img" | head -n 8
wait "$pid" 2>/dev/null || true
echo "   (pid $pid is gone: $(kill -0 "$pid" 2>/dev/null && echo still running || echo killed))"
sleep 1

echo "== ckpt restore --dir $work/img --detach"
"$CKPT" restore --dir "$work/img" --detach
sleep 1.2
echo "== the restored program carries on:"
tail -n 4 "$work/out.log"
grep -q "pid $pid tick" <(tail -n 1 "$work/out.log") && echo "== OK: same pid, counter continued"
