"""The rendezvous squatter: a local user (run it as uid nobody) who binds the abstract names
a Slipstream server is about to publish for --port, before that server starts, and waits
for Slipstream clients to hand it their registrations.

Abstract AF_UNIX names have no owner and no permissions: whoever binds a name first holds
it. A client that trusts any process behind the name sends it REGISTER with four
descriptors: its shared-memory region (the connection's bytes, both ways) and the proxies.

Binds "\\0slipstream-v1:<port>:<scope>" and "\\0slipstream-v2:<port>:<scope>" for each
--scope (e.g. 127.0.0.1, or *4 for a 0.0.0.0 listener) as SOCK_SEQPACKET listeners, prints
READY, then accepts every connection and records every message and every descriptor it is
sent. On SIGTERM it prints one JSON line:
  {"uid", "bound": [names], "connections": n, "messages": [{"name", "bytes", "fds",
   "type", "head"}], "fds": total descriptors received}
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
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--scope", action="append", required=True)
    args = parser.parse_args()

    sel = selectors.DefaultSelector()
    bound = []
    for version in (1, 2):
        for scope in args.scope:
            name = f"\0slipstream-v{version}:{args.port}:{scope}"
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.bind(name)
            sock.listen(64)
            sel.register(sock, selectors.EVENT_READ, ("listener", name))
            bound.append(name[1:])
    state = {"connections": 0, "messages": [], "fds": 0}

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
                state["messages"].append({"name": name[1:], "bytes": len(data), "fds": len(fds),
                                          "type": data[5] if len(data) > 5 else None,
                                          "head": data[:24].hex()})
            if not data:
                sel.unregister(conn)
                conn.close()


if __name__ == "__main__":
    main()
