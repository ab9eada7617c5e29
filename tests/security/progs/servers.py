"""The victims: ordinary TCP servers, run under slip-run by the security tests. Each listens
on --bind:--port and reports one JSON line on stdout when it ends (SIGTERM ends the ones that
run until told; they exit with status 0 through a normal interpreter exit, so Slipstream's
exit handlers run and its stats line is written).

--impl threaded    accept loop, one thread per connection echoing until EOF (blocking
                   recv/sendall); --accept-delay S sleeps before every accept(); with
                   --wait-signal it accepts nothing until SIGUSR1; with --keep-accepting an
                   accept() that fails is counted by errno and tried again 10 ms later, as
                   production servers do (without it, the failure ends the program). Runs
                   until SIGTERM. Reports {"connections", "echoed", "ended": {"eof": n,
                   "<errno>": n}, "accept_errors": {"<errno>": n}}.
--impl sequential  accepts --count connections one after another, each echoed until EOF and
                   closed. --free-fds N first opens /dev/null until open() fails with EMFILE,
                   then closes the last N opened, so that only N descriptors are free.
                   Any accept() failure ends it at once (status 1). Reports
                   {"connections", "echoed", "accept_errors", "free_fds"}.
--impl asyncio     asyncio echo server (non-blocking listener) with a heartbeat task that
                   measures the event loop's lag every 10 ms. Runs until SIGTERM. Reports
                   {"connections", "echoed", "max_lag_ms", "lags_over_100ms"}.
--impl lt_reader   a level-triggered selectors (epoll) loop: accepts, and on readiness reads
                   until EAGAIN, counting bytes. Runs until SIGTERM. Reports {"received"}.
--impl recv_one    accepts one connection and blocks in recv until EOF or an error. Reports
                   {"received", "received_sha256", "result": "eof"|"<errno>"}.
--impl closer      accepts connections and closes them at once, until SIGTERM.
                   Reports {"connections"}.
"""

import argparse
import asyncio
import errno
import hashlib
import json
import os
import selectors
import signal
import socket
import sys
import threading
import time

READ = 64 * 1024


def report(**fields):
    print(json.dumps(fields), flush=True)


def listen(bind, port, backlog=128):
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((bind, port))
    sock.listen(backlog)
    return sock


def error_name(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if isinstance(e, OSError) else repr(e)


def echo(conn):
    """Echoes until EOF; returns (bytes echoed, how it ended)."""
    echoed = 0
    try:
        while data := conn.recv(READ):
            conn.sendall(data)
            echoed += len(data)
        return echoed, "eof"
    except OSError as e:
        return echoed, error_name(e)
    finally:
        conn.close()


class Totals:
    def __init__(self):
        self.lock = threading.Lock()
        self.connections = 0
        self.echoed = 0
        self.ended = {}

    def add(self, echoed, end):
        with self.lock:
            self.connections += 1
            self.echoed += echoed
            self.ended[end] = self.ended.get(end, 0) + 1


def stop_on_sigterm(report_fn):
    def handler(*_):
        report_fn()
        sys.exit(0)
    signal.signal(signal.SIGTERM, handler)


def serve_threaded(args):
    totals = Totals()
    accept_errors = {}
    go = threading.Event()
    if not args.wait_signal:
        go.set()
    signal.signal(signal.SIGUSR1, lambda *_: go.set())
    stop_on_sigterm(lambda: report(connections=totals.connections, echoed=totals.echoed,
                                   ended=totals.ended, accept_errors=accept_errors))
    listener = listen(args.bind, args.port)
    while not go.is_set():
        go.wait(0.05)
    print("ACCEPTING", flush=True)
    while True:
        if args.accept_delay:
            time.sleep(args.accept_delay)
        try:
            conn, _ = listener.accept()
        except OSError as e:
            if not args.keep_accepting:
                raise
            accept_errors[error_name(e)] = accept_errors.get(error_name(e), 0) + 1
            time.sleep(0.01)
            continue

        def run(conn=conn):
            totals.add(*echo(conn))
        threading.Thread(target=run, daemon=True).start()


def fill_fds(free):
    opened = []
    while True:
        try:
            opened.append(os.open("/dev/null", os.O_RDONLY))
        except OSError as e:
            if e.errno != errno.EMFILE:
                raise
            break
    for fd in opened[len(opened) - free:]:
        os.close(fd)
    return opened[:len(opened) - free]


def serve_sequential(args):
    listener = listen(args.bind, args.port)
    held = fill_fds(args.free_fds) if args.free_fds is not None else []
    echoed, served, accept_errors = 0, 0, []
    ended = {}
    for _ in range(args.count):
        try:
            conn, _ = listener.accept()
        except OSError as e:
            accept_errors.append(error_name(e))
            break
        n, end = echo(conn)
        echoed += n
        served += 1
        ended[end] = ended.get(end, 0) + 1
    report(connections=served, echoed=echoed, accept_errors=accept_errors, ended=ended,
           held_fds=len(held), free_fds=args.free_fds)
    sys.exit(1 if accept_errors else 0)


def serve_asyncio(args):
    state = {"connections": 0, "echoed": 0, "max_lag": 0.0, "over": 0}

    async def handle(reader, writer):
        state["connections"] += 1
        try:
            while data := await reader.read(READ):
                writer.write(data)
                await writer.drain()
                state["echoed"] += len(data)
        except OSError:
            pass
        writer.close()

    async def heartbeat():
        period = 0.01
        loop = asyncio.get_running_loop()
        while True:
            before = loop.time()
            await asyncio.sleep(period)
            lag = loop.time() - before - period
            state["max_lag"] = max(state["max_lag"], lag)
            if lag > 0.1:
                state["over"] += 1

    async def main():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        sock = listen(args.bind, args.port)
        sock.setblocking(False)
        server = await asyncio.start_server(handle, sock=sock)
        beat = asyncio.create_task(heartbeat())
        async with server:
            await stop.wait()
        beat.cancel()

    asyncio.run(main())
    report(connections=state["connections"], echoed=state["echoed"],
           max_lag_ms=round(state["max_lag"] * 1000, 1), lags_over_100ms=state["over"])


def serve_lt_reader(args):
    received = [0]
    stop_on_sigterm(lambda: report(received=received[0]))
    listener = listen(args.bind, args.port)
    listener.setblocking(False)
    sel = selectors.DefaultSelector()  # epoll, level-triggered
    sel.register(listener, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj is listener:
                try:
                    conn, _ = listener.accept()
                except BlockingIOError:
                    continue
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ)
                continue
            conn = key.fileobj
            while True:  # until EAGAIN
                try:
                    data = conn.recv(READ)
                except BlockingIOError:
                    break
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(conn)
                    conn.close()
                    break
                received[0] += len(data)


def serve_recv_one(args):
    listener = listen(args.bind, args.port)
    conn, _ = listener.accept()
    listener.close()
    sha, count = hashlib.sha256(), 0
    try:
        while data := conn.recv(READ):
            sha.update(data)
            count += len(data)
        result = "eof"
    except OSError as e:
        result = error_name(e)
    report(received=count, received_sha256=sha.hexdigest(), result=result)


def serve_closer(args):
    count = [0]
    stop_on_sigterm(lambda: report(connections=count[0]))
    listener = listen(args.bind, args.port, backlog=4096)
    while True:
        conn, _ = listener.accept()
        count[0] += 1
        conn.close()


IMPLS = {"threaded": serve_threaded, "sequential": serve_sequential, "asyncio": serve_asyncio,
         "lt_reader": serve_lt_reader, "recv_one": serve_recv_one, "closer": serve_closer}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--impl", choices=sorted(IMPLS), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--free-fds", type=int)
    parser.add_argument("--accept-delay", type=float, default=0.0)
    parser.add_argument("--wait-signal", action="store_true")
    parser.add_argument("--keep-accepting", action="store_true")
    args = parser.parse_args()
    IMPLS[args.impl](args)


if __name__ == "__main__":
    main()
