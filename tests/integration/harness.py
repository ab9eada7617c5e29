"""Shared machinery of Slipstream's integration tests.

A test starts real programs (a server and a client), each either under `slip-run` or
plain, checks the content they moved, then checks the exit record that every process
under Slipstream appends to its stats file (one JSON line per process, core/stats.h).

Each program gets its own stats file, so a record is found by file, not by pid: the pid
in the record is shown in failure messages but not required to match, in case `slip-run`
forks instead of exec'ing. Each program runs in its own process group, and signals go to
the group, so they reach the program whether or not `slip-run` stays in between.

Environment (each also a command-line option of run.py):
  SLIP_BUILD_DIR   the CMake build directory (holds bin/slip-run and lib/libslipstream.so)
  SLIP_TEST_PLAIN  "1": run every program without slip-run and expect no stats at all.
                   This validates the tests themselves (content checks, plumbing) without
                   the shim; the default is the real mode.
Programs never inherit SLIP_* variables from the harness: a test passes the ones it means.
"""

import argparse
import dataclasses
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGS = HERE / "progs"
PYTHON = "/usr/bin/python3"
# The address both ends use, and the transport an accelerated connection must report.
# tests/vm runs the same cases over Soft-RoCE with SLIP_TEST_HOST=10.77.0.1 and
# SLIP_TEST_TRANSPORT=verbs (and SLIP_TRANSPORTS=verbs,tcp for the programs).
LOOPBACK = os.environ.get("SLIP_TEST_HOST", "127.0.0.1")
ACCEL = os.environ.get("SLIP_TEST_TRANSPORT", "shm")

# Which side runs under Slipstream: pairing name -> (server, client).
PAIRINGS = {"both": (True, True), "server": (True, False), "client": (False, True)}

START_TIMEOUT_S = 15  # a server must be listening by then
EXIT_TIMEOUT_S = 40  # a program must have exited by then (CTest's own limit is 120 s)
OUTPUT_TAIL = 3000  # characters of each output shown on failure


class TestFailure(Exception):
    """A check failed; the message says what was expected and what was seen."""


@dataclasses.dataclass(frozen=True)
class Settings:
    build_dir: Path | None
    plain: bool
    et_client: Path | None
    semantics: Path | None = None

    @property
    def slip_run(self) -> Path:
        if self.build_dir is None:
            raise TestFailure("no build directory: pass --build-dir or set SLIP_BUILD_DIR")
        return self.build_dir / "bin" / "slip-run"


def py(script, *args):
    """The command line that runs progs/<script> with the system Python."""
    return [PYTHON, str(PROGS / script), *map(str, args)]


def _tcp_table(pid=None):
    """Yields (local port, state) for every IPv4 and IPv6 TCP socket (of the network
    namespace process `pid` is in, when given)."""
    root = f"/proc/{pid}/net" if pid else "/proc/net"
    for table in (f"{root}/tcp", f"{root}/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            yield int(fields[1].rsplit(":", 1)[1], 16), fields[3]


def is_listening(port, pid=None):
    return any(p == port and state == "0A" for p, state in _tcp_table(pid))


def pick_port():
    """A free TCP port below the ephemeral range, so that no connection of a test running in
    parallel can take it as its local port between this pick and the server's bind."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(10000, low)
        with socket.socket() as probe:
            try:
                probe.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    raise TestFailure("found no free TCP port")


def port_of(address):
    """"127.0.0.1:5201" or "[::1]:5201" -> 5201."""
    return int(address.rsplit(":", 1)[1])


def _group_running(pgid):
    """True while a live (not zombie) process of process group `pgid` exists."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def _child_env(extra):
    # No SLIP_* of the caller leaks into a test, except the test settings themselves;
    # SLIP_TEST_TRANSPORTS (tests/vm) becomes the programs' SLIP_TRANSPORTS.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLIP_") or k.startswith("SLIP_TEST_")}
    if os.environ.get("SLIP_TEST_TRANSPORTS"):
        env["SLIP_TRANSPORTS"] = os.environ["SLIP_TEST_TRANSPORTS"]
    # SLIP_TEST_FABRIC_PROVIDER (the fabric runs) becomes the programs' provider.
    if os.environ.get("SLIP_TEST_FABRIC_PROVIDER"):
        env["SLIP_FABRIC_PROVIDER"] = os.environ["SLIP_TEST_FABRIC_PROVIDER"]
    # SLIP_TEST_FABRIC_NOTES=word: the fabric runs with cursor words and 4-byte notes.
    if os.environ.get("SLIP_TEST_FABRIC_NOTES"):
        env["SLIP_FABRIC_NOTES"] = os.environ["SLIP_TEST_FABRIC_NOTES"]
    # SLIP_TEST_FABRIC_DATA=send|write: how the fabric's streams move their bytes.
    if os.environ.get("SLIP_TEST_FABRIC_DATA"):
        env["SLIP_FABRIC_DATA"] = os.environ["SLIP_TEST_FABRIC_DATA"]
    # SLIP_TEST_FABRIC_ENDPOINT=rdm|msg: the fabric's streams use those endpoints.
    if os.environ.get("SLIP_TEST_FABRIC_ENDPOINT"):
        env["SLIP_FABRIC_ENDPOINT"] = os.environ["SLIP_TEST_FABRIC_ENDPOINT"]
    if os.environ.get("SLIP_TEST_LOG"):  # debugging: the programs' SLIP_LOG(_FILE)
        env["SLIP_LOG"] = os.environ["SLIP_TEST_LOG"]
    if os.environ.get("SLIP_TEST_LOG_FILE"):
        env["SLIP_LOG_FILE"] = os.environ["SLIP_TEST_LOG_FILE"]
    # The tests check acceleration itself, often over storms of short connections, which
    # the default policy would turn plain (core/short_conns.h): every connection is
    # accelerated unless a test asks for the default (SLIP_SHORT_CONNS=adaptive).
    env["SLIP_SHORT_CONNS"] = "accelerate"
    env.update(extra or {})
    return env


def _tail(text):
    return text if len(text) <= OUTPUT_TAIL else "[...]" + text[-OUTPUT_TAIL:]


class Proc:
    """One program of a test, in its own process group, its output captured to files."""

    def __init__(self, test, name, argv, role, slip, env, netns=None):
        self.name = name
        self.role = role  # "server": local port is the test port; "client": remote port is
        self.slip = slip  # runs under slip-run
        self.stats_path = test.dir / f"{name}.stats.jsonl"
        self.out_path = test.dir / f"{name}.out"
        self.err_path = test.dir / f"{name}.err"
        self.exe = _resolve(argv[0])
        self.cmd = [str(a) for a in argv]
        if slip:
            self.cmd = [str(test.settings.slip_run), f"--stats={self.stats_path}", "--", *self.cmd]
        if netns:  # (ip netns exec execs: the pid stays the program's)
            self.cmd = ["ip", "netns", "exec", netns, *self.cmd]
        self.env_extra = dict(env or {})
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.popen = subprocess.Popen(self.cmd, stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=err, env=_child_env(env), cwd=test.dir,
                                          start_new_session=True)

    def stdout(self):
        return self.out_path.read_text(errors="replace")

    def stderr(self):
        return self.err_path.read_text(errors="replace")

    def json_output(self):
        """The last line of stdout, parsed as JSON (the progs/ report format)."""
        lines = self.stdout().strip().splitlines()
        try:
            return json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError) as e:
            raise TestFailure(f"{self.name}: no JSON report on the last line of stdout ({e})")

    def json_document(self):
        """All of stdout, parsed as one JSON document (e.g. iperf3 -J)."""
        try:
            return json.loads(self.stdout())
        except json.JSONDecodeError as e:
            raise TestFailure(f"{self.name}: stdout is not one JSON document ({e})")

    def wait(self, timeout=EXIT_TIMEOUT_S):
        """Waits for the program (and anything left in its process group) to exit."""
        deadline = time.monotonic() + timeout
        try:
            status = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TestFailure(f"{self.name} did not exit within {timeout:g} s") from None
        while _group_running(self.popen.pid):
            if time.monotonic() > deadline:
                raise TestFailure(f"{self.name} exited, but its process group is still running")
            time.sleep(0.02)
        return status

    def expect_exit(self, code=0, timeout=EXIT_TIMEOUT_S):
        rc = self.wait(timeout)
        if rc != code:
            raise TestFailure(f"{self.name} exited with status {rc}, expected {code}")

    def signal(self, sig):
        try:
            os.killpg(self.popen.pid, sig)
        except ProcessLookupError:
            pass

    def kill(self):
        """SIGKILL to the whole group, then reaps the program."""
        self.signal(signal.SIGKILL)
        self.popen.wait()

    def wait_until(self, condition, awaited, timeout=START_TIMEOUT_S):
        """Polls `condition()` until it is true; fails if the program exits first or if
        `timeout` passes. `awaited` names what is awaited, for the failure message."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.popen.poll() is not None:
                raise TestFailure(f"{self.name} exited (status {self.popen.returncode}) while "
                                  f"the test waited for {awaited}")
            if time.monotonic() > deadline:
                raise TestFailure(f"{self.name}: waited {timeout:g} s for {awaited}")
            time.sleep(0.01)

    def wait_output(self, marker):
        """Waits until a line of stdout equals `marker`."""
        self.wait_until(lambda: marker in self.stdout().splitlines(),
                        f"the line {marker!r} on its stdout")

    def stats_records(self):
        if not self.stats_path.exists():
            return []
        records = []
        for n, line in enumerate(self.stats_path.read_text().splitlines(), 1):
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise TestFailure(f"{self.name}: stats line {n} is not JSON ({e}): {line[:300]}")
        return records

    def describe(self):
        status = self.popen.poll()
        env = " ".join(f"{k}={v}" for k, v in self.env_extra.items())
        stats = self.stats_path.read_text() if self.stats_path.exists() else "(no stats file)\n"
        return (f"--- {self.name} ({self.role}, {'under slip-run' if self.slip else 'plain'}), "
                f"pid {self.popen.pid}, exit status {status}\n"
                f"command: {env + ' ' if env else ''}{' '.join(self.cmd)}\n"
                f"stdout:\n{_tail(self.stdout())}\nstderr:\n{_tail(self.stderr())}\n"
                f"stats:\n{stats}")


def _resolve(program):
    path = shutil.which(str(program))
    if path is None:
        raise TestFailure(f"{program} not found (Debian: apt-get install -y iperf3 sockperf socat)")
    return os.path.realpath(path)


class Test:
    """One run of one test case: a temp dir, a port, the programs, the checks."""

    def __init__(self, settings, name):
        self.settings = settings
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix=f"slip-it-{name}-"))
        self.port = pick_port()
        self.procs = []

    # Programs.

    def start(self, name, argv, role="client", slip=False, env=None, netns=None):
        """Starts a program, under slip-run if `slip` and not in plain mode, in network
        namespace `netns` when given."""
        proc = Proc(self, name, argv, role, slip and not self.settings.plain, env, netns)
        self.procs.append(proc)
        return proc

    def serve(self, name, argv, slip=False, env=None, netns=None):
        """Starts a server and waits until the test port is listening. The wait reads the
        kernel's socket table (the server's namespace's): a probing connection would show
        up in the stats."""
        proc = self.start(name, argv, "server", slip, env, netns)
        pid = proc.popen.pid if netns else None
        proc.wait_until(lambda: is_listening(self.port, pid), f"a listener on port {self.port}")
        return proc

    def cleanup(self):
        for proc in self.procs:
            if proc.popen.poll() is None or _group_running(proc.popen.pid):
                proc.kill()

    # Checks.

    @staticmethod
    def check(condition, message):
        if not condition:
            raise TestFailure(message)

    def expect_no_stats(self, proc):
        records = proc.stats_records()
        self.check(not records, f"{proc.name}: expected no stats line, got {len(records)}")

    def expect_stats(self, proc, transport, reason, count=1, traffic=None):
        """A program that ran under Slipstream wrote one record whose connections are exactly
        `count` connections on the test port, each with `transport` and `reason` (or one of
        the reasons, a tuple where timing decides which a correct run says), and, when
        `traffic` is given as (sent, received), whose byte counters add up to it. A program
        that did not (plain mode, or the plain side of a pairing) wrote nothing."""
        if not proc.slip:
            self.expect_no_stats(proc)
            return
        records = proc.stats_records()
        self.check(len(records) == 1, f"{proc.name}: expected exactly one stats line "
                                      f"(one process), got {len(records)}")
        record = records[0]
        self.check(os.path.realpath(record.get("exe", "")) == proc.exe,
                   f"{proc.name}: stats record exe is {record.get('exe')!r}, expected {proc.exe}")
        self.check(record.get("dropped") == 0,
                   f"{proc.name}: stats record dropped={record.get('dropped')}, expected 0")
        key = "local" if proc.role == "server" else "remote"
        connections = record.get("connections", [])
        ours = [c for c in connections if port_of(c[key]) == self.port]
        others = [c for c in connections if c not in ours]
        self.check(not others, f"{proc.name}: connections not on test port {self.port}: {others}")
        self.check(len(ours) == count, f"{proc.name}: expected {count} connection(s) with "
                                       f"{key} port {self.port}, stats list {len(ours)}")
        reasons = reason if isinstance(reason, tuple) else (reason,)
        for c in ours:
            self.check(c.get("transport") == transport and c.get("reason") in reasons,
                       f"{proc.name}: connection {c.get('local')} -> {c.get('remote')} has "
                       f"transport={c.get('transport')!r} reason={c.get('reason')!r}, expected "
                       f"transport={transport!r} reason={reason!r}")
            # A fabric connection names its libfabric provider (the one forced, "tcp" being
            # "tcp;ofi_rxm"); no other connection names one.
            wanted = os.environ.get("SLIP_TEST_FABRIC_PROVIDER", "")
            provider = c.get("provider", "")
            if transport == "fabric":
                self.check(provider.split(";")[0] == wanted if wanted else provider != "",
                           f"{proc.name}: connection {c.get('local')} has provider "
                           f"{provider!r}, expected {wanted or 'one'!r}")
            else:
                self.check(provider == "", f"{proc.name}: a {transport} connection names "
                                           f"provider {provider!r}")
        if traffic is not None:
            counted = (sum(c.get("bytes_sent", -1) for c in ours),
                       sum(c.get("bytes_received", -1) for c in ours))
            self.check(counted == tuple(traffic),
                       f"{proc.name}: stats count {counted[0]} B sent and {counted[1]} B "
                       f"received, the program moved {traffic[0]} B and {traffic[1]} B")

    def expect_pairing(self, server, client, count=1, traffic=None):
        """Both under Slipstream: every connection ACCEL ("shm") on both sides. One side only: that side
        reports "tcp"/"peer_not_slipstream" and the other writes nothing. `traffic`, when
        known, maps each program to the (sent, received) bytes it moved on the test port."""
        transport, reason = (ACCEL, "") if server.slip and client.slip else \
            ("tcp", "peer_not_slipstream")
        for proc in (server, client):
            self.expect_stats(proc, transport, reason, count, (traffic or {}).get(proc))

    def expect_same_stream(self, direction, sender, receiver):
        """Compares the {"sent","sent_sha256"} report of one program with the
        {"received","received_sha256"} report of its peer."""
        sent = (sender["sent"], sender["sent_sha256"])
        received = (receiver["received"], receiver["received_sha256"])
        self.check(sent[0] > 0, f"{direction}: nothing was sent")
        self.check(sent == received, f"{direction}: sent {sent[0]} B sha256 {sent[1]}, "
                                     f"received {received[0]} B sha256 {received[1]}")

    # Running.

    def report_failure(self, message):
        print(f"FAIL {self.name}: {message}")
        for proc in self.procs:
            print(proc.describe())
        print(f"files kept in {self.dir}")


def settings_from(build_dir, et_client, semantics=None):
    build = build_dir or os.environ.get("SLIP_BUILD_DIR")
    return Settings(build_dir=Path(build).resolve() if build else None,
                    plain=os.environ.get("SLIP_TEST_PLAIN") == "1",
                    et_client=Path(et_client).resolve() if et_client else None,
                    semantics=Path(semantics).resolve() if semantics else None)


def run_test(settings, name, body):
    """Runs `body(test)`; prints PASS or FAIL with the programs' outputs; returns the exit
    status for CTest."""
    test = Test(settings, name)
    if settings.plain:
        print("plain mode (SLIP_TEST_PLAIN=1): no slip-run, and no stats expected")
    try:
        if not settings.plain:
            test.check(settings.slip_run.is_file(), f"{settings.slip_run} not built")
        body(test)
    except TestFailure as e:
        test.report_failure(str(e))
        return 1
    except Exception:  # a bug in the test itself, or an unexpected OS error
        test.report_failure(traceback.format_exc())
        return 1
    finally:
        test.cleanup()
    print(f"PASS {name}")
    shutil.rmtree(test.dir, ignore_errors=True)
    return 0


def main(doc, cases, program_options=()):
    """The command line of a test runner: `--list`, or one CASE VARIANT from `cases` (a map
    of case name to (function, variants)). `program_options` name extra path options
    (e.g. "et-client") that are passed to settings_from as keyword arguments."""
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="list the tests and exit")
    parser.add_argument("--build-dir", help="CMake build directory (default: $SLIP_BUILD_DIR)")
    for option in program_options:
        parser.add_argument(f"--{option}", help=f"path of the built {option} program")
    parser.add_argument("case", nargs="?", choices=sorted(cases))
    parser.add_argument("variant", nargs="?")
    args = parser.parse_args()
    if args.list:
        print("\n".join(f"{c}.{v}" for c, (_, variants) in cases.items() for v in variants))
        return 0
    if args.case is None:
        parser.error("CASE and VARIANT are required")
    function, variants = cases[args.case]
    if args.variant not in variants:
        parser.error(f"VARIANT of {args.case} must be one of: {', '.join(variants)}")
    paths = {option.replace("-", "_"): getattr(args, option.replace("-", "_"))
             for option in program_options}
    settings = settings_from(args.build_dir, paths.get("et_client"), paths.get("semantics"))
    return run_test(settings, f"{args.case}.{args.variant}",
                    lambda test: function(test, args.variant))
