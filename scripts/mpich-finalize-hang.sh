#!/usr/bin/env bash
# MPICH's MPI_Finalize over UCX's TCP transport (a diagnostic, not a test; run by hand,
# as root): the ring of tests/c/mpi_job.c on two fake nodes of this host, RANKS ranks
# PPN a node, RUNS times, without ckpt or Slurm. Each fake node is what a lab part is:
# hydra's ssh launcher is a script that starts the node's hydra_pmi_proxy in new UTS,
# IPC, PID and mount namespaces named after the node, so UCX keeps its shared-memory
# transports inside a node and the nodes talk TCP, and MPICH's own shared memory joins
# only the ranks of one node. A run that has not ended after TIMEOUT seconds is counted
# as a hang, its stacks are printed once (with --stacks) and its process group killed.
# VAR=VALUE words are set for mpiexec and the ranks, to try a setting. --mpich PREFIX
# takes mpicc and mpiexec.hydra from PREFIX/bin (an MPICH built or pip-installed there)
# instead of Debian's mpicc.mpich and mpiexec.mpich.
#
#   scripts/mpich-finalize-hang.sh [--mpich PREFIX] [--runs R] [--np RANKS] [--ppn PPN]
#                                  [--timeout S] [--stacks] [VAR=VALUE...]
#   defaults: Debian's MPICH, 10 runs, 4 ranks, 2 a node, 10 s. Exit status 0 if no
#   run hung.
#
# Debian 12 (MPICH 4.0.2, UCX 1.13.1), 4 ranks 2 a node: most runs hang, whatever was
# set; 2 ranks 1 a node: none did. MPICH 5.0.2 from pip (--mpich), 4 ranks 2 a node:
# none did. docs/slurm.md, "MPI jobs", says why.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=10 np=4 ppn=2 timeout=10 stacks=0
mpicc=mpicc.mpich mpiexec=mpiexec.mpich
usage="usage: $0 [--mpich PREFIX] [--runs R] [--np RANKS] [--ppn PPN] [--timeout S] [--stacks] [VAR=VALUE...]"
while [ $# -gt 0 ]; do
	case "$1" in
	--mpich) mpicc=$2/bin/mpicc mpiexec=$2/bin/mpiexec.hydra; shift 2 ;;
	--runs) runs=$2; shift 2 ;;
	--np) np=$2; shift 2 ;;
	--ppn) ppn=$2; shift 2 ;;
	--timeout) timeout=$2; shift 2 ;;
	--stacks) stacks=1; shift ;;
	*=*) break ;;
	*) echo "$usage" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" -eq 0 ] || { echo "$0: needs root (unshare for the fake nodes)" >&2; exit 1; }
for tool in "$mpicc" "$mpiexec" unshare; do
	command -v "$tool" >/dev/null || { echo "$0: no $tool on PATH" >&2; exit 1; }
done

work=$(mktemp -d /var/tmp/ckpt-mpich-finalize.XXXXXX)
trap 'rm -rf "$work"' EXIT
version=$("$mpiexec" -info 2>/dev/null | sed -n 's/^ *Version: *//p' | head -1)
"$mpicc" -O1 -o "$work/ring" tests/c/mpi_job.c -lm -pthread

# hydra calls "ssh -x NODE PROXY ARGS...": the proxy runs here, in the node's namespaces.
cat >"$work/ssh" <<'EOF'
#!/bin/sh
[ "$1" = -x ] && shift
node=$1
shift
exec unshare --uts --ipc --pid --fork --mount-proc /bin/sh -c 'hostname "$0" && eval "exec $*"' "$node" "$@"
EOF
chmod +x "$work/ssh"

nodes=$(( (np + ppn - 1) / ppn ))
hosts=$(seq -s, -f 'fake%g' 1 "$nodes")
ok=0 hung=0 failed=0
for run in $(seq 1 "$runs"); do
	rm -f "$work/result"
	# Its own session, so a hung run's every process is killed by its group.
	setsid env HYDRA_IFACE=lo HYDRA_LAUNCHER=ssh HYDRA_LAUNCHER_EXEC="$work/ssh" "$@" \
		"$mpiexec" -hosts "$hosts" -ppn "$ppn" -np "$np" "$work/ring" "$work" 200 1000 \
		</dev/null >"$work/out" 2>&1 &
	job=$!
	deadline=$(( SECONDS + timeout ))
	while kill -0 "$job" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
	result=$(cat "$work/result" 2>/dev/null || echo "no result")
	if kill -0 "$job" 2>/dev/null; then
		hung=$((hung + 1))
		echo "run $run: hung ($result)"
		if [ "$stacks" = 1 ] && command -v gdb >/dev/null; then
			for rank in $(pgrep -f "^$work/ring "); do
				echo "--- rank process $rank"
				gdb -p "$rank" -batch -ex bt 2>/dev/null | grep '^#' || true
			done
			stacks=0
		fi
		kill -KILL -- "-$job"
		wait "$job" 2>/dev/null || true
	elif wait "$job" && [[ $result == PASS* ]]; then
		ok=$((ok + 1))
		echo "run $run: ended ($result)"
	else
		failed=$((failed + 1))
		echo "run $run: failed ($result)"
		tail -5 "$work/out"
	fi
done
echo "MPICH ${version:-?}, $np ranks, $ppn a node${*:+, $*}: $ok ended, $hung hung, $failed failed"
[ "$hung" -eq 0 ]
