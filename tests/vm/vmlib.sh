# shellcheck shell=bash
# Shared by tests/vm/rxe-run and tests/vm/rxe-run2: build (once, cached) and boot the
# Soft-RoCE guest. See tests/vm/README.md. Sourced, not run.

VM_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
VM_REPO=$(cd "$VM_SRC/../.." && pwd)
VM_DIR=${SLIP_VM_DIR:-$VM_REPO/build/vm}

# Host packages the lab needs (SOFT-ROCE.md).
VM_PKGS="qemu-system-x86 busybox-static rdma-core ibverbs-providers ibverbs-utils
rdmacm-utils perftest iproute2 kmod xz-utils cpio"

# insmod order (SOFT-ROCE.md); every module is =m in Debian's 6.1 kernel. The sock_diag
# modules let shm verify a rendezvous in the guest as on a host (core/sock_diag.h).
VM_MODS="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci netfs
fscache 9pnet 9pnet_virtio 9p crc32_generic ib_core ib_uverbs udp_tunnel ip6_udp_tunnel
rdma_rxe configfs iw_cm ib_cm rdma_cm rdma_ucm veth dummy inet_diag tcp_diag unix_diag"
# Loaded after those when the kernel has them: Debian's 6.1 has no siw (RDMA_SIW unset).
VM_OPT_MODS="siw"
# Only loaded when the guest has a NIC (two-guest mode).
VM_NIC_MODS="failover net_failover virtio_net"

vm_log() { [ "${SLIP_VM_QUIET:-0}" = 1 ] || echo "rxe-run: $*" >&2; }
vm_die() { echo "rxe-run: error: $*" >&2; exit 125; }

# --- host packages ------------------------------------------------------------------------
vm_ensure_packages() {
    local missing="" p
    for p in $VM_PKGS; do
        dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' ||
            missing="$missing $p"
    done
    [ -z "$missing" ] && return 0
    [ "$(id -u)" = 0 ] || vm_die "missing packages:$missing (run as root or apt-get install them)"
    vm_log "installing host packages:$missing"
    export DEBIAN_FRONTEND=noninteractive
    # shellcheck disable=SC2086
    if ! apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 $missing >"$VM_DIR/apt.log" 2>&1; then
        apt-get update -q -o DPkg::Lock::Timeout=600 >>"$VM_DIR/apt.log" 2>&1 || true
        # shellcheck disable=SC2086
        apt-get install -y -q --no-install-recommends -o DPkg::Lock::Timeout=600 $missing >>"$VM_DIR/apt.log" 2>&1 ||
            vm_die "apt-get install failed, see $VM_DIR/apt.log"
    fi
}

# --- guest kernel -------------------------------------------------------------------------
# The kernel version is chosen once (what linux-image-amd64 depends on) and recorded in
# $VM_DIR/kver so that later apt updates never change the lab under a test; delete the file
# (or set SLIP_VM_KVER) to move on.
vm_kernel_version() {
    if [ -n "${SLIP_VM_KVER:-}" ]; then echo "$SLIP_VM_KVER"; return; fi
    if [ -s "$VM_DIR/kver" ]; then cat "$VM_DIR/kver"; return; fi
    local pkg
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
          sed -n 's/^ *Depends: *\(linux-image-[0-9][^ ]*\)$/\1/p' | head -n1)
    [ -n "$pkg" ] || vm_die "cannot resolve the package linux-image-amd64 depends on (apt-get update?)"
    echo "${pkg#linux-image-}" | tee "$VM_DIR/kver"
}

vm_fetch_kernel() {  # $1 = kver; unpacks into $VM_DIR/kernel-$kver
    local kver=$1 root="$VM_DIR/kernel-$1" deb
    [ -f "$root/.done" ] && return 0
    mkdir -p "$VM_DIR/debs"
    deb=$(find "$VM_DIR/debs" -name "linux-image-${kver}_*.deb" 2>/dev/null | head -n1)
    if [ -z "$deb" ]; then
        vm_log "downloading linux-image-$kver (host /boot untouched)"
        (cd "$VM_DIR/debs" && apt-get download -q -o APT::Sandbox::User=root \
            "linux-image-$kver" >"$VM_DIR/download.log" 2>&1) ||
            vm_die "apt-get download linux-image-$kver failed, see $VM_DIR/download.log"
        deb=$(find "$VM_DIR/debs" -name "linux-image-${kver}_*.deb" | head -n1)
    fi
    rm -rf "$root"
    dpkg -x "$deb" "$root" || vm_die "dpkg -x $deb failed"
    depmod -b "$root" "$kver" || vm_die "depmod -b failed"
    touch "$root/.done"
}

# Uncompressed ELF vmlinux (PVH entry) boots in ~2 s under TCG instead of ~6 s: it is the
# xz stream following FD 37 7A 58 5A 00 inside the bzImage.
vm_extract_vmlinux() {  # $1 = kver; prints the kernel image to boot
    local kver=$1 bz="$VM_DIR/kernel-$1/boot/vmlinuz-$1" out="$VM_DIR/vmlinux-$1" off
    if [ -s "$out" ]; then echo "$out"; return; fi
    if [ -f "$out.failed" ]; then echo "$bz"; return; fi
    off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$bz" 2>/dev/null | head -n1 | cut -d: -f1)
    if [ -n "$off" ] &&
       tail -c +"$((off + 1))" "$bz" | xz -dc --single-stream >"$out.tmp" 2>/dev/null &&
       [ "$(head -c4 "$out.tmp" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; then
        mv "$out.tmp" "$out"
        echo "$out"
    else
        vm_log "could not extract vmlinux from $bz; booting the bzImage (slower)"
        rm -f "$out.tmp"; touch "$out.failed"
        echo "$bz"
    fi
}

# initramfs: busybox-static, the modules above (decompressed if the kernel ships them
# compressed), tests/vm/init. Keyed by a hash of its inputs, so edits rebuild it.
vm_build_initrd() {  # $1 = kver; prints the initrd path
    local kver=$1 root="$VM_DIR/kernel-$1" key out tree m f dep d
    key=$( { echo "$VM_MODS $VM_OPT_MODS $VM_NIC_MODS"; cat "$VM_SRC/init" /bin/busybox; } |
           sha256sum | cut -c1-12)
    out="$VM_DIR/initrd-$kver-$key.cpio"
    if [ -s "$out" ]; then echo "$out"; return; fi
    vm_log "building initramfs $out"
    tree="$VM_DIR/initrd-tree"
    rm -rf "$tree"
    mkdir -p "$tree"/{bin,dev,proc,sys,io,newroot,lib/mods}
    cp /bin/busybox "$tree/bin/busybox"
    for d in sh mount umount mkdir insmod chroot cat echo sleep sync reboot poweroff grep \
             ls dmesg; do
        ln -s busybox "$tree/bin/$d"
    done
    cp "$VM_SRC/init" "$tree/init"; chmod 755 "$tree/init"
    local loaded=" " opt=""
    for m in $VM_MODS $VM_OPT_MODS $VM_NIC_MODS; do
        if ! f=$(modinfo -b "$root" -k "$kver" -F filename "$m" 2>/dev/null); then
            case " $VM_OPT_MODS " in *" $m "*) continue ;; esac
            vm_die "module $m not found in kernel $kver"
        fi
        case " $VM_OPT_MODS " in *" $m "*) opt="$opt $m" ;; esac
        [ "$f" != "(builtin)" ] || continue
        # Every dependency must already be in the list, earlier (checked, not assumed).
        for dep in $(modinfo -b "$root" -k "$kver" -F depends "$m" | tr ',' ' '); do
            case "$loaded" in *" ${dep//-/_} "*) ;;
                *) vm_die "module $m needs $dep, which is not loaded before it" ;; esac
        done
        case "$f" in
            *.ko.xz)  xz -dc "$f" >"$tree/lib/mods/$m.ko" ;;
            *.ko.zst) zstd -qdc "$f" >"$tree/lib/mods/$m.ko" ;;
            *.ko.gz)  gzip -dc "$f" >"$tree/lib/mods/$m.ko" ;;
            *)        cp "$f" "$tree/lib/mods/$m.ko" ;;
        esac || vm_die "cannot copy module $f"
        loaded="$loaded${m//-/_} "
    done
    # shellcheck disable=SC2086
    printf '%s\n' $VM_MODS $opt >"$tree/lib/mods/order"
    # shellcheck disable=SC2086
    printf '%s\n' $VM_NIC_MODS >"$tree/lib/mods/order.nic"
    (cd "$tree" && find . | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) >"$out.tmp" ||
        vm_die "cpio failed"
    rm -f "$VM_DIR/initrd-$kver-"*.cpio
    mv "$out.tmp" "$out"
    rm -rf "$tree"
    echo "$out"
}

# Sets VM_KERNEL and VM_INITRD. Serialised with flock so parallel runs share one build.
vm_setup() {
    mkdir -p "$VM_DIR/runs" || vm_die "cannot create $VM_DIR"
    # Run directories left by killed runs (a trap could not remove them).
    find "$VM_DIR/runs" -mindepth 1 -maxdepth 1 -mmin +1440 -exec rm -rf {} + 2>/dev/null
    exec 9>"$VM_DIR/.lock"
    flock 9
    vm_ensure_packages
    local kver
    kver=$(vm_kernel_version) || exit 125
    vm_fetch_kernel "$kver"
    VM_KERNEL=$(vm_extract_vmlinux "$kver") || exit 125
    VM_INITRD=$(vm_build_initrd "$kver") || exit 125
    flock -u 9
    exec 9>&-
}

# --- one run ------------------------------------------------------------------------------
vm_quote() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }

# vm_prepare_run DIR COMMAND NODE NIC: the writable share's contents.
vm_prepare_run() {
    local dir=$1 cmd=$2 node=$3 nic=$4 v
    mkdir -p "$dir"
    printf '%s\n' "$cmd" >"$dir/cmd"
    cp "$VM_SRC/guest.sh" "$dir/guest.sh"
    {
        echo "VM_CWD=$(vm_quote "$PWD")"
        echo "VM_NODE=$node"
        echo "VM_NIC=$nic"
        echo "VM_SIW=${SLIP_VM_SIW:-0}"
    } >"$dir/config"
    {
        echo "export PATH=$(vm_quote "$PATH")"
        echo "export HOME=/root"
        echo "export SLIP_VM_NODE=$node"
        for v in $(compgen -e | grep '^SLIP_'); do
            echo "export $v=$(vm_quote "${!v}")"
        done
        # SLIP_VM_ENV="A=1 B=2": whitespace-separated NAME=VALUE words.
        for v in ${SLIP_VM_ENV:-}; do
            case "$v" in
                [A-Za-z_]*=*) echo "export ${v%%=*}=$(vm_quote "${v#*=}")" ;;
                *) vm_die "SLIP_VM_ENV: not NAME=VALUE: $v" ;;
            esac
        done
    } >"$dir/env"
    : >"$dir/stdout"; : >"$dir/stderr"
}

# vm_qemu_cmd DIR [extra qemu args...]: sets the VM_QEMU array.
# shellcheck disable=SC2054  # the commas are qemu's, not array separators
vm_qemu_cmd() {
    local dir=$1; shift
    local accel=(-accel "tcg,thread=${SLIP_VM_TCG_THREAD:-multi}" -cpu max,-monitor)
    if [ "${SLIP_VM_ACCEL:-tcg}" = kvm ]; then accel=(-accel kvm -cpu host); fi
    local append="console=ttyS0 quiet panic=-1"
    [ "${SLIP_VM_IDLE_POLL:-1}" = 1 ] && append="$append idle=poll"
    append="$append ${SLIP_VM_APPEND:-}"
    VM_QEMU=(qemu-system-x86_64 "${accel[@]}" -smp "${SLIP_VM_SMP:-2}" -m "${SLIP_VM_MEM:-2G}"
        -nodefaults -display none -serial stdio -no-reboot
        -kernel "$VM_KERNEL" -initrd "$VM_INITRD" -append "$append"
        -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap
        -virtfs "local,path=$dir,mount_tag=slipio,security_model=none,multidevs=remap"
        "$@")
}

# vm_start DIR PREFIX [extra qemu args...]: boots the guest for run directory DIR in the
# background under timeout(1) (SIGTERM at SLIP_VM_TIMEOUT, SIGKILL 5 s later) and streams
# the command's stdout/stderr here as the guest writes them (9p writes reach the host file
# at once), each line prefixed with PREFIX if not empty. Sets VM_PID and VM_TAILS.
vm_start() {
    local dir=$1 prefix=$2; shift 2
    vm_qemu_cmd "$dir" "$@"
    timeout -k 5 "${SLIP_VM_TIMEOUT:-300}" "${VM_QEMU[@]}" </dev/null >"$dir/console.log" 2>&1 &
    VM_PID=$!
    VM_TAILS=""
    if [ "${SLIP_VM_VERBOSE:-0}" = 1 ]; then
        tail -n +1 -F --pid="$VM_PID" "$dir/console.log" 2>/dev/null |
            sed -u "s/^/${prefix}[console] /" >&2 &
        VM_TAILS="$VM_TAILS $!"
    fi
    if [ -n "$prefix" ]; then
        tail -n +1 -F --pid="$VM_PID" "$dir/stdout" 2>/dev/null | sed -u "s/^/$prefix/" &
        VM_TAILS="$VM_TAILS $!"
        tail -n +1 -F --pid="$VM_PID" "$dir/stderr" 2>/dev/null | sed -u "s/^/$prefix/" >&2 &
        VM_TAILS="$VM_TAILS $!"
    else
        tail -n +1 -F --pid="$VM_PID" "$dir/stdout" 2>/dev/null &
        VM_TAILS="$VM_TAILS $!"
        tail -n +1 -F --pid="$VM_PID" "$dir/stderr" >&2 2>/dev/null &
        VM_TAILS="$VM_TAILS $!"
    fi
}

# vm_finish DIR PID TAILS NAME: waits for the guest; returns the command's exit status,
# 124 if the guest was killed at the timeout, 125 if the lab itself failed (with the
# guest's console and logs on stderr).
vm_finish() {
    local dir=$1 pid=$2 tails=$3 name=$4 qrc rc t
    wait "$pid"
    qrc=$?
    for t in $tails; do wait "$t"; done
    if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
        echo "$name: timed out after ${SLIP_VM_TIMEOUT:-300}s; qemu killed" >&2
        return 124
    fi
    if [ ! -s "$dir/status" ]; then
        echo "$name: the guest ended without a status (qemu exit $qrc); console and logs:" >&2
        cat "$dir/console.log" "$dir/init.log" "$dir/setup.log" 2>/dev/null | tail -n 40 >&2
        return 125
    fi
    rc=$(cat "$dir/status")
    if grep -qs 'setup failed' "$dir/setup.log"; then
        echo "$name: guest network/rdma setup failed:" >&2
        cat "$dir/setup.log" >&2
    fi
    return "$rc"
}
