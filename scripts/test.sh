#!/usr/bin/env bash
# Runs ckpt's tests, after installing what they need (scripts/test-deps.sh).
#   scripts/test.sh              the fast tier: unit, engine and single-node
#                                end-to-end tests (`cargo test --workspace`,
#                                with 10 s of image fuzzing)
#   scripts/test.sh --lab        the fast tier, then the lab tier
#   scripts/test.sh --lab-only   the lab tier only: QEMU guests (InfiniBand
#                                over SoftRoCE, the vDSO proxy, older
#                                kernels), the Slurm lab, multi-node jobs,
#                                real programs, the coordinator's PMIx
#                                backend and a minute of image fuzzing
# End-to-end tests need root. Extra arguments go to every `cargo test`
# (e.g. `-- --test-threads 1`).
set -euo pipefail
cd "$(dirname "$0")/.."

fast=1 lab=0
case "${1:-}" in
--lab)
	lab=1
	shift
	;;
--lab-only)
	fast=0 lab=1
	shift
	;;
esac

if [ "$lab" = 1 ]; then
	scripts/test-deps.sh --lab
else
	scripts/test-deps.sh
fi

if [ "$fast" = 1 ]; then
	cargo test --workspace "$@"
fi
if [ "$lab" = 1 ]; then
	# The lab's test targets are `test = false` in their Cargo.toml: run by
	# name only.
	cargo test -p ckpt --test lab_vm --test lab_slurm --test lab_nodes "$@"
	cargo test -p ckpt-ib-state --test verbs "$@"
	cargo test -p ckpt-ib-shadow --test rxe "$@"
	CKPT_FUZZ_SECS=60 cargo test -p ckpt-image --test fuzz "$@"
	CKPT_REQUIRE_PMIX=1 cargo test -p ckpt-coord --features pmix "$@"
fi
