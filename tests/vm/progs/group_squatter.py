"""A local user's squat on an SO_REUSEPORT member's verbs directory name (tests/vm/verbs_cases.py
reuseport.squat; docs/SECURITY.md "Remote hosts (verbs)").

  group_squatter.py --port PORT --inode INODE --answer RDMA_PORT

Binds the abstract AF_UNIX name under which a member process of the group on PORT would say
where its rdma_cm listener is ("slipstream-verbs-group-v1:PORT:INODE"), answers everyone who
asks with RDMA_PORT (two bytes, little-endian), prints READY, and at SIGTERM one JSON line:
{"uid": its uid, "asked": how many asked}. The holder of the group's port must not believe
it: the squatter does not own the member's socket.
"""

import argparse
import json
import os
import signal
import socket
import struct
import sys
import threading


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--inode", type=int, required=True)
    parser.add_argument("--answer", type=int, default=1234)
    args = parser.parse_args()
    name = f"\0slipstream-verbs-group-v1:{args.port}:{args.inode}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(name)
    sock.listen(64)
    asked = [0]
    lock = threading.Lock()

    def finish(*_):
        with lock:
            print(json.dumps({"uid": os.getuid(), "asked": asked[0]}), flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, finish)
    print("READY", flush=True)
    while True:
        conn, _ = sock.accept()
        with lock:
            asked[0] += 1
        with conn:
            try:
                conn.sendall(struct.pack("<H", args.answer))
            except OSError:
                pass  # (the holder saw whose name this is and hung up before reading)


if __name__ == "__main__":
    main()
