"""A daemon's descriptor clean-up in the middle of a connection, then the stream.

Each side opens its one connection, then does what python-daemon, many servers after
fork, and close_range()/closefrom() users do: every descriptor it did not open itself
(anything in /proc/self/fd but stdin, stdout, stderr and its own sockets) is closed, by
one of three ways (--how): `walk` (close each one found, as python-daemon does), `range`
(os.closerange above its own sockets: close_range(2) through libc), `closefrom` (libc's
closefrom, through ctypes). Then it opens --files files of its own, which take the lowest
free numbers (the ones just closed), asks epoll and fstat about a number it found but never
opened, and only then moves the stream: the client sends --total random bytes in random
chunks (seeded) and the server answers with the SHA-256 of what it read, then the same
number of bytes of its own, whose SHA-256 the client checks.

Over plain TCP the numbers found are the program's own or none, and every byte arrives.
Under Slipstream the numbers found include the shim's hidden descriptors: each must
answer as a number that is not open (EBADF) and stay Slipstream's, and the stream must
arrive whole.

One JSON line: {"found": [numbers not opened by the program], "closed": {fd: errno or 0}
(walk), "survivors": [the found numbers still open after the clean-up], "epoll" and
"fstat", "dup2" (a file onto it) and "fcntl": what they said of the first survivor (0 or
an errno), "files": [their numbers],
"exact": bool, "bytes": n}.
"""

import ctypes
import errno
import fcntl
import hashlib
import os
import random
import select
import socket
import tempfile

from common import LOOPBACK, argument_parser, listen, random_chunks, recv_exact, report


def foreign_fds(own):
    """Descriptors in /proc/self/fd that the program did not open (and that are still open:
    the listing's own descriptor is gone once it is read)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd in own or fd <= 2:
            continue
        try:
            os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        found.append(fd)
    return sorted(found)


def clean_up(how, own):
    found = foreign_fds(own)
    closed = {}
    if how == "walk":
        for fd in found:
            try:
                os.close(fd)
                closed[fd] = 0
            except OSError as e:
                closed[fd] = e.errno
    elif how == "range":
        os.closerange(max(own) + 1, 1 << 30)
    else:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.closefrom(ctypes.c_int(max(own) + 1))
    return found, closed


def ask_about(fd):
    """What epoll and fstat say about `fd`: 0 or the errno."""
    epoll_err = fstat_err = 0
    ep = select.epoll()
    try:
        ep.register(fd, select.EPOLLIN)
    except OSError as e:
        epoll_err = e.errno
    finally:
        ep.close()
    try:
        os.fstat(fd)
    except OSError as e:
        fstat_err = e.errno
    return epoll_err, fstat_err


def end_by_number(sock):
    """Closes a connection the way a clean-up does, by number (close_range(2) through
    libc), then reuses the number for a socket pair: it must be a socket pair, not what
    the number was before."""
    number = sock.fileno()
    os.closerange(number, number + 1)
    sock.detach()  # (the object must not close the number again)
    a, b = socket.socketpair()
    reused = number in (a.fileno(), b.fileno())
    a.sendall(b"pair")
    if b.recv(4) != b"pair" or not reused:
        raise SystemExit(f"the number {number} does not serve its new socket pair "
                         f"(reused: {reused})")
    a.close()
    b.close()


def session(args, sock, own, role):
    found, closed = clean_up(args.how, own)
    files = [tempfile.TemporaryFile() for _ in range(args.files)]
    numbers = [f.fileno() for f in files]
    for i, f in enumerate(files):
        f.write(f"file {i}\n".encode() * 64)
        f.flush()
    # What is still open of what was found: nothing over plain TCP; under Slipstream, its own.
    survivors = [fd for fd in foreign_fds(own | set(numbers)) if fd in found]
    epoll_err, fstat_err = ask_about(survivors[0]) if survivors else (errno.EBADF, errno.EBADF)
    dup_err = fcntl_err = 0
    if survivors:
        try:  # onto a number of Slipstream's: refused (it cannot move it out of the way)
            os.dup2(numbers[0], survivors[0])
        except OSError as e:
            dup_err = e.errno
        try:
            fcntl.fcntl(survivors[0], fcntl.F_GETFD)
        except OSError as e:
            fcntl_err = e.errno
    rng = random.Random(args.seed)
    total = 0
    if role == "client":
        digest = hashlib.sha256()
        for chunk in random_chunks(rng, args.total, 256 * 1024):
            sock.sendall(chunk)
            digest.update(chunk)
            total += len(chunk)
        theirs = recv_exact(sock, 32)
        exact = theirs == digest.digest()
        expected = hashlib.sha256(random.Random(args.seed + 1).randbytes(args.total)).digest()
        back = hashlib.sha256(recv_exact(sock, args.total)).digest()
        exact = exact and back == expected
        total += args.total
    else:
        sock.sendall(hashlib.sha256(recv_exact(sock, args.total)).digest())
        sock.sendall(random.Random(args.seed + 1).randbytes(args.total))
        total = 2 * args.total
        exact = True
    # The files are still the program's own: what was written is what is read.
    for i, f in enumerate(files):
        f.seek(0)
        exact = exact and f.read() == f"file {i}\n".encode() * 64
        f.close()
    report(found=found, closed=closed, survivors=survivors, epoll=epoll_err, dup2=dup_err,
           fcntl=fcntl_err, fstat=fstat_err,
           files=numbers, exact=exact, bytes=total)


def main():
    parser = argument_parser(__doc__, role=True)
    parser.add_argument("--how", choices=["walk", "range", "closefrom"], required=True)
    parser.add_argument("--files", type=int, default=20)
    parser.add_argument("--total", type=int, default=4 << 20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.role == "server":
        with listen(args.port) as listener:
            listener.listen(2)
            conn, _ = listener.accept()
            extra, _ = listener.accept()
            end_by_number(extra)
            with conn:
                session(args, conn, {listener.fileno(), conn.fileno()}, "server")
                if conn.recv(1) != b"":
                    raise SystemExit("expected EOF")
    else:
        with socket.create_connection((LOOPBACK, args.port)) as conn:
            with socket.create_connection((LOOPBACK, args.port)) as extra:
                # Ended by the server's close_range: EOF, as over TCP.
                extra.settimeout(30)
                if extra.recv(1) != b"":
                    raise SystemExit("the connection the server closed sent bytes")
            session(args, conn, {conn.fileno()}, "client")


if __name__ == "__main__":
    main()
