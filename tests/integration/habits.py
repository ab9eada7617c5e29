"""A program's own habits, which work over plain TCP, must keep working once its
connections are accelerated: closing every descriptor it did not open (a daemon's
clean-up) in the middle of a connection; moving bytes with splice(2); reading and writing
with stdio on an fdopen'd socket; MSG_ZEROCOPY with its completions. Every byte is
checked.
"""

import errno

from cases import case
from harness import ACCEL, LOOPBACK, py


def exchange(t, script, *args):
    """progs/`script` as server and client under slip-run, both exiting 0, each stream's
    SHA-256 the same at both ends (their reports' sent_sha and received_sha)."""
    common = ("--port", t.port, *args)
    server = t.serve("server", py(script, "server", *common), slip=True)
    client = t.start("client", py(script, "client", *common), slip=True)
    client.expect_exit(0)
    server.expect_exit(0)
    s, c = server.json_output(), client.json_output()
    t.check(c["sent_sha"] == s["received_sha"], "client -> server: the bytes differ")
    t.check(s["sent_sha"] == c["received_sha"], "server -> client: the bytes differ")
    return server, client


@case("fd_cleanup", variants=("walk", "range", "closefrom"))
def fd_cleanup(t, how):
    """Both ends, with one connection open, close every descriptor they did not open
    (progs/fd_cleanup.py): walk: each one found in /proc/self/fd, by close(); range:
    os.closerange() above their sockets (close_range(2)); closefrom: libc's closefrom().
    Then each opens 20 files of its own and moves 4 MiB each way. Before that, the server
    ends a second connection by number (close_range of it): its client reads EOF, and the
    number then serves a socket pair, not the old connection. Slipstream's descriptors
    are among those found; each close of one answers EBADF (as for a number that is not
    open) and closes nothing, epoll_ctl, fstat and fcntl of one answer EBADF, dup2 onto
    one EBUSY (it cannot be moved out of the way), the files get the
    program's numbers and keep their content, and the stream arrives whole over shm.
    (Before, the close went through: the sender's sendall failed with ENOTSOCK and the
    receiver read EOF after 0 bytes.)"""
    common = ("--port", t.port, "--how", how, "--seed", 7)
    server = t.serve("server", py("fd_cleanup.py", "server", *common), slip=True)
    client = t.start("client", py("fd_cleanup.py", "client", *common), slip=True)
    client.expect_exit(0)
    server.expect_exit(0)
    for proc in (server, client):
        said = proc.json_output()
        t.check(said["exact"], f"{proc.name}: the stream or its files came back different")
        survivors = said["survivors"]
        if not proc.slip:
            t.check(not survivors, f"{proc.name}: plain, yet descriptors survived: {survivors}")
            continue
        t.check(survivors, f"{proc.name}: no descriptor of Slipstream's was found in "
                           f"/proc/self/fd, or none survived (found {said['found']})")
        if how == "walk":
            wrong = {fd: said["closed"][str(fd)] for fd in survivors
                     if said["closed"][str(fd)] != errno.EBADF}
            t.check(not wrong, f"{proc.name}: closes of Slipstream's descriptors that did not "
                               f"answer EBADF (fd: errno): {wrong}")
        for call, wanted in (("epoll", errno.EBADF), ("fstat", errno.EBADF),
                             ("fcntl", errno.EBADF), ("dup2", errno.EBUSY)):
            t.check(said[call] == wanted,
                    f"{proc.name}: {call} of a descriptor of Slipstream's gave errno "
                    f"{said[call]}, expected {errno.errorcode[wanted]}")
    t.expect_stats(client, ACCEL, "", count=2)
    t.expect_stats(server, ACCEL, "", count=2)


@case("splice", variants=("both",))
def splice(t, _):
    """splice(2) from a pipe into the socket and from the socket into a pipe, 8 MiB each
    way in random lengths (progs/splice_pair.py), SHA-256 compared end to end, over shm.
    (The kernel would move the bytes into or out of the proxy, past the ring: the peer never
    got them, and the client waited for its answer until it was killed.)"""
    server, client = exchange(t, "splice_pair.py", "--seed", 11)
    s, c = server.json_output(), client.json_output()
    t.expect_stats(client, ACCEL, "", traffic=(c["sent"], c["received"]))
    t.expect_stats(server, ACCEL, "", traffic=(s["sent"], s["received"]))


@case("stdio", variants=("both",))
def stdio(t, _):
    """stdio on the socket (progs/stdio_pair.c): the client writes 3000 seeded lines of up
    to 3000 bytes with fputs and fprintf on a FILE from fdopen (from a thread), the server
    reads them with
    getline and sends each back reversed (fputs, fprintf, dprintf), the client checks every
    byte; fileno() of each FILE names its socket. Over shm. (glibc's stdio reads and writes
    past the interposed calls: the FILE read the proxy's wake-up bytes and wrote into the
    proxy, where no byte reached the peer.)"""
    path = t.settings.build_dir / "tests" / "integration" / "slip_it_stdio_pair"
    t.check(path.is_file(), f"stdio_pair binary not found ({path}): build it")
    server = t.serve("server", [path, "server", t.port, 5], slip=True)
    client = t.start("client", [path, "client", LOOPBACK, t.port, 5], slip=True)
    client.expect_exit(0)
    server.expect_exit(0)
    for proc in (server, client):
        said = proc.json_output()
        t.check(said["exact"] and said["lines"] == 3000,
                f"{proc.name}: {said['lines']} lines, exact {said['exact']}")
        t.check(said["fileno"], f"{proc.name}: fileno() of a FILE is not its socket")
    t.expect_stats(client, ACCEL, "")
    t.expect_stats(server, ACCEL, "")


@case("zerocopy", variants=("after_connect", "before_connect", "listener_after",
                            "listener_before", "ulp_after_connect"))
def zerocopy(t, where):
    """MSG_ZEROCOPY (progs/zerocopy_pair.py): one end sends with MSG_ZEROCOPY and waits
    for a completion of every call on the socket's error queue (POLLERR), while the other
    streams the other way; both streams seeded random, SHA-256 compared. SO_ZEROCOPY is
    set by the client after or before connect, or by the server on its listener after or
    before listen: the connection, which has moved bytes over shm, goes back to TCP at its
    first MSG_ZEROCOPY send, the peer following it (reason failover). (SO_ZEROCOPY alone
    leaves it accelerated: gRPC sets it on every socket.) ulp_after_connect: the client sets TCP_ULP "tls" instead
    (kernel TLS; this kernel may have no tls module, and the call then fails with ENOENT):
    it goes back to TCP the same way. The end that set it says kernel_feature. (Before, the
    option
    went to the hidden TCP socket, the bytes over the ring, and no completion ever came:
    the sender waited until its 20 s ran out.)"""
    seed = 1 + "abcdefghijklmnopqrstuvwxyz".index(where[0])
    server, client = exchange(t, "zerocopy_pair.py", "--mode", where, "--seed", seed)
    setter, peer = (client, server) if where.endswith("_connect") else (server, client)
    said = setter.json_output()
    if not where.startswith("ulp"):
        t.check(said["zerocopy_on"] and said["zerocopy_sends"] > 0 and
                said["completed"] == said["zerocopy_sends"],
                f"{setter.name}: {said['completed']} completions for {said['zerocopy_sends']} "
                f"MSG_ZEROCOPY sends (SO_ZEROCOPY {said['zerocopy_on']})")
    t.expect_stats(setter, "tcp", "kernel_feature")
    t.expect_stats(peer, "tcp", "failover")
