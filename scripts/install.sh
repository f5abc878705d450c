#!/usr/bin/env bash
# Installs ckpt: the prerequisites the build needs (gcc links the parasite
# blob), then the release binary into PREFIX/bin (default /usr/local).
#   scripts/install.sh [PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-/usr/local}

if ! command -v cargo >/dev/null 2>&1; then
	echo "install.sh: cargo not found: install a Rust toolchain (1.88+, e.g. with rustup) first" >&2
	exit 1
fi
need=()
command -v gcc >/dev/null 2>&1 || need+=(gcc)
[ -e /usr/include/stdio.h ] || need+=(libc6-dev)
if [ ${#need[@]} -gt 0 ]; then
	if command -v apt-get >/dev/null 2>&1; then
		export DEBIAN_FRONTEND=noninteractive
		apt-get update -qq
		apt-get install -y -qq "${need[@]}"
	else
		echo "install.sh: please install: ${need[*]}" >&2
		exit 1
	fi
fi

cargo install --locked --path ckpt --root "$prefix"
echo "installed $prefix/bin/ckpt"
# Generated from the same definitions as the parser, so they match it.
mkdir -p "$prefix/share/bash-completion/completions" "$prefix/share/man/man1"
"$prefix/bin/ckpt" completions bash >"$prefix/share/bash-completion/completions/ckpt"
"$prefix/bin/ckpt" man "$prefix/share/man/man1"
echo "installed bash completion and man pages under $prefix/share"
# Bash reads that completion only through the bash-completion package's
# loader; without it the file is never sourced.
if [ ! -r /usr/share/bash-completion/bash_completion ]; then
	echo "install.sh: bash completion for ckpt needs the bash-completion package (Debian: apt-get install bash-completion), then a new shell" >&2
fi
"$prefix/bin/ckpt" check || echo "install.sh: some kernel features are missing (see above)" >&2
