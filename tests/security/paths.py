"""Attacks through paths another user controls: the rendezvous directory of pods
(SLIP_RENDEZVOUS_DIR), the files the environment names (SLIP_LOG_FILE, SLIP_STATS_FILE,
slip-run --stats and --summary) and the stats files in /dev/shm. The attacker is uid
nobody; the victims are root programs under slip-run. None of the attacks relies on the
kernel's fs.protected_* sysctls being off: the links, FIFOs and hard links are made where
those sysctls do not apply (a directory of the attacker's own, or one writable by all
without the sticky bit), or the defence is checked as such. docs/SECURITY.md, "Files and
directories"; tests/security/README.md has each case's outcome before the fix.
"""

import contextlib
import os
import random
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from cases import (MiB, NOBODY, case, check_bulk_pair, connections, describe_connections,
                   finish, integ, last_json, launch, random_total, sec, squatter_got_nothing,
                   status_text)
from harness import is_listening
from netns import SERVER_ADDRESS, two_pods

# How long the server of rendezvous_publish listens again and again while nobody swaps
# links in: the old shim lost the race within a second.
PUBLISH_RACE_S = 3.0


def as_nobody(*argv):
    subprocess.run([*NOBODY, *map(str, argv)], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def short_world_dir():
    """A directory like /tmp (root's, mode 1777), with a short path: the shim before this
    suite's fix took SLIP_RENDEZVOUS_DIR only up to 48 characters, and the attacks are
    meant to be played against it too. Removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="slip-sec-", dir="/tmp"))
    try:
        os.chmod(path, 0o1777)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def nobodys_dir(parent, name):
    """A directory of nobody's own (mode 0755) in `parent`, which nobody may write."""
    path = parent / name
    as_nobody("mkdir", "-m", "0755", path)
    return path


def wait_listening_in(proc, port, timeout=15):
    proc.wait_until(lambda: is_listening(port, proc.popen.pid), f"a listener on port {port}",
                    timeout=timeout)


# ------------------------------------------------------------------- the rendezvous directory

@case("rendezvous_dir", ("owned", "link"))
def rendezvous_dir(t, variant):
    """nobody provides the directory SLIP_RENDEZVOUS_DIR names (owned: its own directory;
    link: a symbolic link, in root's sticky directory, to its own directory) and binds
    there the name of the root server's address and port ("slip3-<address>-<port>")
    before the server listens. A root client in another network namespace, connecting to
    that address, must not register with it (no message, no descriptor: its region, its
    proxies and its TCP socket), and both streams must be exact. Its stats say
    untrusted_rendezvous: the directory is not trusted (owned by another user), so the
    client does not even connect to the name."""
    with short_world_dir() as world:
        attack_rendezvous_dir(t, variant, world)


def attack_rendezvous_dir(t, variant, world):
    theirs = nobodys_dir(world, "theirs")
    directory = theirs
    if variant == "link":
        directory = world / "rdv"
        as_nobody("ln", "-s", theirs, directory)
    name = f"slip3-{SERVER_ADDRESS}-{t.port}"
    squatter = launch(t, "squatter", sec("squatter.py", "--path", theirs / name), prefix=NOBODY)
    squatter.wait_output("READY")
    rng = random.Random()
    seeds = (rng.randrange(1 << 30), rng.randrange(1 << 30))
    total = random_total(rng, MiB, 3 * MiB)
    print(f"seeds {seeds}, {total} B each way; SLIP_RENDEZVOUS_DIR={directory}")
    env = {"SLIP_TRANSPORTS": "shm,tcp", "SLIP_RENDEZVOUS_DIR": str(directory)}
    with two_pods() as (server_ns, client_ns):
        server = launch(t, "server", integ("bulk.py", "server", "--port", t.port, "--bind",
                                           "0.0.0.0", "--seed", seeds[0], "--total", total),
                        slip=True, role="server", env=env, netns=server_ns)
        wait_listening_in(server, t.port)
        client = launch(t, "client", integ("bulk.py", "client", "--port", t.port, "--host",
                                           SERVER_ADDRESS, "--seed", seeds[1], "--total",
                                           total), slip=True, env=env, netns=client_ns)
        statuses = {p: finish(p, 30) for p in (client, server)}
    said = squatter_got_nothing(t, squatter)
    check_bulk_pair(t, statuses, server, client)
    conns = connections(t, client, t.port, "remote")
    print(f"client: {describe_connections(conns)}; squatter saw {said['connections']} "
          f"connection(s): {said['peers']}")
    t.check([(c["transport"], c["reason"]) for c in conns] == [("tcp", "untrusted_rendezvous")],
            f"client stats: {describe_connections(conns)}, expected one tcp/untrusted_rendezvous")


@case("rendezvous_publish", ("owned", "open"), serial=True)
def rendezvous_publish(t, variant):
    """A root server publishes its rendezvous in SLIP_RENDEZVOUS_DIR, a directory nobody
    can write (owned: nobody's own; open: root's, mode 0777 without the sticky bit),
    listening again and again for 3 s; meanwhile nobody renames a symbolic link to a
    root-only file (mode 0600) over the name, again and again. Publishing must never
    follow a link: the file keeps its mode and its bytes (the old shim bound the socket,
    then chmod()ed the name to 0666 by path, and made the file world-writable within a
    second). The directory is not trusted, so nothing is published in it at all."""
    with short_world_dir() as world:
        if variant == "owned":
            directory = nobodys_dir(world, "theirs")
        else:
            directory = world / "open"
            directory.mkdir()
            os.chmod(directory, 0o777)
        race_publishing(t, directory)


def race_publishing(t, directory):
    secret = t.dir / "secret"
    content = random.Random().randbytes(4096)
    secret.write_bytes(content)
    os.chmod(secret, 0o600)
    name = f"slip3-{SERVER_ADDRESS}-{t.port}"
    with two_pods() as (server_ns, _):
        swapper = launch(t, "swapper", sec("link_swapper.py", directory, name, secret,
                                           PUBLISH_RACE_S + 1), prefix=NOBODY)
        swapper.wait_output("READY")
        server = launch(t, "server", sec("relisten.py", "--host", SERVER_ADDRESS, "--port",
                                         t.port, "--seconds", PUBLISH_RACE_S),
                        slip=True, role="server", netns=server_ns,
                        env={"SLIP_RENDEZVOUS_DIR": str(directory), "SLIP_LOG": "info"})
        statuses = {p: finish(p, PUBLISH_RACE_S + 15) for p in (server, swapper)}
    for proc, status in statuses.items():
        t.check(status == 0, f"{proc.name}: {status_text(status)}")
    listens, swaps = last_json(server)["listens"], last_json(swapper)["swaps"]
    mode = stat.S_IMODE(secret.stat().st_mode)
    print(f"{listens} listens, {swaps} swaps; the file's mode is {mode:04o}")
    t.check(listens > 100 and swaps > 100,
            f"setup: {listens} listens and {swaps} swaps: the race was hardly run")
    t.check(mode == 0o600, f"root's 0600 file is mode {mode:04o} now: publishing the "
                           "rendezvous followed nobody's link")
    t.check(secret.read_bytes() == content, "root's file changed")
    t.check("not trusted" in server.stderr() + server.stdout(),
            "the server did not say that the directory is not trusted")
