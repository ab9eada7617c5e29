#!/bin/sh
# Runs inside the guest, chrooted into the host's root (read-only 9p), as root.
# /run/slipvm is the writable share: config, env and cmd come in; stdout, stderr,
# setup.log and status go out. Copied there by vmlib.sh for each run.
IO=/run/slipvm
# shellcheck source=/dev/null
. "$IO/config"

setup() {
    ip link set lo up || return 1
    if [ "$VM_NIC" = 1 ]; then
        # Two guests joined by a qemu socket netdev: rxe on the NIC, 10.77.0.<node>.
        dev=""   # the virtio NIC: the only netdev with a device behind it (not lo, dummy0)
        for d in /sys/class/net/*; do
            if [ -e "$d/device" ]; then dev=${d##*/}; break; fi
        done
        [ -n "$dev" ] || { echo "no NIC"; return 1; }
        ip link set "$dev" name rxv0 || return 1
        ip addr add "10.77.0.$VM_NODE/24" dev rxv0 || return 1
        ip link set rxv0 up || return 1
    else
        ip link add rxv0 type veth peer name rxv1 || return 1
        ip addr add 10.77.0.1/24 dev rxv0 || return 1
        ip addr add 10.77.0.2/24 dev rxv1 || return 1
        ip link set rxv0 up && ip link set rxv1 up || return 1
    fi
    rdma link add rxe0 type rxe netdev rxv0 || return 1
    if [ "$VM_SIW" = 1 ]; then
        [ -d /sys/module/siw ] ||
            { echo "SLIP_VM_SIW=1: this kernel has no siw module ($(uname -r))"; return 1; }
        if [ "$VM_NIC" = 1 ]; then
            rdma link add siw0 type siw netdev rxv0 || return 1
        else
            rdma link add siw0 type siw netdev rxv1 || return 1
        fi
    fi
    # The port follows the netdev's carrier; wait (up to 5 s) until it is ACTIVE.
    i=0
    until rdma link show rxe0/1 | grep -q 'state ACTIVE'; do
        i=$((i + 1))
        [ $i -le 50 ] || { rdma link show; echo "rxe0 port not ACTIVE"; return 1; }
        sleep 0.1
    done
    ip -br addr
    rdma link show
}

if ! setup >"$IO/setup.log" 2>&1; then
    echo "setup failed" >>"$IO/setup.log"
    echo 125 >"$IO/status"
    exit 125
fi

read -r up _ </proc/uptime; echo "guest: $up s rxe0 ACTIVE, running the command" >>"$IO/init.log"
# shellcheck source=/dev/null
. "$IO/env"
# shellcheck disable=SC3045  # dash (the host's /bin/sh) has ulimit -l
ulimit -l unlimited
cd "$VM_CWD" || { echo "cannot cd to $VM_CWD" >>"$IO/setup.log"; echo 125 >"$IO/status"; exit 125; }
sh -c "$(cat "$IO/cmd")" >"$IO/stdout" 2>"$IO/stderr" </dev/null
rc=$?
echo "$rc" >"$IO/status.tmp" && mv "$IO/status.tmp" "$IO/status"
