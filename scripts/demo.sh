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
	# setsid -f: the program is not this shell's job, so the shell prints
	# no "Killed" notice when the dump ends it.
	exec setsid -f "$work/counter" </dev/null >"$work/out.log" 2>&1
)
until pid=$(awk 'NR == 1 { print $2 }' "$work/out.log" 2>/dev/null) && [ -n "$pid" ]; do sleep 0.1; done
sleep 1.2
tail -n 2 "$work/out.log"

echo "== ckpt dump --tree $pid --dir $work/img --kill"
"$CKPT" dump --tree "$pid" --dir "$work/img" --kill
"$CKPT" show "$work/img" | head -n 8
gone() { [ ! -e "/proc/$1" ] || grep -q '^State:.*[ZX]' "/proc/$1/status" 2>/dev/null; }
for _ in $(seq 50); do gone "$pid" && break; sleep 0.1; done
echo "   (pid $pid is gone: $(gone "$pid" && echo killed || echo still running))"
sleep 1

echo "== ckpt restore --dir $work/img --detach"
"$CKPT" restore --dir "$work/img" --detach
sleep 1.2
echo "== the restored program carries on:"
tail -n 4 "$work/out.log"
ok=0
grep -q "pid $pid tick" <(tail -n 1 "$work/out.log") && ok=1
kill "$pid" 2>/dev/null || true
for _ in $(seq 50); do gone "$pid" && break; sleep 0.1; done
if [ "$ok" = 1 ]; then
	echo "== OK: same pid, counter continued (demo program stopped)"
else
	echo "== FAILED: the restored program did not carry on" >&2
	exit 1
fi
