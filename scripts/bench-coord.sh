#!/bin/sh
# Coordinator benchmark (not part of the test suite): simulated agents multiplexed in a
# few processes against one coordinator (flat) and through 64 sub-coordinators (tree).
# Prints one table row per (mode, agent count). In tree mode the agents reach their
# sub-coordinator over its Unix socket; `--agent-hop tcp` uses loopback TCP instead.
# Extra arguments go to the bench, e.g.
#   scripts/bench-coord.sh --agents 16384 --mode tree --subs 64 --procs 4 [--agent-hop tcp]
set -eu
cd "$(dirname "$0")/.."
if [ "$#" -eq 0 ]; then
    set -- --agents 1024,4096,16384 --mode both --subs 64 --procs 4
fi
exec cargo run --release -q -p ckpt-coord --example bench -- "$@"
