#!/usr/bin/env bash
# Builds CRIU (tag v4.2, or the newest v4.x tag present) from source for the
# side-by-side benchmark (scripts/bench-dump.sh), and prints the path of the
# `criu` binary. Idempotent: an existing build is reused. Slow (minutes): not
# for CI.
#   scripts/build-criu.sh [CACHE_DIR] [CRIU_GIT_DIR]
#     CACHE_DIR     default /var/tmp/ckpt-criu; the binary is CACHE_DIR/criu/criu/criu
#     CRIU_GIT_DIR  a clone (bare or not) of github.com/checkpoint-restore/criu;
#                   default: clone it into CACHE_DIR/criu.git
# Debian's criu 3.17 cannot dump on recent kernels (it fails on the
# [vvar_vclock] vDSO area), hence a source build.
set -euo pipefail
cache=${1:-/var/tmp/ckpt-criu}
src_git=${2:-}
want_tag=v4.2
work=$cache/criu
bin=$work/criu/criu
log() { printf 'build-criu: %s\n' "$*" >&2; }

if [ -x "$bin" ] && "$bin" --version >/dev/null 2>&1; then
	log "already built: $("$bin" --version | head -1)"
	echo "$bin"
	exit 0
fi
mkdir -p "$cache"

# Build dependencies (what v4.2's Makefile.config and contrib/dependencies
# ask for, minus the optional plugins: no amdgpu/cuda, no GnuTLS, no docs).
deps=(build-essential git pkg-config python3 python3-protobuf
	libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
	libcap-dev libnl-3-dev libnl-route-3-dev libnet1-dev libbsd-dev
	libnftables-dev uuid-dev iptables)
missing=()
for p in "${deps[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi

if [ -z "$src_git" ]; then
	src_git=$cache/criu.git
	[ -d "$src_git" ] || git clone --bare --quiet https://github.com/checkpoint-restore/criu "$src_git"
fi
tag=$want_tag
if ! git --git-dir="$src_git" rev-parse -q --verify "refs/tags/$tag" >/dev/null; then
	tag=$(git --git-dir="$src_git" tag -l 'v4.*' | sort -V | tail -1)
	[ -n "$tag" ] || { log "no v4.x tag in $src_git"; exit 1; }
	log "no $want_tag tag; building $tag"
fi
if [ ! -d "$work" ]; then
	log "checking out $tag into $work"
	mkdir -p "$work"
	git --git-dir="$src_git" archive --format=tar "$tag" | tar -x -C "$work"
fi
log "building $tag (a few minutes)"
# NO_GNUTLS: TLS of page-server traffic is not used here.
make -C "$work" -j"$(nproc)" NO_GNUTLS=1 criu >"$cache/build.log" 2>&1 ||
	{ tail -30 "$cache/build.log" >&2; log "build failed: see $cache/build.log"; exit 1; }
# crit (reads CRIU's stats images) needs the generated Python protobuf modules.
make -C "$work" NO_GNUTLS=1 crit >>"$cache/build.log" 2>&1 || log "crit not built (see $cache/build.log); frozen time falls back to the dump log"
"$bin" --version >&2
echo "$bin"
