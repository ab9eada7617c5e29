"""A child started by subprocess (Python uses vfork when it can) gets an accelerated socket
as its stdin: the child's dup2 onto its stdin must not change the parent's own fd 0.

Both ends of the connection are in this process. The parent's fd 0 is a pipe holding
known bytes; after the child ran, reading fd 0 must give those bytes, not the socket's
(the bug: the child's dup2 went through the shim and rewrote the parent's fd table, which
the vfork child shares), and the socket must still hold its own bytes.

--fork: subprocess forks instead (as it does with preexec_fn, and as every vfork is under
ThreadSanitizer). The child then holds the connection beside the parent when it execs: the
parent keeps it, and the socket's bytes arrive once (the bug: the child took itself for
the only holder and handed the connection back to TCP, and the peer sent them again)."""

import os
import socket
import subprocess

from common import LOOPBACK, argument_parser, fail, report

PIPE_BYTES = b"from-the-pipe"
SOCKET_BYTES = b"from-the-socket"


def main():
    parser = argument_parser(__doc__)
    parser.add_argument("--fork", action="store_true", help="subprocess forks, not vforks")
    args = parser.parse_args()
    if args.fork:
        subprocess._USE_VFORK = False  # (CPython 3.11's switch; read at each Popen)
    r, w = os.pipe()
    os.dup2(r, 0)
    os.write(w, PIPE_BYTES)
    with socket.create_server((LOOPBACK, args.port)) as listener:
        client = socket.create_connection((LOOPBACK, args.port))
        server, _ = listener.accept()
    client.settimeout(10)
    server.sendall(SOCKET_BYTES)
    child = subprocess.Popen(["/bin/true"], stdin=client)
    if child.wait() != 0:
        fail(f"the child exited with {child.returncode}")
    got = os.read(0, 64)
    if got != PIPE_BYTES:
        fail(f"the parent's fd 0 gave {got!r}, expected {PIPE_BYTES!r} (the child's dup2 "
             f"changed the parent's descriptor table)")
    on_socket = client.recv(64)
    server.close()  # (EOF next: nothing more may come, not the same bytes again)
    on_socket += recv_all(client)
    if on_socket != SOCKET_BYTES:
        fail(f"the socket gave {on_socket!r}, expected {SOCKET_BYTES!r}")
    report(stdin=got.decode(), socket=on_socket.decode())


def recv_all(sock):
    data = b""
    while chunk := sock.recv(64):
        data += chunk
    return data


if __name__ == "__main__":
    main()
