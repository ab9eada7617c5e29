"""PyTorch data-parallel collectives on Gloo (python3-torch), one process per rank.

  torch_gloo.py --rank R --world W --port P --sizes 4,4096,... --iters N --ddp-steps S

init_method tcp://127.0.0.1:P (rank 0 hosts the TCPStore; Gloo's pairs use lo).
For every size (bytes of float32; 4 = one element): all_reduce, broadcast (from each
root in turn), all_gather. Inputs are integer-valued float32 derived from (rank, size,
iteration), so sums are exact: each rank computes every rank's input locally and checks
the result with torch.equal. Then a few steps of a small DistributedDataParallel model;
its final parameters are checked against one process training on the whole batch
(allclose; the averaging order differs) and reported as a SHA-256 that the runner compares
bit for bit with the plain-TCP run. Prints one JSON line (rank 0 carries the timings).
"""

import argparse
import hashlib
import json
import os
import sys
import time

os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

torch.set_num_threads(1)


def tensor_for(rank, size_bytes, it):
    n = max(1, size_bytes // 4)
    g = torch.Generator().manual_seed(1_000_003 * rank + 7919 * n + it)
    return torch.randint(-1000, 1000, (n,), generator=g, dtype=torch.int32).to(torch.float32)


def sync_time(prepare, op, check, iters):
    """Median wall time of op(state) over iters iterations, each fenced by a barrier;
    inputs and expected values are prepared, and results checked, outside the timing."""
    times = []
    for it in range(iters):
        state = prepare(it)
        dist.barrier()
        t0 = time.perf_counter()
        op(state)
        times.append(time.perf_counter() - t0)
        check(it, state)
    times.sort()
    return times[len(times) // 2]


def collectives(rank, world, sizes, iters):
    timing = {}
    for size in sizes:
        def reduce_check(it, t):
            want = sum(tensor_for(r, size, it) for r in range(world))
            assert torch.equal(t, want), f"all_reduce {size} B iteration {it} differs"

        def bcast_check(it, t):
            assert torch.equal(t, tensor_for(it % world, size, it)), \
                f"broadcast {size} B root {it % world}"

        def gather_prepare(it):
            t = tensor_for(rank, size, it)
            return t, [torch.empty_like(t) for _ in range(world)]

        def gather_check(it, state):
            for r in range(world):
                assert torch.equal(state[1][r], tensor_for(r, size, it)), \
                    f"all_gather {size} B from rank {r}"
        prepare = lambda it: tensor_for(rank, size, it)  # noqa: E731
        cases = (("all_reduce", prepare, dist.all_reduce, reduce_check),
                 ("broadcast", prepare,
                  lambda t: dist.broadcast(t, src=bcast_root[0]), bcast_check),
                 ("all_gather", gather_prepare, lambda st: dist.all_gather(st[1], st[0]),
                  gather_check))
        n = iters if size < (16 << 20) else max(2, iters // 3)
        timing[str(size)] = {}
        for name, prep, op, check in cases:
            bcast_root = [0]

            def prep_root(it, prep=prep):
                bcast_root[0] = it % world
                return prep(it)
            timing[str(size)][name] = sync_time(prep_root, op, check, n)
    return timing


def make_model():
    torch.manual_seed(42)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def batch(step, world):
    g = torch.Generator().manual_seed(500 + step)
    x = torch.randn(8 * world, 64, generator=g)
    y = torch.randint(0, 10, (8 * world,), generator=g)
    return x, y


def ddp(rank, world, steps):
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref = make_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    times = []
    for step in range(steps):
        x, y = batch(step, world)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss_fn(model(x[8 * rank:8 * rank + 8]), y[8 * rank:8 * rank + 8]).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        ref_opt.zero_grad()
        loss_fn(ref(x), y).backward()  # mean over the whole batch = average of the shards
        ref_opt.step()
    h = hashlib.sha256()
    for p, q in zip(model.module.parameters(), ref.parameters()):
        assert torch.allclose(p, q, rtol=1e-4, atol=1e-5), "DDP diverges from full-batch training"
        h.update(p.detach().numpy().tobytes())
    # Every rank must hold the same parameters, bit for bit.
    digests = [None] * world
    dist.all_gather_object(digests, h.hexdigest())
    assert len(set(digests)) == 1, f"ranks disagree on the DDP parameters: {digests}"
    times.sort()
    return h.hexdigest(), times[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--sizes", default="4,4096,262144,4194304,67108864")
    p.add_argument("--iters", type=int, default=6)
    p.add_argument("--ddp-steps", type=int, default=5)
    args = p.parse_args()
    t0 = time.perf_counter()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=args.rank, world_size=args.world)
    init_s = time.perf_counter() - t0
    timing = collectives(args.rank, args.world, [int(s) for s in args.sizes.split(",")],
                         args.iters)
    ddp_digest, ddp_step_s = ddp(args.rank, args.world, args.ddp_steps)
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"rank": args.rank, "init_s": init_s, "ops": timing,
                      "ddp_digest": ddp_digest, "ddp_step_s": ddp_step_s}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
