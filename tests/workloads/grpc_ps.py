"""TensorFlow-style parameter-server training step over gRPC (python3-grpcio, raw bytes
messages through generic handlers: no protoc).

  grpc_ps.py ps --port P --workers 2 --steps N --out FILE [--host ADDR]
  grpc_ps.py worker --port P --id I --steps N [--host ADDR]
  grpc_ps.py expected --steps N --out FILE      (the same arithmetic in one process)

Each step every worker
  1. Pull    (unary -> stream): the PS streams every tensor (header + float32 bytes) once
             all workers' gradients of the previous step are applied (synchronous SGD);
  2. Push    (stream -> unary): the worker streams its gradient, each tensor in chunks;
  3. Commit  (unary): the worker names the step and the SHA-256 of what it pushed; the PS
             checks it against what it received.
The PS averages (g0 + g1 + ...) / W in worker order, so the result does not depend on
arrival order and is bit-identical to `expected`. At the end the PS writes the parameters
(raw float32, tensor after tensor) to --out; each program prints one JSON line.
"""

import argparse
import hashlib
import json
import struct
import sys
import threading
import time

import numpy as np

SHAPES = [(512, 1024), (1024, 256), (4099,), (256, 512), (333, 77)]  # ~3.2 MiB of float32
CHUNK = 256 * 1024  # bytes per Push message
LR = np.float32(0.05)
SERVICE = "slip.ParameterServer"
HEADER = struct.Struct("<IIQ")  # tensor index, step, byte length


def initial_params():
    rng = np.random.default_rng(1234)
    return [rng.standard_normal(s, dtype=np.float32) for s in SHAPES]


def gradient(params, worker, step):
    """Depends on the pulled parameters, so a corrupted pull changes the result."""
    rng = np.random.default_rng([worker, step])
    return [(p * np.float32(0.1 * (worker + 1)) + rng.standard_normal(p.shape, dtype=np.float32))
            .astype(np.float32) for p in params]


def apply(params, grads_by_worker):
    out = []
    w = np.float32(len(grads_by_worker))
    for i, p in enumerate(params):
        total = grads_by_worker[0][i].copy()
        for g in grads_by_worker[1:]:
            total = total + g[i]
        out.append((p - LR * (total / w)).astype(np.float32))
    return out


def digest(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(np.ascontiguousarray(t).tobytes())
    return h.hexdigest()


def ident(x):
    return x


def options():
    big = 64 * 1024 * 1024
    return [("grpc.max_send_message_length", big), ("grpc.max_receive_message_length", big)]


# ---------------------------------------------------------------------------------------
# Parameter server


class PS:
    def __init__(self, workers, steps):
        self.workers, self.steps = workers, steps
        self.params = initial_params()
        self.step = 0  # parameters are those after `step` updates
        self.pending = {}  # worker -> gradient tensors for self.step
        self.committed = set()  # workers whose Commit for self.step arrived
        self.cond = threading.Condition()
        self.errors = []
        self.done = threading.Event()
        self.finished = set()
        self.bytes_pulled = self.bytes_pushed = 0

    def pull(self, request, context):
        step, = struct.unpack("<I", request)
        with self.cond:
            if not self.cond.wait_for(lambda: self.step >= step, timeout=60):
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"step {step} never came")
            if self.step != step:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"pull {step} at {self.step}")
            params = self.params
        for i, t in enumerate(params):
            data = t.tobytes()
            self.bytes_pulled += len(data)
            yield HEADER.pack(i, step, len(data)) + data

    def push(self, request_iterator, context):
        meta = next(request_iterator)
        worker, step = struct.unpack("<II", meta)
        bufs = [bytearray() for _ in SHAPES]
        for msg in request_iterator:
            i, s, n = HEADER.unpack_from(msg)
            if s != step or n != len(msg) - HEADER.size:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad chunk header")
            bufs[i] += msg[HEADER.size:]
            self.bytes_pushed += len(msg)
        grads = [np.frombuffer(bytes(b), dtype=np.float32).reshape(s) for b, s in zip(bufs, SHAPES)]
        with self.cond:
            if step != self.step or worker in self.pending:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "push out of step")
            self.pending[worker] = grads
        return struct.pack("<I", step) + digest(grads).encode()

    def commit(self, request, context):
        worker, step = struct.unpack_from("<II", request)
        claimed = request[8:].decode()
        with self.cond:
            got = self.pending.get(worker)
            if got is None or digest(got) != claimed or step != self.step:
                msg = f"worker {worker} step {step}: gradient digest mismatch or missing"
                self.errors.append(msg)
                context.abort(grpc.StatusCode.DATA_LOSS, msg)
            self.committed.add(worker)
            if self.committed == set(range(self.workers)):
                self.params = apply(self.params, [self.pending[w] for w in range(self.workers)])
                self.pending, self.committed = {}, set()
                self.step += 1
                self.cond.notify_all()
        return b"ok"

    def finish(self, request, context):
        worker, = struct.unpack("<I", request)
        with self.cond:
            if not self.cond.wait_for(lambda: self.step == self.steps, timeout=60):
                context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "training never finished")
            self.finished.add(worker)
            if len(self.finished) == self.workers:
                self.done.set()
            return digest(self.params).encode()


def run_ps(args):
    ps = PS(args.workers, args.steps)
    handlers = {
        "Pull": grpc.unary_stream_rpc_method_handler(ps.pull, ident, ident),
        "Push": grpc.stream_unary_rpc_method_handler(ps.push, ident, ident),
        "Commit": grpc.unary_unary_rpc_method_handler(ps.commit, ident, ident),
        "Finish": grpc.unary_unary_rpc_method_handler(ps.finish, ident, ident),
    }
    from concurrent import futures
    # gRPC's defaults (SO_REUSEPORT on the listener), unless --no-reuseport asks for the
    # option a user once had to add for Slipstream.
    opts = options() + ([("grpc.so_reuseport", 0)] if args.no_reuseport else [])
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=opts)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    bound = server.add_insecure_port(f"{args.host}:{args.port}")
    if bound != args.port:
        print(f"bind to {args.port} failed ({bound})", file=sys.stderr)
        return 2
    server.start()
    print("listening", flush=True)
    ok = ps.done.wait(timeout=args.timeout)
    server.stop(grace=2).wait()
    if not ok:
        print("workers did not finish", file=sys.stderr)
        return 1
    with open(args.out, "wb") as f:
        for t in ps.params:
            f.write(t.tobytes())
    print(json.dumps({"role": "ps", "steps": ps.step, "digest": digest(ps.params),
                      "errors": ps.errors, "bytes_pulled": ps.bytes_pulled,
                      "bytes_pushed": ps.bytes_pushed}), flush=True)
    return 0 if not ps.errors and ps.step == args.steps else 1


# ---------------------------------------------------------------------------------------
# Worker


def run_worker(args):
    channel = grpc.insecure_channel(f"{args.host}:{args.port}", options=options())
    grpc.channel_ready_future(channel).result(timeout=30)
    pull = channel.unary_stream(f"/{SERVICE}/Pull", ident, ident)
    push = channel.stream_unary(f"/{SERVICE}/Push", ident, ident)
    commit = channel.unary_unary(f"/{SERVICE}/Commit", ident, ident)
    finish = channel.unary_unary(f"/{SERVICE}/Finish", ident, ident)
    times = []
    for step in range(args.steps):
        t0 = time.perf_counter()
        params = [None] * len(SHAPES)
        for msg in pull(struct.pack("<I", step), timeout=60):
            i, s, n = HEADER.unpack_from(msg)
            assert s == step and n == len(msg) - HEADER.size, "bad pull header"
            params[i] = np.frombuffer(msg, dtype=np.float32, offset=HEADER.size).reshape(SHAPES[i])
        assert all(p is not None for p in params), "pull missed a tensor"
        grads = gradient(params, args.id, step)

        def chunks():
            yield struct.pack("<II", args.id, step)
            for i, g in enumerate(grads):
                data = g.tobytes()
                for off in range(0, len(data), CHUNK):
                    part = data[off:off + CHUNK]
                    yield HEADER.pack(i, step, len(part)) + part
        reply = push(chunks(), timeout=60)
        want = struct.pack("<I", step) + digest(grads).encode()
        assert reply == want, f"push reply {reply[:80]!r} != {want[:80]!r}"
        commit(struct.pack("<II", args.id, step) + digest(grads).encode(), timeout=60)
        times.append(time.perf_counter() - t0)
    final = finish(struct.pack("<I", args.id), timeout=60).decode()
    channel.close()
    print(json.dumps({"role": "worker", "id": args.id, "steps": len(times),
                      "step_s": sorted(times)[len(times) // 2] if times else None,
                      "step_times": times, "final_digest": final}), flush=True)
    return 0


def run_expected(args):
    params = initial_params()
    for step in range(args.steps):
        params = apply(params, [gradient(params, w, step) for w in range(args.workers)])
    with open(args.out, "wb") as f:
        for t in params:
            f.write(t.tobytes())
    print(json.dumps({"digest": digest(params)}))
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("role", choices=["ps", "worker", "expected"])
    p.add_argument("--port", type=int)
    p.add_argument("--host", default="127.0.0.1",
                   help="the PS's address (the Soft-RoCE guest's tests use rxe0's)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--id", type=int, default=0)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--out")
    p.add_argument("--no-reuseport", action="store_true",
                   help="grpc.so_reuseport=0 (gRPC's default is SO_REUSEPORT on)")
    p.add_argument("--timeout", type=float, default=100)
    args = p.parse_args()
    return {"ps": run_ps, "worker": run_worker, "expected": run_expected}[args.role](args)


if __name__ == "__main__":
    if sys.argv[1:2] != ["expected"]:
        import grpc
    sys.exit(main())
