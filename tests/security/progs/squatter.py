"""The rendezvous squatter: a local user (run it as uid nobody) who binds the abstract name
a Slipstream server is about to publish for its listening socket, before the server
publishes it, and waits for Slipstream clients to hand it their registrations.

Abstract AF_UNIX names have no owner and no permissions: whoever binds a name first holds
it. A client that trusts any process behind the name sends it REGISTER with four
descriptors: its shared-memory region (the connection's bytes, both ways) and the proxies.

Protocol v3 names one rendezvous per TCP listening socket:
"\\0slipstream-v3:<port>:<inode>", with the listening socket's inode. A real squatter would
predict the inode (socket inodes come from a counter) or race the server between its
socket() and listen(); the test makes it deterministic: its server prints the inode after
bind() and listens only once we hold the name (progs/late_listen.py). Binds the name for
each --inode as a SOCK_SEQPACKET listener (and each --path: a name in a rendezvous
directory, SLIP_RENDEZVOUS_DIR, whose names are path names), prints READY, then accepts
every connection and records every message and every descriptor it is sent. On SIGTERM it prints one JSON line:
  {"uid", "bound": [names], "connections": n, "peers": [{"pid", "uid"} of each connection,
   SO_PEERCRED], "messages": [{"name", "bytes", "fds", "type", "head"}], "fds": total
   descriptors received}
"""

import argparse
import json
import os
import selectors
import signal
import socket
import struct
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int)
    parser.add_argument("--inode", type=int, action="append", default=[],
                        help="the listening socket's inode (repeatable; needs --port)")
    parser.add_argument("--path", action="append", default=[],
                        help="a path name to bind (repeatable)")
    args = parser.parse_args()
    if not args.path and not (args.inode and args.port):
        parser.error("--port and --inode, or --path")

    sel = selectors.DefaultSelector()
    bound = []
    names = [f"\0slipstream-v3:{args.port}:{inode}" for inode in args.inode] + args.path
    for name in names:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.bind(name)
        if not name.startswith("\0"):
            os.chmod(name, 0o666)  # (a client of another uid must be able to connect)
        sock.listen(64)
        sel.register(sock, selectors.EVENT_READ, ("listener", name))
        bound.append(name.lstrip("\0"))
    state = {"connections": 0, "peers": [], "messages": [], "fds": 0}

    def finish(*_):
        print(json.dumps({"uid": os.getuid(), "bound": bound, **state}), flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, finish)
    print("READY", flush=True)
    fd_size = struct.calcsize("i")
    while True:
        for key, _ in sel.select():
            kind, name = key.data
            if kind == "listener":
                conn, _ = key.fileobj.accept()
                state["connections"] += 1
                pid, uid, _gid = struct.unpack("3i", conn.getsockopt(
                    socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
                state["peers"].append({"pid": pid, "uid": uid})
                sel.register(conn, selectors.EVENT_READ, ("conn", name))
                continue
            conn = key.fileobj
            try:
                data, ancillary, _, _ = conn.recvmsg(4096, socket.CMSG_SPACE(64 * fd_size))
            except OSError:
                data, ancillary = b"", []
            fds = []
            for level, kind_, payload in ancillary:
                if level == socket.SOL_SOCKET and kind_ == socket.SCM_RIGHTS:
                    fds += struct.unpack(f"{len(payload) // fd_size}i",
                                         payload[:len(payload) - len(payload) % fd_size])
            for fd in fds:
                os.close(fd)
            if data or fds:
                state["fds"] += len(fds)
                state["messages"].append({"name": name.lstrip("\0"), "bytes": len(data), "fds": len(fds),
                                          "type": data[5] if len(data) > 5 else None,
                                          "head": data[:24].hex()})
            if not data:
                sel.unregister(conn)
                conn.close()


if __name__ == "__main__":
    main()
