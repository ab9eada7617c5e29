"""MPI over Open MPI's TCP BTL (mpi4py): a hand-written ring all_reduce and a ping-pong.

  mpirun -np N ... [slip-run --stats=F --] /usr/bin/python3 mpi_prog.py --sizes ... --iters K

ring: reduce-scatter then all-gather around the ring with Sendrecv, on int64 arrays whose
      every element is known (so each rank checks the exact sum), plus comm.Allreduce of
      the same data for comparison. ping-pong: rank 0 <-> rank 1, every byte checked on
      both sides (the echo is transformed: bytes + 1). Rank 0 prints one JSON line.
"""

import argparse
import json
import sys
import time

import numpy as np
from mpi4py import MPI


def data(rank, n, it):
    return (np.arange(n, dtype=np.int64) * (rank + 1) + 1_000_003 * rank + it) % 1_000_007


def ring_allreduce(comm, x):
    rank, size = comm.Get_rank(), comm.Get_size()
    chunks = np.array_split(x.copy(), size)
    right, left = (rank + 1) % size, (rank - 1) % size
    for k in range(size - 1):  # reduce-scatter
        send_i, recv_i = (rank - k) % size, (rank - k - 1) % size
        buf = np.empty_like(chunks[recv_i])
        comm.Sendrecv(chunks[send_i], dest=right, sendtag=k, recvbuf=buf, source=left, recvtag=k)
        chunks[recv_i] = chunks[recv_i] + buf
    for k in range(size - 1):  # all-gather
        send_i, recv_i = (rank + 1 - k) % size, (rank - k) % size
        buf = np.empty_like(chunks[recv_i])
        comm.Sendrecv(chunks[send_i], dest=right, sendtag=100 + k, recvbuf=buf, source=left,
                      recvtag=100 + k)
        chunks[recv_i] = buf
    return np.concatenate(chunks)


def timed(comm, fn, iters):
    times = []
    for it in range(iters):
        comm.Barrier()
        t0 = time.perf_counter()
        fn(it)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="8,4096,262144,4194304,16777216")  # bytes
    p.add_argument("--iters", type=int, default=5)
    args = p.parse_args()
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    report = {"size": size, "ring": {}, "allreduce": {}, "pingpong": {}}
    for nbytes in map(int, args.sizes.split(",")):
        n = max(1, nbytes // 8)
        want = {it: sum(data(r, n, it) for r in range(size)) for it in range(args.iters)}

        def ring(it):
            got = ring_allreduce(comm, data(rank, n, it))
            assert np.array_equal(got, want[it]), f"ring all_reduce {nbytes} B iteration {it}"

        def builtin(it):
            out = np.empty(n, dtype=np.int64)
            comm.Allreduce(data(rank, n, it), out, op=MPI.SUM)
            assert np.array_equal(out, want[it]), f"Allreduce {nbytes} B iteration {it}"

        def pingpong(it):
            if rank == 0:
                msg = np.frombuffer(np.random.default_rng([nbytes, it]).bytes(nbytes), np.uint8)
                back = np.empty_like(msg)
                comm.Send(msg, dest=1, tag=it)
                comm.Recv(back, source=1, tag=it)
                assert np.array_equal(back, msg + np.uint8(1)), f"ping-pong {nbytes} B iteration {it}"
            elif rank == 1:
                msg = np.empty(nbytes, np.uint8)
                comm.Recv(msg, source=0, tag=it)
                ref = np.frombuffer(np.random.default_rng([nbytes, it]).bytes(nbytes), np.uint8)
                assert np.array_equal(msg, ref), f"ping-pong {nbytes} B iteration {it} (rank 1)"
                comm.Send(msg + np.uint8(1), dest=0, tag=it)
        report["ring"][nbytes] = timed(comm, ring, args.iters)
        report["allreduce"][nbytes] = timed(comm, builtin, args.iters)
        report["pingpong"][nbytes] = timed(comm, pingpong, args.iters)  # round trip
    comm.Barrier()
    if rank == 0:
        print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"rank {MPI.COMM_WORLD.Get_rank()}: {e}", file=sys.stderr, flush=True)
        MPI.COMM_WORLD.Abort(3)
