#!/usr/bin/env bash
# SoftRoCE VM harness: real InfiniBand verbs (rdma_rxe) on a machine whose
# own kernel has no RDMA.
#
#   scripts/ib-vm.sh setup [--kernel SERIES]
#       Install the host packages, fetch Debian's 6.1 kernel (CONFIG_RDMA_RXE=m)
#       and build an initramfs for it, once per kernel version. With
#       --kernel SERIES (such as 6.12): the newest Debian kernel of that
#       series instead (tests/vdso_proxy.rs restores on 6.12 what 6.1
#       dumped); the default kernel stays what it was.
#   scripts/ib-vm.sh run [--kernel SERIES] [--timeout S] [--scratch DIR] -- CMD ARGS...
#       Boot the kernel under QEMU (TCG), create rxe0 on a veth, run CMD
#       chrooted into the host's / (read-only over 9p), power off, print CMD's
#       output and exit with its status.
#
# CMD runs as root in the host tree, so binaries built on the host run
# unchanged. DIR (default: a fresh temporary directory, removed afterwards)
# is shared writable at the same path, and CMD runs with it as its working
# directory and in $CKPT_IB_SCRATCH; everything else but /tmp (a tmpfs of
# the guest's: a CMD under the host's /tmp is run from a copy) is
# read-only. Exit status 124 means the VM timed out, 125 a harness failure.
#
# Environment: CKPT_IB_CACHE (default /var/cache/ckpt-ib), CKPT_IB_KERNEL
# (a Debian kernel ABI such as 6.1.0-56-amd64 or 6.12.117+deb12-amd64;
# default: the one already built, else the newest 6.1 the archive offers).
# Only the default choice is recorded in $CKPT_IB_CACHE/current, which every
# run without --kernel or CKPT_IB_KERNEL boots: a kernel asked for by name or
# series never becomes the others' default.
set -euo pipefail

CACHE=${CKPT_IB_CACHE:-/var/cache/ckpt-ib}
# The kernel modules the guest loads; their dependencies are resolved from
# each module's own `depends=` (the deb ships no modules.dep).
# crc32_generic: rdma_rxe fails with "failed to init crc32 algorithm"
# without a crc32 provider, and nothing depends on it by name.
# unix_diag, inet_diag, tcp_diag: ckpt reads sockets through sock_diag when
# it checkpoints a job in the guest.
# virtio_net: the link between two guests (run --link).
GUEST_MODULES=(virtio_pci 9pnet_virtio 9p veth virtio_net crc32_generic ib_uverbs rdma_rxe unix_diag inet_diag tcp_diag)
HARNESS_FAILURE=125

die() {
	echo "ib-vm: $*" >&2
	exit "$HARNESS_FAILURE"
}

# Host packages: QEMU, a static busybox for the initramfs, and the rdma tool
# and verbs providers the guest uses from the host tree.
install_packages() {
	local need=()
	command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
	[ -x /bin/busybox ] && /bin/busybox --list 2>/dev/null | grep -qx cpio || need+=(busybox-static)
	command -v rdma >/dev/null 2>&1 || need+=(iproute2)
	command -v ibv_devices >/dev/null 2>&1 || need+=(rdma-core ibverbs-utils)
	[ -e /usr/include/infiniband/verbs.h ] || need+=(libibverbs-dev)
	[ -e /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so ] || need+=(ibverbs-providers)
	# Debian's 6.12 modules are .ko.xz, decompressed into the initramfs.
	command -v xz >/dev/null 2>&1 || need+=(xz-utils)
	if [ ${#need[@]} -gt 0 ]; then
		[ "$(id -u)" = 0 ] || die "missing packages (${need[*]}) and not root to install them"
		export DEBIAN_FRONTEND=noninteractive
		apt-get install -y -qq --no-install-recommends "${need[@]}" >&2 ||
			{ apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends "${need[@]}" >&2; } ||
			die "cannot install ${need[*]}"
	fi
	# busybox-static replaces the dynamic /bin/busybox; the initramfs needs
	# the static one.
	file -L /bin/busybox 2>/dev/null | grep -q 'statically linked' ||
		ldd /bin/busybox 2>&1 | grep -q 'not a dynamic' ||
		die "/bin/busybox is not static (install busybox-static)"
}

# The newest Debian kernel ABI of a series (6.1: 6.1.0-N-amd64; 6.12 and
# later: 6.12.N+debM-amd64; never -cloud or -rt), from the apt sources.
newest_of_series() {
	local series=${1//./\\.} k
	local re="^linux-image-${series}(\\.0-[0-9]+|\\.[0-9]+\\+deb[0-9]+)-amd64\$"
	k=$(apt-cache search --names-only "$re" | awk '{print $1}' | sed 's/^linux-image-//' | sort -V | tail -n1)
	[ -n "$k" ] || { apt-get update -qq >&2 &&
		k=$(apt-cache search --names-only "$re" | awk '{print $1}' | sed 's/^linux-image-//' | sort -V | tail -n1); }
	[ -n "$k" ] || die "no linux-image-$1 kernel (amd64) in the apt sources"
	echo "$k"
}

# Prints the kernel ABI to use and whether it is the default choice
# ("ABI default") or one asked for ("ABI named"). A series' pick is
# remembered in $CACHE/series-SERIES, so a later archive update does not
# make every run fetch a new kernel.
pick_kernel() {
	local series=$1
	if [ -n "${CKPT_IB_KERNEL:-}" ]; then
		echo "$CKPT_IB_KERNEL named"
	elif [ -n "$series" ]; then
		case $series in *[!0-9.]* | '') die "bad kernel series '$series' (such as 6.12)" ;; esac
		local k
		if [ -s "$CACHE/series-$series" ] && [ -s "$CACHE/$(cat "$CACHE/series-$series")/initrd.gz" ]; then
			k=$(cat "$CACHE/series-$series")
		else
			k=$(newest_of_series "$series")
		fi
		echo "$k named"
	elif [ -s "$CACHE/current" ]; then
		echo "$(cat "$CACHE/current") default"
	else
		echo "$(newest_of_series 6.1) default"
	fi
}

# Path of a module under the unpacked tree, by name (- and _ are the same),
# plain or compressed (Debian's 6.12 ships .ko.xz).
module_path() {
	local name=${1//-/_} moddir=$2 f="" n ext
	for n in "$name" "${name//_/-}"; do
		for ext in ko ko.xz ko.zst; do
			[ -n "$f" ] || f=$(find "$moddir/kernel" -name "$n.$ext" -print -quit)
		done
	done
	echo "$f"
}

# A module's contents, decompressed.
module_cat() {
	case $1 in
	*.xz) xz -dc "$1" ;;
	*.zst) zstd -qdc "$1" ;;
	*) cat "$1" ;;
	esac
}

# Appends a module and its dependencies, dependencies first, to ORDER.
declare -a ORDER=()
declare -A SEEN=()
resolve_module() {
	local name=${1//-/_} moddir=$2 path deps d
	[ -z "${SEEN[$name]:-}" ] || return 0
	SEEN[$name]=1
	if grep -q "/${name}\.ko$" "$moddir/modules.builtin" 2>/dev/null; then
		return 0
	fi
	path=$(module_path "$name" "$moddir")
	[ -n "$path" ] || die "module $name not found in $moddir"
	deps=$(module_cat "$path" | tr '\0' '\n' | grep -a '^depends=' | head -n1 | cut -d= -f2)
	for d in ${deps//,/ }; do
		resolve_module "$d" "$moddir"
	done
	ORDER+=("${path#"$moddir"/}")
}

setup() {
	local series=""
	while [ $# -gt 0 ]; do
		case $1 in
		--kernel) series=$2; shift 2 ;;
		*) die "unknown option $1 (usage: setup [--kernel SERIES])" ;;
		esac
	done
	mkdir -p "$CACHE"
	# Tests may set up concurrently on a fresh machine: one builds, the
	# others wait and reuse.
	exec 9>"$CACHE/.lock"
	flock 9
	install_packages
	local kver dir deb moddir work picked how
	picked=$(pick_kernel "$series")
	kver=${picked% *}
	how=${picked##* }
	dir=$CACHE/$kver
	# Rebuilt when the module list changed since.
	if [ -s "$dir/initrd.gz" ] && [ -s "$dir/vmlinuz" ] &&
		[ "$(cat "$dir/modules" 2>/dev/null)" = "${GUEST_MODULES[*]}" ]; then
		remember_kernel "$kver" "$how" "$series"
		echo "$dir"
		return 0
	fi
	mkdir -p "$dir"
	deb=$(find "$CACHE" -maxdepth 1 -name "linux-image-${kver}_*.deb" -print -quit)
	if [ -z "$deb" ]; then
		(cd "$CACHE" && apt-get download "linux-image-$kver" >&2) ||
			die "cannot download linux-image-$kver"
		deb=$(find "$CACHE" -maxdepth 1 -name "linux-image-${kver}_*.deb" -print -quit)
		[ -n "$deb" ] || die "apt-get download left no linux-image-$kver deb in $CACHE"
	fi
	work=$(mktemp -d "$CACHE/build.XXXXXX")
	trap 'rm -rf "$work"' RETURN
	dpkg-deb -x "$deb" "$work/deb"
	moddir=$work/deb/lib/modules/$kver
	grep -q '^CONFIG_RDMA_RXE=[my]' "$work/deb/boot/config-$kver" ||
		die "linux-image-$kver has no CONFIG_RDMA_RXE"
	for m in "${GUEST_MODULES[@]}"; do
		resolve_module "$m" "$moddir"
	done

	local root=$work/initrd
	mkdir -p "$root"/{bin,dev,proc,sys,host,lib/modules}
	cp /bin/busybox "$root/bin/busybox"
	: >"$root/modules.order"
	local base
	for p in "${ORDER[@]}"; do
		# Decompressed here: the guest's busybox insmod takes plain .ko.
		base=$(basename "$p")
		base=${base%.xz}
		base=${base%.zst}
		module_cat "$moddir/$p" >"$root/lib/modules/$base"
		echo "$base" >>"$root/modules.order"
	done
	install -m 0755 /dev/stdin "$root/init" <<'EOF'
#!/bin/busybox sh
# Guest init: load the modules, mount the host tree, create rxe0, run the
# command the host left in the scratch directory, power off.
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do
	insmod /lib/modules/$m || echo "ib-vm-guest: insmod $m failed"
done
scratch= node= ctl=.ib-vm
for a in $(cat /proc/cmdline); do
	case $a in
	ckpt_scratch=*) scratch=${a#ckpt_scratch=} ;;
	ckpt_node=*) node=${a#ckpt_node=} ;;
	ckpt_ctl=*) ctl=${a#ckpt_ctl=} ;;
	esac
done
opts=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o ro,$opts,cache=loose hostroot /host || echo "ib-vm-guest: cannot mount host tree"
mount -t 9p -o $opts scratch /host$scratch || echo "ib-vm-guest: cannot mount scratch"
mount -t proc proc /host/proc
mount -t sysfs sys /host/sys
mount -t devtmpfs dev /host/dev
mount -t tmpfs tmp /host/tmp
mount -t tmpfs run /host/run
# The host's iproute2 (busybox ip knows no veth); rxe needs a netdev, and the
# address gives it an IPv4 GID whose route is local, so its traffic loops
# back inside rxe and nothing leaves the guest.
host() { chroot /host /usr/bin/env PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"; }
host ip link set lo up
if [ -n "$node" ]; then
	# One of two guests on a link (run --link): rxe0 on the link's NIC,
	# guest N at 10.214.0.N.
	host ip link set eth0 up
	host ip addr add 10.214.0.$node/24 dev eth0
	host rdma link add rxe0 type rxe netdev eth0 || echo "ib-vm-guest: cannot create rxe0"
else
	host ip link add veth0 type veth peer name veth1
	host ip link set veth0 up
	host ip link set veth1 up
	host ip addr add 10.213.0.1/24 dev veth0
	host rdma link add rxe0 type rxe netdev veth0 || echo "ib-vm-guest: cannot create rxe0"
fi
chroot /host /bin/bash "$scratch/$ctl/run.sh"
sync
reboot -f
EOF
	(cd "$root" && find . | /bin/busybox cpio -o -H newc 2>/dev/null | gzip -1) >"$work/initrd.gz"
	cp "$work/deb/boot/vmlinuz-$kver" "$dir/vmlinuz"
	mv "$work/initrd.gz" "$dir/initrd.gz"
	echo "${GUEST_MODULES[*]}" >"$dir/modules"
	remember_kernel "$kver" "$how" "$series"
	echo "$dir"
}

# Records a default pick as the kernel every plain run boots, a series' pick
# under its series only.
remember_kernel() {
	local kver=$1 how=$2 series=$3
	if [ "$how" = default ]; then
		echo "$kver" >"$CACHE/current"
	elif [ -n "$series" ]; then
		echo "$kver" >"$CACHE/series-$series"
	fi
}

run() {
	local timeout=60 scratch="" own_scratch=0 series="" link="" node=""
	while [ $# -gt 0 ]; do
		case $1 in
		--kernel) series=$2; shift 2 ;;
		--timeout) timeout=$2; shift 2 ;;
		--scratch) scratch=$2; shift 2 ;;
		--link) link=$2; shift 2 ;;
		--node) node=$2; shift 2 ;;
		--) shift; break ;;
		*) die "unknown option $1 (usage: run [--kernel SERIES] [--timeout S] [--scratch DIR] [--link PORT --node 1|2] -- CMD ARGS...)" ;;
		esac
	done
	# Two guests on one link: node 1 listens on 127.0.0.1:PORT, node 2
	# connects (start node 1 first); each has its own control directory in
	# the shared scratch.
	case "$link:$node" in
	: | ?*:1 | ?*:2) ;;
	*) die "--link PORT and --node 1|2 go together" ;;
	esac
	local nic=(-nic none) name=.ib-vm
	if [ -n "$link" ]; then
		local how=listen
		[ "$node" = 1 ] || how=connect
		nic=(-netdev "socket,id=link0,$how=127.0.0.1:$link"
			-device "virtio-net-pci,netdev=link0,mac=52:54:00:00:00:0$node")
		name=.ib-vm-$node
	fi
	[ $# -gt 0 ] || die "run: no command"
	local dir
	if [ -n "$series" ]; then
		dir=$(setup --kernel "$series" | tail -n1)
	else
		dir=$(setup | tail -n1)
	fi
	if [ -z "$scratch" ]; then
		scratch=$(mktemp -d /var/tmp/ckpt-ib-vm.XXXXXX)
		own_scratch=1
	fi
	scratch=$(cd "$scratch" && pwd -P)
	case $scratch in *[[:space:]]*) die "scratch path must not contain spaces: $scratch" ;; esac
	local ctl=$scratch/$name
	rm -rf "$ctl"
	mkdir -p "$ctl"
	# The guest's /tmp is a tmpfs of its own, so a command under the host's
	# /tmp (a checkout there, as CI makes) runs from a copy in the scratch
	# directory.
	local cmd=$1
	shift
	case $cmd in /tmp/*)
		cp "$cmd" "$ctl/"
		cmd=$ctl/$(basename "$cmd")
		;;
	esac
	set -- "$cmd" "$@"
	{
		echo "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
		echo "export HOME=/root CKPT_IB_SCRATCH=$scratch CKPT_IB_VM=1"
		[ -z "${RUST_BACKTRACE:-}" ] || echo "export RUST_BACKTRACE=$RUST_BACKTRACE"
		echo "cd $scratch"
		printf '%q ' "$@"
		echo ">$ctl/stdout 2>$ctl/stderr </dev/null"
		echo "echo \$? >$ctl/rc"
	} >"$ctl/run.sh"

	local status=0
	timeout "$timeout" qemu-system-x86_64 -accel tcg -cpu max -smp 1 -m 1024 \
		-nographic -no-reboot "${nic[@]}" \
		-kernel "$dir/vmlinuz" -initrd "$dir/initrd.gz" \
		-append "console=ttyS0 quiet loglevel=3 panic=-1 ckpt_scratch=$scratch ckpt_ctl=$name${node:+ ckpt_node=$node}" \
		-virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
		-virtfs local,path="$scratch",mount_tag=scratch,security_model=none,multidevs=remap \
		</dev/null >"$ctl/console" 2>&1 || status=$?
	if [ -s "$ctl/stdout" ]; then cat "$ctl/stdout"; fi
	if [ -s "$ctl/stderr" ]; then cat "$ctl/stderr" >&2; fi
	local rc
	if [ "$status" = 124 ]; then
		echo "ib-vm: VM timed out after ${timeout}s; console:" >&2
		tail -n 40 "$ctl/console" >&2
		rc=124
	elif [ -s "$ctl/rc" ]; then
		rc=$(cat "$ctl/rc")
		grep 'ib-vm-guest:' "$ctl/console" >&2 || true
	else
		echo "ib-vm: the command did not complete (qemu status $status); console:" >&2
		tail -n 40 "$ctl/console" >&2
		rc=$HARNESS_FAILURE
	fi
	if [ "$own_scratch" = 1 ]; then rm -rf "$scratch"; else rm -rf "$ctl"; fi
	exit "$rc"
}

case ${1:-} in
setup) shift; setup "$@" ;;
run) shift; run "$@" ;;
*) die "usage: $0 setup [--kernel SERIES] | run [--kernel SERIES] [--timeout S] [--scratch DIR] -- CMD ARGS..." ;;
esac
