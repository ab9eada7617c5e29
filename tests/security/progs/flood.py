"""Floods a Slipstream server's rendezvous, as any local user can (run as uid nobody or root).

--mode registrations  up to --count REGISTER messages, each a valid registration with four
                      real descriptors (a fresh sealed memfd region with magic, ring size and
                      nonce, server A and B of one socketpair, client B of another), each for
                      a 4-tuple that never connects over TCP, at the v3 rendezvous of the
                      listener of --port (raw_shm.find_rendezvous). Stops early at the first
                      refusal: no rendezvous, a send error (e.g. ETOOMANYREFS), a DECLINE,
                      or the rendezvous backlog is full (EAGAIN) - unless --retry-busy S:
                      then a full backlog prints BUSY (once) and is retried for up to S s, as
                      back-pressure. The rendezvous connections stay open (a registration
                      the listener keeps is answered only when it is taken or dropped, on
                      its own connection); answers are read as they come and, at the end,
                      for up to --answer-wait s more. A DECLINE stops the flood whatever its
                      reason (a refusal of the new registration, or the eviction of an
                      older one: no_registration); "decline_reasons" counts them by name.
                      Reports {"sent", "accepted", "declined", "other_answers",
                      "unanswered", "decline_reasons", "stopped", "busy_at", "held",
                      "seconds"}; "held": registrations still unanswered when the flood
                      stopped (kept by the listener, as far as we know).
--mode malformed      --count messages the server must drop, cycling through: random bytes,
                      a REGISTER with a bad checksum, a REGISTER without descriptors, a
                      REGISTER with two descriptors, a truncated header. After every
                      --drain-every messages (and whenever the backlog is full) a plain TCP
                      connection to --port makes the server's accept() read the rendezvous.
                      Reports {"sent", "kinds", "drains", "busy"}.
"""

import argparse
import errno
import json
import os
import random
import selectors
import socket
import time

from raw_shm import (DECLINE_REASONS, REGISTER, find_rendezvous, make_memfd, message,
                     read_answer, region_size, register_message, rendezvous_names,
                     send_with_fds)


def report(**fields):
    print(json.dumps(fields), flush=True)


def registration(args, index):
    nonce = random.getrandbits(64) or 1
    memfd = make_memfd(args.ring_size, nonce)
    server_a, server_b = socket.socketpair()
    client_a, client_b = socket.socketpair()
    fds = [memfd, server_a.fileno(), server_b.fileno(), client_b.fileno()]
    source_port = 1024 + (args.first_source_port + index) % 64000
    msg = register_message((args.host, source_port), (args.host, args.port), nonce,
                           args.ring_size, region_size(args.ring_size))
    return msg, fds, [server_a, server_b, client_a, client_b], memfd


def flood_registrations(args):
    start = time.monotonic()
    sel = selectors.DefaultSelector()
    counts = {"sent": 0, "accepted": 0, "declined": 0, "other_answers": 0}
    stopped, reasons = "count", {}
    names = rendezvous_names(args.port, args.host)  # the listener does not change

    def take_answer(sock):
        answer = read_answer(sock, 0)
        if answer is None:
            return None
        sel.unregister(sock)
        sock.close()
        if answer[0] == "accept":
            counts["accepted"] += 1
        elif answer[0] == "decline":
            counts["declined"] += 1
            reason = DECLINE_REASONS.get(answer[2], str(answer[2]))
            reasons[reason] = reasons.get(reason, 0) + 1
        else:
            counts["other_answers"] += 1
        return answer

    busy_since = None
    index = 0
    while index < args.count:
        sock, _, why = find_rendezvous(args.port, args.host, nonblocking=True, names=names)
        if sock is None and why == "busy" and args.retry_busy > 0:
            # Back-pressure, not a refusal: the server reads its rendezvous when it accepts.
            if busy_since is None:
                busy_since = time.monotonic()
                counts["busy_at"] = counts["sent"]
                print("BUSY", flush=True)
            if time.monotonic() - busy_since < args.retry_busy:
                time.sleep(0.005)
                continue
        if sock is None:
            stopped = f"rendezvous {why}"
            break
        index += 1
        msg, fds, pairs, memfd = registration(args, index)
        try:
            send_with_fds(sock, msg, fds)
            counts["sent"] += 1
        except OSError as e:
            stopped = f"send {errno.errorcode.get(e.errno, e.errno)}"
            sock.close()
            break
        finally:
            for pair_end in pairs:
                pair_end.close()
            os.close(memfd)
        sel.register(sock, selectors.EVENT_READ)
        for key, _ in sel.select(0):
            answer = take_answer(key.fileobj)
            if answer and answer[0] == "decline":
                stopped = "declined"
        if stopped == "declined":
            break
    held = len(sel.get_map())
    deadline = time.monotonic() + args.answer_wait
    while sel.get_map() and time.monotonic() < deadline:
        for key, _ in sel.select(0.05):
            take_answer(key.fileobj)
    unanswered = len(sel.get_map())
    for key in list(sel.get_map().values()):
        key.fileobj.close()
    report(**counts, unanswered=unanswered, decline_reasons=reasons, stopped=stopped,
           held=held, seconds=round(time.monotonic() - start, 2))


def malformed(kind, rng, args):
    """(bytes, number of descriptors to attach) of one message the server must drop."""
    good = register_message((args.host, 40000), (args.host, args.port), 1, 4096,
                            region_size(4096))
    if kind == "junk":
        return b"JUNK" + rng.randbytes(rng.randint(12, 200)), 0
    if kind == "bad_crc":
        return good[:12] + b"\xde\xad\xbe\xef" + good[16:], 0
    if kind == "no_fds":
        return good, 0
    if kind == "two_fds":
        return good, 2
    if kind == "truncated":
        return message(REGISTER, b"")[:9], 0
    raise ValueError(kind)


KINDS = ("junk", "bad_crc", "no_fds", "two_fds", "truncated")


def drain(args):
    """A plain TCP connection: the server's accept() reads its rendezvous."""
    try:
        with socket.create_connection((args.host, args.port), timeout=5):
            pass
    except OSError:
        pass


def flood_malformed(args):
    rng = random.Random(args.seed)
    counts = {kind: 0 for kind in KINDS}
    sent, drains, busy = 0, 0, 0
    pair = socket.socketpair()
    names = rendezvous_names(args.port, args.host)
    while sent < args.count:
        kind = KINDS[sent % len(KINDS)]
        data, nfds = malformed(kind, rng, args)
        sock, _, why = find_rendezvous(args.port, args.host, nonblocking=True, names=names)
        if sock is None:
            if why != "busy" or busy > 1000:
                break
            busy += 1
            drain(args)
            drains += 1
            time.sleep(0.02)
            continue
        try:
            send_with_fds(sock, data, [pair[0].fileno()] * nfds)
        except OSError:
            pass
        sock.close()
        counts[kind] += 1
        sent += 1
        if sent % args.drain_every == 0:
            drain(args)
            drains += 1
    drain(args)
    report(sent=sent, kinds=counts, drains=drains + 1, busy=busy)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("registrations", "malformed"), required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--ring-size", type=int, default=4096)
    parser.add_argument("--first-source-port", type=int, default=0)
    parser.add_argument("--answer-wait", type=float, default=2.0)
    parser.add_argument("--retry-busy", type=float, default=0.0,
                        help="registrations: when the backlog is full, print BUSY once and "
                        "keep retrying for up to this many seconds")
    parser.add_argument("--drain-every", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    (flood_registrations if args.mode == "registrations" else flood_malformed)(args)


if __name__ == "__main__":
    main()
