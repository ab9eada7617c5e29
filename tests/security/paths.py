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
import json
import os
import random
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from cases import (MiB, NOBODY, case, check_bulk_pair, check_client_results, connections,
                   describe_connections, finish, integ, json_lines, last_json, launch,
                   random_total, sec, squatter_got_nothing, status_text, stop)
from harness import PYTHON, is_listening
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


# ------------------------------------------------------------------ files the environment names

# Each variant: where the attacker's file is ("theirs": nobody's own directory, where no
# protected_* sysctl applies; "world": root's sticky directory, as /tmp) and what it is.
ENV_FILE_VARIANTS = {
    "log_link": ("theirs", "link"),
    "log_link_sticky": ("world", "link"),
    "log_fifo": ("world", "fifo"),
    "log_fifo_reader": ("theirs", "fifo"),
    "stats_link": ("theirs", "link"),
    "stats_fifo": ("world", "fifo"),
    "summary_zero": ("theirs", "zero"),
}
# The address space slip-run --summary may use (its own summary and the command's
# reading): what it read from a file of /dev/zero used to grow without bound. None in a
# sanitizer run (SLIP_TEST_SANITIZER_RUNTIME): the sanitizer's shadow memory alone is
# terabytes of address space; the test's own time limit bounds such a read there.
SUMMARY_AS_LIMIT = None if os.environ.get("SLIP_TEST_SANITIZER_RUNTIME") else 512 * MiB
FIFO_READER = """
import json, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK)
got = []
def finish(*_):
    print(json.dumps({"bytes": sum(map(len, got)), "head": b"".join(got)[:200].decode("latin-1")}), flush=True)
    sys.exit(0)
signal.signal(signal.SIGTERM, finish)
print("READY", flush=True)
while True:
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        data = None
    if data:
        got.append(data)
    else:
        signal.sigtimedwait([signal.SIGTERM], 0.01) and finish()
"""


@case("env_files", tuple(ENV_FILE_VARIANTS))
def env_files(t, variant):
    """The files SLIP_LOG_FILE and SLIP_STATS_FILE name (slip-run --log-file, --stats) are
    where another user put something of its own: a symbolic link to a root-only file of
    root's (log_link, stats_link: in nobody's own directory; log_link_sticky: in root's
    sticky directory), a FIFO with nobody reading (log_fifo, stats_fifo: in root's sticky
    directory; the old shim hung before main, or at exit), a FIFO nobody reads every line
    from (log_fifo_reader), a link to /dev/zero as slip-run --summary's stats file
    (summary_zero, slip-run under a 512 MiB address-space limit: the old slip-run read
    until it died of std::bad_alloc). Root programs under slip-run (a bulk pair over shm)
    must run and end as without Slipstream's files, byte-exact, write nothing through the
    link (the root file keeps its bytes; nothing is created where the link points), hand
    nobody a line, and say why they do not use the file."""
    with short_world_dir() as world:
        attack_env_file(t, variant, world)


def attack_env_file(t, variant, world):
    place, kind = ENV_FILE_VARIANTS[variant]
    where = nobodys_dir(world, "theirs") if place == "theirs" else world
    target = where / ("slip.log" if variant.startswith("log") else "stats.jsonl")
    secret = t.dir / "secret"
    content = random.Random().randbytes(2048)
    secret.write_bytes(content)
    os.chmod(secret, 0o600)
    reader = None
    if kind == "link":
        as_nobody("ln", "-s", secret, target)
    elif kind == "zero":
        as_nobody("ln", "-s", "/dev/zero", target)
    else:
        as_nobody("mkfifo", "-m", "0666", target)
        if variant == "log_fifo_reader":
            reader = launch(t, "reader", [PYTHON, "-c", FIFO_READER, target], prefix=NOBODY)
            reader.wait_output("READY")
    env = {"SLIP_TRANSPORTS": "shm,tcp", "SLIP_LOG": "debug"}
    slip_args = []
    if variant.startswith("log"):
        env["SLIP_LOG_FILE"] = str(target)
    else:
        slip_args = [f"--stats={target}"] + (["--summary"] if variant == "summary_zero" else [])
    prefix = (["prlimit", f"--as={SUMMARY_AS_LIMIT}", "--"]
              if variant == "summary_zero" and SUMMARY_AS_LIMIT else [])
    rng = random.Random()
    seeds = (rng.randrange(1 << 30), rng.randrange(1 << 30))
    total = random_total(rng, 256 << 10, MiB)
    runner = [str(t.settings.slip_run), *slip_args, "--"]
    server = t.start("server", [*prefix, *runner, *integ("bulk.py", "server", "--port", t.port,
                                                          "--seed", seeds[0], "--total", total)],
                     role="server", env=env)
    wait_listening_here(server, t.port)
    client = t.start("client", [*prefix, *runner, *integ("bulk.py", "client", "--port", t.port,
                                                          "--seed", seeds[1], "--total", total)],
                     env=env)
    statuses = {p: finish(p, 20) for p in (client, server)}
    check_bulk_pair(t, statuses, server, client)
    t.check(secret.read_bytes() == content and stat.S_IMODE(secret.stat().st_mode) == 0o600,
            f"root's file {secret} changed ({secret.stat().st_size} B, mode "
            f"{stat.S_IMODE(secret.stat().st_mode):04o}): written through nobody's link")
    if reader:
        stop(reader)
        got = last_json(reader)
        t.check(got["bytes"] == 0, f"nobody read {got['bytes']} B of root's log from its FIFO: "
                                   f"{got['head']!r}")
    said = server.stderr() + client.stderr()
    expected = {"log": "SLIP_LOG_FILE", "stats": "SLIP_STATS_FILE", "summary": "summary"}[
        variant.split("_")[0]]
    t.check(expected in said and ("not" in said or "cannot" in said),
            f"neither program said why it does not use {target} (no line naming {expected})")


def wait_listening_here(proc, port, timeout=10):
    """The listener on `port` in this namespace, the program failing the test if it never
    comes (a program that hangs before main never listens)."""
    proc.wait_until(lambda: is_listening(port), f"a listener on port {port}", timeout=timeout)


# ------------------------------------------------------------------ the stats files in /dev/shm

STATS_NAME = "/dev/shm/slipstream-stats.{}"


def slip_stat_connections(t, pid):
    """What root's `slip-stat -j -p PID` lists for `pid`, and its notes (stderr)."""
    out = subprocess.run([str(t.settings.build_dir / "bin" / "slip-stat"), "-j", "-a", "-p",
                          str(pid)], capture_output=True, text=True, timeout=20)
    t.check(out.returncode == 0, f"slip-stat: exit status {out.returncode}: {out.stderr}")
    conns = []
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            conns += [c for c in json.loads(line)["connections"] if c["pid"] == pid]
    return conns, out.stderr


@case("stats_shm", ("forged", "denied"))
def stats_shm(t, variant):
    """The stats file of a root server under slip-run, in /dev/shm (sticky, writable by
    all), is another user's before the server makes it: forged: nobody's copy of its own
    stats file (three shm connections of its own) with the pid made the server's; denied:
    a directory of nobody's at that name, which nobody but its owner can remove. Root's
    slip-stat must never show nobody's connections as the server's, and the server's own
    stats must work: a legitimate client's echo (exact) is listed by slip-stat and in the
    server's exit record. (The old slip-stat listed the forged connections; the old shim
    switched its stats off when it could not take the name.)"""
    server = launch(t, "server", sec("servers.py", "--impl", "threaded", "--port", t.port),
                    slip=True, role="server")
    wait_listening_here(server, t.port)
    pid = server.popen.pid
    # (slip-run execs the program: the server's pid is slip-run's.)
    name = STATS_NAME.format(pid)
    try:
        if variant == "forged":
            forger = launch(t, "forger", sec("stats_forger.py", "--victim", pid), slip=True,
                            prefix=NOBODY)
            forger.wait_until(lambda: bool(json_lines(forger)), "the forged file")
            listed, notes = slip_stat_connections(t, pid)
            print(f"before any connection, slip-stat lists {len(listed)} for pid {pid}: {notes}")
            t.check(not listed, f"root's slip-stat lists {len(listed)} connection(s) of "
                                f"nobody's forged {name} as the server's: {listed[:3]}")
        else:
            as_nobody("mkdir", "-m", "0755", name)
        client = launch(t, "client", sec("client.py", "--port", t.port, "--connections", 1,
                                         "--connect-first", "--seed",
                                         random.randrange(1 << 30)), slip=True)
        client.wait_output("CONNECTED")
        listed, notes = slip_stat_connections(t, pid)
        client_status = finish(client, 20)
        check_client_results(t, client, 1, client_status)
        stop(server)
        record = connections(t, server, t.port, "local")
        print(f"slip-stat listed {[(c['transport'], c['state']) for c in listed]}; the exit "
              f"record {describe_connections(record)}; notes: {notes.strip()}")
        t.check(len(listed) == 1 and listed[0]["transport"] == "shm",
                f"slip-stat lists {len(listed)} connection(s) for the server, expected its one "
                f"shm connection: {listed[:3]}")
        t.check(len(record) == 1 and record[0]["transport"] == "shm",
                f"the server's exit record lists {describe_connections(record)}, expected "
                "its one shm connection (its stats were switched off)")
    finally:
        subprocess.run(["rm", "-rf", name], check=False)
