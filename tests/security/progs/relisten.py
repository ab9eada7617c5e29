"""A server that listens again and again on one address and port for `--seconds` (socket,
SO_REUSEADDR, bind, listen, close), so that under slip-run its rendezvous is published
and withdrawn each time: in SLIP_RENDEZVOUS_DIR, a name bound and opened to every user
per listen (rendezvous_publish races that). Prints {"listens": n} at the end.
"""

import argparse
import json
import socket
import time


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args()
    listens = 0
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((args.host, args.port))
        sock.listen(16)
        listens += 1
        sock.close()
    print(json.dumps({"listens": listens}), flush=True)


if __name__ == "__main__":
    main()
