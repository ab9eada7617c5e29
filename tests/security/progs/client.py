"""The legitimate client (run under slip-run): it must get its bytes back exactly, whatever
the attacker did to the server.

--mode echo  --connections N connections, one after another (or, with --connect-first, all
             connected first, "CONNECTED" printed, then all exchanged at once). Each sends
             a random amount of random bytes (--min-bytes .. --max-bytes, seeded) in
             random-size writes from a thread, shuts down its write side and reads the echo
             until EOF; the echo must be the same bytes. With --fill-fds, after one warm-up
             connection to a listener of its own, descriptors are opened on /dev/null until
             EMFILE, one is closed and the connection's socket takes it: nothing is left
             free for Slipstream. Reports
             {"results": [{"index", "sent", "sent_sha256", "received", "received_sha256",
             "exact", "error"}], "failed": n}; exits 0 once every connection ended, however,
             or 3 (with the report) when no byte moved for --stall s.
--mode rtt   one connection, round trips of random size (1 B .. 64 KiB) for --duration s,
             each echo compared. Prints CONNECTED first. Reports {"round_trips", "bytes",
             "max_rtt_ms", "exact", "error"}.
"""

import argparse
import errno
import hashlib
import json
import os
import random
import socket
import threading
import time


def report(**fields):
    print(json.dumps(fields), flush=True)


def error_name(e):
    return errno.errorcode.get(e.errno, str(e.errno)) if isinstance(e, OSError) else repr(e)


def random_size(rng, max_size):
    return max(1, min(max_size, int(2 ** rng.uniform(0, max_size.bit_length()))))


def payload_for(seed, index, min_bytes, max_bytes):
    rng = random.Random(seed * 7919 + index)
    total = rng.randint(min_bytes or max(1, max_bytes // 4), max_bytes)
    chunks, left = [], total
    while left:
        size = min(left, random_size(rng, 256 * 1024))
        chunks.append(rng.randbytes(size))
        left -= size
    return chunks


def connect(args):
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.connect((args.host, args.port))
    return sock


class Watchdog:
    """Ends the program with a report when no connection moved a byte for `stall` s: a hung
    exchange is a failure to report, not a wait for the harness' deadline."""

    def __init__(self, stall, results):
        self.stall = stall
        self.results = results
        self.progress = 0
        self.current = {}
        threading.Thread(target=self.run, daemon=True).start()

    def moved(self, index, what, n):
        self.progress += 1
        entry = self.current.setdefault(index, {"sent": 0, "received": 0})
        entry[what] += n

    def run(self):
        last, since = -1, time.monotonic()
        while True:
            time.sleep(0.25)
            if self.progress != last:
                last, since = self.progress, time.monotonic()
            elif time.monotonic() - since > self.stall:
                done = {r["index"] for r in self.results}
                stalled = [{"index": i, "exact": False, "error": f"stalled {self.stall:g} s "
                            f"after sending {c['sent']} B and receiving {c['received']} B",
                            "sent": c["sent"], "received": c["received"]}
                           for i, c in self.current.items() if i not in done]
                everything = sorted(self.results + stalled, key=lambda r: r["index"])
                report(results=everything, failed=sum(1 for r in everything
                                                       if not r["exact"] or r.get("error")))
                os._exit(3)


WATCHDOG = None


def exchange(sock, chunks, index):
    """Sends the chunks (a thread) while reading the echo until EOF."""
    sent = b"".join(chunks)
    errors = []
    WATCHDOG.moved(index, "sent", 0)

    def sender():
        try:
            for chunk in chunks:
                sock.sendall(chunk)
                WATCHDOG.moved(index, "sent", len(chunk))
            sock.shutdown(socket.SHUT_WR)
        except OSError as e:
            errors.append(f"send: {error_name(e)}")

    thread = threading.Thread(target=sender)
    thread.start()
    received = bytearray()
    try:
        while data := sock.recv(65536):
            received += data
            WATCHDOG.moved(index, "received", len(data))
    except OSError as e:
        errors.append(f"recv: {error_name(e)}")
    thread.join()
    sock.close()
    return {"index": index, "sent": len(sent), "sent_sha256": hashlib.sha256(sent).hexdigest(),
            "received": len(received),
            "received_sha256": hashlib.sha256(received).hexdigest(),
            "exact": bytes(received) == sent, "error": "; ".join(errors) or None}


def warm_up():
    """One connection to a listener of our own, so that the shim has opened its stats file
    (and started what it starts with a first connection) before the descriptors run out,
    as in any long-running program."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with socket.create_connection(listener.getsockname()) as out:
            conn, _ = listener.accept()
            out.sendall(b"w")
            conn.recv(1)
            conn.close()


def fill_fds():
    opened = []
    while True:
        try:
            opened.append(os.open("/dev/null", os.O_RDONLY))
        except OSError as e:
            if e.errno != errno.EMFILE:
                raise
            break
    os.close(opened.pop())
    return opened


def mode_echo(args):
    global WATCHDOG
    results = []
    WATCHDOG = Watchdog(args.stall, results)
    if args.connect_first:
        socks = [connect(args) for _ in range(args.connections)]
        print("CONNECTED", flush=True)
        threads = []
        for index, sock in enumerate(socks):
            chunks = payload_for(args.seed, index, args.min_bytes, args.max_bytes)
            thread = threading.Thread(
                target=lambda s=sock, c=chunks, i=index: results.append(exchange(s, c, i)))
            thread.start()
            threads.append(thread)
        for thread in threads:
            thread.join()
    else:
        for index in range(args.connections):
            chunks = payload_for(args.seed, index, args.min_bytes, args.max_bytes)
            if args.fill_fds and index == 0:
                warm_up()
            held = fill_fds() if args.fill_fds else []
            try:
                sock = connect(args)
                # Descriptors stay taken while the connection lives; the exchange needs none.
                results.append(exchange(sock, chunks, index))
            except OSError as e:
                results.append({"index": index, "exact": False,
                                "error": f"connect: {error_name(e)}"})
            for fd in held:
                os.close(fd)
    results.sort(key=lambda r: r["index"])
    report(results=results, failed=sum(1 for r in results if not r["exact"] or r["error"]))


def mode_rtt(args):
    rng = random.Random(args.seed)
    sock = connect(args)
    print("CONNECTED", flush=True)
    end = time.monotonic() + args.duration
    trips, moved, worst, exact, error = 0, 0, 0.0, True, None
    try:
        while time.monotonic() < end:
            message = rng.randbytes(random_size(rng, 64 * 1024))
            start = time.monotonic()
            sock.sendall(message)
            echo = bytearray()
            while len(echo) < len(message):
                data = sock.recv(len(message) - len(echo))
                if not data:
                    raise ConnectionError("EOF before the whole echo")
                echo += data
            worst = max(worst, time.monotonic() - start)
            exact &= bytes(echo) == message
            trips += 1
            moved += len(message)
            time.sleep(0.002)
        sock.shutdown(socket.SHUT_WR)
        if sock.recv(1):
            exact = False
    except (OSError, ConnectionError) as e:
        error = error_name(e)
    sock.close()
    report(round_trips=trips, bytes=moved, max_rtt_ms=round(worst * 1000, 1), exact=exact,
           error=error)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("echo", "rtt"), default="echo")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--min-bytes", type=int, help="default: --max-bytes/4")
    parser.add_argument("--max-bytes", type=int, default=256 * 1024)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--connect-first", action="store_true")
    parser.add_argument("--fill-fds", action="store_true")
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--stall", type=float, default=6.0,
                        help="echo: give up (status 3) when no byte moved for this long")
    args = parser.parse_args()
    (mode_echo if args.mode == "echo" else mode_rtt)(args)


if __name__ == "__main__":
    main()
