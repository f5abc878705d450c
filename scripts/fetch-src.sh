#!/usr/bin/env bash
# Fetches the source of a Debian package nobody here wrote, for the tests
# that build a real project under ckpt (tests/programs.rs: `make -j4` of
# Lua), and unpacks its upstream tarball once:
#   scripts/fetch-src.sh PACKAGE    ->  $CKPT_SRC_CACHE/PACKAGE/<upstream dir>
# Prints the unpacked directory. The host's apt lists name binary packages
# only: the source index is fetched into the cache, beside the system's.
# Environment: CKPT_SRC_CACHE (default /var/cache/ckpt-src).
set -euo pipefail
pkg=${1:?usage: scripts/fetch-src.sh PACKAGE}
cache=${CKPT_SRC_CACHE:-/var/cache/ckpt-src}
dest=$cache/$pkg
if [ -s "$dest/unpacked" ] && [ -d "$dest/$(cat "$dest/unpacked")" ]; then
	echo "$dest/$(cat "$dest/unpacked")"
	exit 0
fi
mkdir -p "$cache/lists/partial" "$dest"
list=$cache/sources.list
# The suite the host's own apt sources name (bookworm here).
suite=$(. /etc/os-release && echo "${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}")
echo "deb-src http://deb.debian.org/debian $suite main" >"$list"
apt=(apt-get -qq -o Dir::Etc::sourcelist="$list" -o Dir::Etc::sourceparts=-
	-o Dir::State::Lists="$cache/lists" -o APT::Get::List-Cleanup=0)
"${apt[@]}" update >&2
tmp=$(mktemp -d "$dest/fetch.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && "${apt[@]}" source --download-only "$pkg" >&2 2>/dev/null)
orig=$(find "$tmp" -maxdepth 1 -name '*.orig.tar.*' -print -quit)
[ -n "$orig" ] || {
	echo "fetch-src.sh: $pkg: no upstream tarball among $(ls "$tmp")" >&2
	exit 1
}
tar -tf "$orig" >"$tmp/contents"
top=$(head -n1 "$tmp/contents" | cut -d/ -f1)
rm -rf "${dest:?}/$top"
tar -xf "$orig" -C "$dest"
echo "$top" >"$dest/unpacked"
echo "$dest/$top"
