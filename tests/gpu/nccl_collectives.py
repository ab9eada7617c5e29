#!/usr/bin/env python3
"""NCCL collectives through the Slipstream plugin, with PyTorch's own NCCL, on one GPU.

Two ranks share GPU 0 but are made to look like two hosts (distinct NCCL_HOSTID), so that
NCCL connects them through its network plugin; NCCL_NET forces ours. Each collective
(all_reduce, all_gather, reduce_scatter, broadcast) runs on CUDA tensors at sizes from 4 B
to 256 MiB and is checked exactly (integer data), under whatever NCCL_PROTO says. Then a
timing of all_reduce (unless --no-timing), which the same script can repeat with NCCL's own
socket transport (--net Socket) as the baseline.

Exit status: 0 all exact, 1 a mismatch or an error, 77 no GPU (skipped).
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

SIZES = [4, 64, 1024, 64 << 10, 1 << 20, 16 << 20, 256 << 20]


def int_data(torch, rank, n):
    ar = torch.arange(n, dtype=torch.int64, device="cuda")
    return ((ar * 131 + rank * 17) % 1000).to(torch.int32)


def byte_data(torch, rank, n):
    ar = torch.arange(n, dtype=torch.int64, device="cuda")
    return ((ar * 2654435761 + rank * 7919) % 251).to(torch.uint8)


def rank_main(args):
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{args.port}", rank=rank,
                            world_size=world, device_id=torch.device("cuda:0"))
    failures = []
    for size in SIZES:
        n4 = max(1, size // 4)
        t = int_data(torch, rank, n4)
        dist.all_reduce(t)
        want = sum(int_data(torch, r, n4) for r in range(world))
        if not torch.equal(t, want):
            failures.append(f"all_reduce {size} B")
        out = torch.empty(size * world, dtype=torch.uint8, device="cuda")
        dist.all_gather_into_tensor(out, byte_data(torch, rank, size))
        if not torch.equal(out, torch.cat([byte_data(torch, r, size) for r in range(world)])):
            failures.append(f"all_gather {size} B")
        inp = int_data(torch, rank, n4 * world)
        out = torch.empty(n4, dtype=torch.int32, device="cuda")
        dist.reduce_scatter_tensor(out, inp)
        full = sum(int_data(torch, r, n4 * world) for r in range(world))
        if not torch.equal(out, full[rank * n4:(rank + 1) * n4]):
            failures.append(f"reduce_scatter {size} B")
        t = byte_data(torch, 1, size) if rank == 1 else torch.zeros(size, dtype=torch.uint8,
                                                                      device="cuda")
        dist.broadcast(t, src=1)
        if not torch.equal(t, byte_data(torch, 1, size)):
            failures.append(f"broadcast {size} B")
        torch.cuda.synchronize()
    # Timing: all_reduce of float32 buffers, after a warm-up.
    timings = {}
    for size in (1 << 20, 64 << 20) if args.timing else ():
        t = torch.ones(size // 4, dtype=torch.float32, device="cuda")
        for _ in range(3):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        iters = 20
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        torch.cuda.synchronize()
        elapsed = (time.perf_counter() - start) / iters
        timings[size] = {"us": elapsed * 1e6, "algbw_GBps": size / elapsed / 1e9}
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"net": args.net, "proto": os.environ.get("NCCL_PROTO", "default"),
                          "torch": torch.__version__,
                          "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                          "failures": failures, "all_reduce": timings}), flush=True)
    return 1 if failures else 0


def launch(args):
    try:
        import torch
        if not torch.cuda.is_available():
            print("SKIP: no GPU (torch.cuda.is_available() is False)")
            return 77
    except ImportError:
        print("SKIP: no PyTorch")
        return 77
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(2):
        env = dict(os.environ)
        env.update({
            "RANK": str(rank), "WORLD_SIZE": "2",
            "NCCL_HOSTID": f"slipstream-gpu-test-host-{rank}",
            "NCCL_NET": args.net,
            "NCCL_SOCKET_IFNAME": "lo",
            "NCCL_IB_DISABLE": "1",
            "NCCL_DEBUG": env.get("NCCL_DEBUG", "INFO"),
            "NCCL_DEBUG_SUBSYS": env.get("NCCL_DEBUG_SUBSYS", "INIT,NET"),
        })
        if args.plugin_dir:
            env["NCCL_NET_PLUGIN"] = "slipstream"
            env["LD_LIBRARY_PATH"] = args.plugin_dir + ":" + env.get("LD_LIBRARY_PATH", "")
        procs.append(subprocess.Popen([sys.executable, __file__, "--rank-main", "--port",
                                       str(port), "--net", args.net] +
                                      ([] if args.timing else ["--no-timing"]), env=env))
    rc = 0
    deadline = time.time() + args.timeout
    for p in procs:
        try:
            rc |= p.wait(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            print(f"FAIL: a rank did not finish in {args.timeout} s (hang)")
            for q in procs:
                q.kill()
            return 1
    return 1 if rc else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugin-dir", default="")
    ap.add_argument("--net", default="Slipstream")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--rank-main", action="store_true")
    ap.add_argument("--no-timing", dest="timing", action="store_false")
    args = ap.parse_args()
    sys.exit(rank_main(args) if args.rank_main else launch(args))


if __name__ == "__main__":
    main()
