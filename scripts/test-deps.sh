#!/usr/bin/env bash
# Installs what ckpt's tests need on Debian (as root), and nothing when all
# of it is there already.
#   scripts/test-deps.sh          the fast tier: gcc and libc headers (the C
#                                 test victims, the parasite blob),
#                                 libibverbs headers (the verbs shadow layer
#                                 is built by `cargo test --workspace`),
#                                 python3, iproute2, util-linux, passwd,
#                                 nftables (the TCP network lock)
#   scripts/test-deps.sh --lab    also the lab tier: Slurm and munge, Open MPI
#                                 and libpmix, redis, tmux, make, perftest, the
#                                 SoftRoCE QEMU guests (scripts/ib-vm.sh setup),
#                                 Lua's source (scripts/fetch-src.sh) and
#                                 MPICH 5 from PyPI in a venv (CKPT_PIP_MPICH,
#                                 default /opt/ckpt-mpich)
set -euo pipefail
cd "$(dirname "$0")/.."

lab=0
case "${1:-}" in
"") ;;
--lab) lab=1 ;;
*)
	echo "usage: scripts/test-deps.sh [--lab]" >&2
	exit 2
	;;
esac

need=()
have_cmd() { command -v "$1" >/dev/null 2>&1; }
have_cmd gcc || need+=(gcc)
[ -e /usr/include/stdio.h ] || need+=(libc6-dev)
[ -e /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
[ -x /usr/bin/python3 ] || need+=(python3)
have_cmd ip || need+=(iproute2)
[ -x /usr/sbin/nft ] || have_cmd nft || need+=(nftables)
have_cmd unshare || need+=(util-linux)
have_cmd useradd || need+=(passwd)
if [ "$lab" = 1 ]; then
	# Real programs (tests/programs.rs): Debian's Python, redis, Open MPI,
	# tmux; MPICH beside Open MPI (tests/slurm.rs; Open MPI stays the
	# default mpirun).
	have_cmd redis-server || need+=(redis-server)
	have_cmd tmux || need+=(tmux)
	have_cmd make || need+=(make)
	have_cmd mpirun || need+=(openmpi-bin)
	have_cmd mpicc || need+=(libopenmpi-dev)
	have_cmd mpiexec.mpich || need+=(mpich)
	have_cmd mpicc.mpich || need+=(libmpich-dev)
	# The venv of MPICH from PyPI (below).
	dpkg -s python3-venv >/dev/null 2>&1 || need+=(python3-venv)
	# The Slurm lab (scripts/slurm/lab-up.sh).
	[ -x /usr/sbin/slurmctld ] || need+=(slurm-wlm)
	[ -x /usr/sbin/munged ] || need+=(munge)
	# The coordinator's PMIx backend (coord feature `pmix`).
	dpkg -s libpmix-dev >/dev/null 2>&1 || need+=(libpmix-dev)
	dpkg -s libpmix-bin >/dev/null 2>&1 || need+=(libpmix-bin)
	# Real verbs programs under the shadow layer (ib-state/shadow/tests/rxe.rs).
	have_cmd ib_send_bw || need+=(perftest)
fi

if [ ${#need[@]} -gt 0 ]; then
	if [ "$(id -u)" != 0 ] || ! have_cmd apt-get; then
		echo "test-deps.sh: missing packages: ${need[*]} (install them as root with apt-get)" >&2
		exit 1
	fi
	echo "test-deps.sh: installing ${need[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ "$lab" = 1 ]; then
	# The SoftRoCE guests of tests/lab_vm.rs and the IB crates' lab tests,
	# and the second guest kernel of the vDSO proxy test (Debian's newest
	# 6.12; the default guest stays 6.1).
	scripts/ib-vm.sh setup
	scripts/ib-vm.sh setup --kernel 6.12
	# A real C project for `make -j4` under ckpt (tests/programs.rs).
	scripts/fetch-src.sh lua5.4 >/dev/null
	# MPICH 5 as users install it with pip, for two ranks a node
	# (tests/slurm_users.rs), which Debian's MPICH 4.0 cannot finalize
	# (docs/slurm.md, "MPI jobs"). The wheel is relocatable: its mpicc,
	# mpiexec and hydra_pmi_proxy find their libraries from where they
	# are. Readable by the lab's ordinary user whatever root's umask.
	pip_mpich=${CKPT_PIP_MPICH:-/opt/ckpt-mpich}
	pip_mpich_version=5.0.2
	# Absent on a fresh machine: under pipefail that is not an error here.
	have=$("$pip_mpich/bin/mpichversion" 2>/dev/null | sed -n 's/^MPICH Version:[[:space:]]*//p' || true)
	if [ "$have" != "$pip_mpich_version" ]; then
		echo "test-deps.sh: installing MPICH $pip_mpich_version from PyPI into $pip_mpich" >&2
		(
			umask 022
			python3 -m venv "$pip_mpich"
			"$pip_mpich/bin/python" -m pip install -q --disable-pip-version-check "mpich==$pip_mpich_version"
		)
	fi
fi
