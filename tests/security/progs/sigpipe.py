"""Writing to a connection whose peer has gone: how many writes succeed, what fails, and
whether SIGPIPE (at its default action: death) comes, and after which write.

server (the peer) accepts one connection and then, by --scenario:
  close         closes it at once (nothing unread): TCP sends a FIN
  close_unread  waits until the client's first bytes are there, leaves them unread and
                closes (TCP sends a RST instead of a FIN)
  shut_rd       shutdown(SHUT_RD) and keeps the socket open
and stays alive --hold s, so that its process's exit is not what the client sees.

client (the writer) runs with SIGPIPE at its default action. It connects, sends 100 bytes
first when the scenario is close_unread, waits --settle s for the peer to act, then writes
1 KiB every 10 ms, --writes times, printing "write N ok" or "write N error ERRNO" after each
(flushed: a death by SIGPIPE leaves the lines before it). It stops after --max-errors
errors and then prints "done". The harness reads the lines and the exit status.
"""

import argparse
import errno
import signal
import socket
import time


def server(args):
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((args.host, args.port))
        listener.listen(1)
        conn, _ = listener.accept()
    if args.scenario == "close":
        conn.close()
    elif args.scenario == "close_unread":
        conn.recv(1, socket.MSG_PEEK)  # the client's bytes are there; leave them unread
        time.sleep(0.05)
        conn.close()
    else:
        conn.shutdown(socket.SHUT_RD)
    print("PEER DONE", flush=True)
    time.sleep(args.hold)


def client(args):
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sock = socket.create_connection((args.host, args.port))
    if args.scenario == "close_unread":
        sock.sendall(b"u" * 100)
    time.sleep(args.settle)
    errors = 0
    block = b"w" * 1024
    for n in range(1, args.writes + 1):
        try:
            sent = sock.send(block)
            print(f"write {n} ok {sent}", flush=True)
        except OSError as e:
            print(f"write {n} error {errno.errorcode.get(e.errno, e.errno)}", flush=True)
            errors += 1
            if errors >= args.max_errors:
                break
        time.sleep(0.01)
    print("done", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("role", choices=("server", "client"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--scenario", choices=("close", "close_unread", "shut_rd"),
                        required=True)
    parser.add_argument("--writes", type=int, default=30)
    parser.add_argument("--max-errors", type=int, default=3)
    parser.add_argument("--settle", type=float, default=0.3)
    parser.add_argument("--hold", type=float, default=3.0)
    args = parser.parse_args()
    (server if args.role == "server" else client)(args)


if __name__ == "__main__":
    main()
