"""Runs one workload test: `run.py [options] CASE VARIANT`, e.g. `run.py gloo 4`.

`run.py --list` prints every test as CASE.VARIANT (CMake registers these).
Each test runs the workload twice in the same invocation: first every process plain (the
reference and the TCP timing), then with the variant's processes under slip-run. It checks
the content of both runs (against values computed locally and against each other, bit for
bit), then the transport of every connection in the stats (see check_transports), and
prints a timing table: plain TCP vs Slipstream per step/operation.
Reuses ../integration/harness.py (Test, Proc, run_test, settings; SLIP_BUILD_DIR and
SLIP_TEST_PLAIN=1 work as there: in plain mode the second run is plain too).
"""

import json
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

from harness import PYTHON, TestFailure, pick_port  # noqa: E402
from harness import main as harness_main  # noqa: E402

EXIT_TIMEOUT_S = 150  # per run of a workload (CTest's limit is SLIP_WL_TIMEOUT, 300 s)
CASES = {}


def case(name, variants):
    def register(function):
        CASES[name] = (function, tuple(variants))
        return function
    return register


def prog(script, *args):
    return [PYTHON, str(HERE / script), *map(str, args)]


def need(module):
    import subprocess
    r = subprocess.run([PYTHON, "-c", f"import {module}"], capture_output=True)
    if r.returncode:
        raise TestFailure(f"{PYTHON} cannot import {module}: see tests/workloads/README.md "
                          f"for the Debian packages ({r.stderr.decode()[-300:]})")


# ---------------------------------------------------------------------------------------
# Transport checks over many connections on ports nobody chose in advance.


def load_records(path):
    if not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def check_transports(t, groups, min_shm=0, plain_ports=(), elsewhere_ok=False):
    """`groups` maps a name to the stats records of processes that ran under slip-run
    (several records when several processes share a file). A connection whose reverse
    (remote, local) appears in any record ran between two Slipstream processes: it must be
    "shm" on both sides. One whose peer is in no record had a plain peer: it must be "tcp"
    with reason "peer_not_slipstream", and its remote port must be one of `plain_ports`
    (when given, as local or remote port) so that a connection that failed to be
    accelerated between two Slipstream processes cannot pass as plain. `elsewhere_ok`: a
    connection between two Slipstream processes may also be plain at both ends when its
    client says accepted_elsewhere (a sibling worker accepted it, DESIGN.md "Servers that
    share a port"). Returns counts."""
    tuples = {}
    for name, records in groups.items():
        for rec in records:
            t.check(rec.get("dropped") == 0, f"{name}: stats dropped={rec.get('dropped')}")
            for c in rec["connections"]:
                tuples.setdefault((c["local"], c["remote"]), []).append((name, rec["pid"], c))
    counts = {"shm": 0, "tcp": 0}
    problems = []
    for (local, remote), owners in tuples.items():
        for name, pid, c in owners:
            where = f"{name} (pid {pid}) {local} -> {remote}"
            if (remote, local) in tuples:
                ends = {(o["transport"], o["reason"]) for _, _, o in tuples[(remote, local)]}
                ends.add((c["transport"], c["reason"]))
                if elsewhere_ok and ends == {("tcp", "accepted_elsewhere"),
                                             ("tcp", "peer_not_slipstream")}:
                    pass
                elif (c["transport"], c["reason"]) != ("shm", ""):
                    problems.append(f"{where}: both ends run Slipstream, but transport="
                                    f"{c['transport']!r} reason={c['reason']!r}")
            else:
                if (c["transport"], c["reason"]) != ("tcp", "peer_not_slipstream"):
                    problems.append(f"{where}: peer not in any stats, but transport="
                                    f"{c['transport']!r} reason={c['reason']!r}")
                elif plain_ports is not None and not {int(local.rsplit(':', 1)[1]),
                                                       int(remote.rsplit(':', 1)[1])} & set(plain_ports):
                    problems.append(f"{where}: tcp/peer_not_slipstream, but the peer should be a "
                                    f"Slipstream process (expected plain peers on ports "
                                    f"{sorted(plain_ports)}); bytes {c['bytes_sent']}/"
                                    f"{c['bytes_received']}")
            counts[c["transport"]] = counts.get(c["transport"], 0) + 1
    t.check(not problems, "transport check failed:\n  " + "\n  ".join(problems))
    t.check(counts["shm"] >= min_shm, f"expected at least {min_shm} shm connection ends, "
                                      f"stats list {counts['shm']}: {counts}")
    return counts


def print_connections(groups):
    """Which transport each connection used: one line per connection end, from the stats of
    every process that ran under slip-run."""
    print("connections (each end, from the stats of the processes under slip-run):")
    for name, records in groups.items():
        for rec in records:
            for c in rec["connections"]:
                print(f"  {name:16} pid {rec['pid']:>7}  {c['local']:>21} -> {c['remote']:<21} "
                      f"{c['transport']:4} {c['reason'] or '-':20} sent {c['bytes_sent']} B, "
                      f"received {c['bytes_received']} B")


def timing_table(title, rows):
    """rows: (label, plain seconds, slip seconds)."""
    print(f"timing {title}: median per step/op, plain TCP vs Slipstream (same run)")
    print(f"  {'what':34} {'plain ms':>10} {'slip ms':>10} {'speedup':>8}")
    for label, a, b in rows:
        print(f"  {label:34} {a * 1e3:10.3f} {b * 1e3:10.3f} {a / b if b else float('nan'):7.2f}x")


# ---------------------------------------------------------------------------------------
# gRPC parameter server


GRPC_STEPS = 12


def grpc_run(t, tag, ps_slip, workers_slip, reuseport):
    port = pick_port()
    out = t.dir / f"{tag}.params.bin"
    extra = [] if reuseport else ["--no-reuseport"]
    ps = t.start(f"{tag}-ps", prog("grpc_ps.py", "ps", "--port", port, "--steps", GRPC_STEPS,
                                   "--out", out, *extra), "server", ps_slip)
    from harness import is_listening
    ps.wait_until(lambda: is_listening(port), f"a listener on port {port}")
    workers = [t.start(f"{tag}-worker{i}", prog("grpc_ps.py", "worker", "--port", port, "--id", i,
                                                "--steps", GRPC_STEPS), "client", workers_slip)
               for i in range(2)]
    for w in workers:
        w.expect_exit(0, EXIT_TIMEOUT_S)
    ps.expect_exit(0, EXIT_TIMEOUT_S)
    report = ps.json_output()
    t.check(report["steps"] == GRPC_STEPS and not report["errors"], f"{tag}: PS report {report}")
    for w in workers:
        t.check(w.json_output()["final_digest"] == report["digest"],
                f"{tag}: {w.name} saw final digest {w.json_output()['final_digest']}, PS has "
                f"{report['digest']}")
    step_s = max(w.json_output()["step_s"] for w in workers)
    return ps, workers, out, step_s, port


@case("grpc_ps", ["all", "ps", "all-noreuseport"])
def grpc_ps(t, variant):
    need("grpc")
    expected = t.dir / "expected.bin"
    e = t.start("expected", prog("grpc_ps.py", "expected", "--steps", GRPC_STEPS, "--out", expected))
    e.expect_exit(0)
    reuseport = variant != "all-noreuseport"  # gRPC's default listener: SO_REUSEPORT
    _, _, plain_out, plain_s, _ = grpc_run(t, "plain", False, False, reuseport)
    workers_slip = variant != "ps"
    ps, workers, slip_out, slip_s, port = grpc_run(t, "slip", True, workers_slip, reuseport)
    want = expected.read_bytes()
    t.check(plain_out.read_bytes() == want, "plain-TCP run: final parameters differ from the "
                                            "single-process computation")
    t.check(slip_out.read_bytes() == want, "Slipstream run: final parameters differ (bit for "
                                           "bit) from the plain-TCP run")
    if t.settings.plain:
        for p in (ps, *workers):
            t.expect_no_stats(p)
    else:
        groups = {p.name: p.stats_records() for p in (ps, *workers) if p.slip}
        t.check(len(groups[ps.name]) == 1, f"PS wrote {len(groups[ps.name])} stats lines")
        if workers_slip:
            c = check_transports(t, groups, min_shm=4, plain_ports=())
        else:  # the workers are plain
            c = check_transports(t, groups, plain_ports=(port,))
            t.check(c["shm"] == 0 and c["tcp"] >= 2, f"expected only tcp connections: {c}")
        for w in workers:
            if not w.slip:
                t.expect_no_stats(w)
        print_connections(groups)
        print(f"connections by transport: {c}")
    timing_table(f"grpc_ps.{variant}", [("step (pull+push+commit, 2 workers)", plain_s, slip_s)])


# ---------------------------------------------------------------------------------------
# PyTorch Gloo


GLOO_SIZES = "4,4096,262144,4194304,67108864"


def gloo_run(t, tag, world, slip):
    port = pick_port()
    ranks = []
    for r in range(world):
        argv = prog("torch_gloo.py", "--rank", r, "--world", world, "--port", port,
                    "--sizes", GLOO_SIZES, "--iters", 5)
        ranks.append(t.start(f"{tag}-rank{r}", argv, "server" if r == 0 else "client", slip))
        if r == 0:
            # Rank 0 hosts the TCPStore; the others connect once it listens (a connect that
            # the kernel refuses would show in the stats, see README "bugs").
            from harness import is_listening
            ranks[0].wait_until(lambda: is_listening(port), f"the TCPStore on port {port}",
                                timeout=60)
    for p in ranks:
        p.expect_exit(0, EXIT_TIMEOUT_S)
    reports = [p.json_output() for p in ranks]
    digests = {rep["ddp_digest"] for rep in reports}
    t.check(len(digests) == 1, f"{tag}: ranks disagree on DDP parameters {digests}")
    return ranks, reports


@case("gloo", ["2", "4"])
def gloo(t, variant):
    need("torch")
    world = int(variant)
    _, plain = gloo_run(t, "plain", world, False)
    ranks, slip = gloo_run(t, "slip", world, True)
    t.check(plain[0]["ddp_digest"] == slip[0]["ddp_digest"],
            "DDP parameters after training differ (bit for bit) between plain TCP and Slipstream")
    if t.settings.plain:
        for p in ranks:
            t.expect_no_stats(p)
    else:
        groups = {p.name: p.stats_records() for p in ranks}
        for name, recs in groups.items():
            t.check(len(recs) == 1, f"{name}: {len(recs)} stats lines, expected 1")
        # Store: every rank (rank 0 too) to rank 0; Gloo: a full mesh of pairs.
        c = check_transports(t, groups, min_shm=2 * (world + world * (world - 1) // 2),
                             plain_ports=())
        print_connections(groups)
        print(f"connections by transport: {c}")
    rows = [("DDP step", plain[0]["ddp_step_s"], slip[0]["ddp_step_s"])]
    for size, ops in plain[0]["ops"].items():
        for op, s in ops.items():
            rows.append((f"{op} {int(size):>9} B", s, slip[0]["ops"][size][op]))
    timing_table(f"gloo.{variant} (rank 0)", rows)


# ---------------------------------------------------------------------------------------
# Open MPI, TCP BTL


MPI_ARGS = ["--allow-run-as-root", "--oversubscribe", "--mca", "pml", "ob1", "--mca", "btl",
            "self,tcp", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]


def mpi_run(t, tag, np_, slip):
    stats = t.dir / f"{tag}.ranks.stats.jsonl"
    ranks = prog("mpi_prog.py", "--iters", 5)
    if slip:
        ranks = [str(t.settings.slip_run), f"--stats={stats}", "--", *ranks]
    if shutil.which("mpirun") is None:
        raise TestFailure("mpirun not found (apt-get install openmpi-bin python3-mpi4py)")
    p = t.start(f"{tag}-mpirun", ["mpirun", *MPI_ARGS, "-np", np_, *ranks])
    p.expect_exit(0, EXIT_TIMEOUT_S)
    return p.json_output(), load_records(stats)


@case("mpi", ["2", "4"])
def mpi(t, variant):
    need("mpi4py")
    n = int(variant)
    plain, _ = mpi_run(t, "plain", n, False)
    slip, records = mpi_run(t, "slip", n, not t.settings.plain)
    if t.settings.plain:
        t.check(not records, "stats written in plain mode")
    else:
        t.check(len(records) == n, f"{len(records)} stats lines for {n} ranks")
        # BTL connections rank<->rank: shm. OOB/PMIx connections to mpirun (plain): tcp; their
        # ports are mpirun's, unknown in advance, so any unmatched tcp end passes here only if
        # it moved control traffic, and the rank<->rank count is checked instead.
        c = check_transports(t, {"ranks": records}, min_shm=n * (n - 1), plain_ports=None)
        print_connections({"ranks": records})
        print(f"connections by transport: {c}")
    rows = []
    for kind in ("ring", "allreduce", "pingpong"):
        for size, s in plain[kind].items():
            rows.append((f"{kind} {int(size):>9} B", s, slip[kind][size]))
    timing_table(f"mpi.{variant} (rank 0)", rows)


# ---------------------------------------------------------------------------------------
# nginx, two workers


NGINX_FILES = 24
NGINX_THREADS = 4
NGINX_ROUNDS = 3


def nginx_files(t):
    """Files of random sizes (0 B to 3 MiB, seeded) for nginx to serve."""
    import random
    root = t.dir / "html"
    root.mkdir(exist_ok=True)
    rng = random.Random(16)
    for i in range(NGINX_FILES):
        size = rng.choice([0, 1, rng.randrange(2, 4096), rng.randrange(4096, 1 << 20),
                           rng.randrange(1 << 20, 3 << 20)])
        (root / f"f{i:02}.bin").write_bytes(rng.randbytes(size))
    return root


def nginx_conf(t, tag, root, port, reuseport):
    import os
    run_dir = t.dir / f"{tag}.nginx"
    run_dir.mkdir(exist_ok=True)
    temp = "\n".join(f"  {kind}_temp_path {run_dir}/{kind};"
                     for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    conf = t.dir / f"{tag}.nginx.conf"
    conf.write_text(("user root;\n" if os.geteuid() == 0 else "") + f"""daemon off;
master_process on;
worker_processes 2;
pid {run_dir}/nginx.pid;
error_log {run_dir}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  keepalive_requests 100000;
{temp}
  server {{
    listen 127.0.0.1:{port}{" reuseport" if reuseport else ""};
    root {root};
  }}
}}
""")
    return conf, run_dir


def nginx_run(t, tag, root, slip, reuseport):
    port = pick_port()
    conf, run_dir = nginx_conf(t, tag, root, port, reuseport)
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    server = t.start(f"{tag}-nginx", [nginx, "-p", str(run_dir), "-c", str(conf), "-e",
                                      str(run_dir / "error.log")], "server", slip)
    from harness import is_listening
    server.wait_until(lambda: is_listening(port), f"nginx on port {port}", timeout=60)
    client = t.start(f"{tag}-client", prog("nginx_client.py", "--port", port, "--root", root,
                                           "--threads", NGINX_THREADS, "--rounds",
                                           NGINX_ROUNDS), "client", slip)
    client.expect_exit(0, EXIT_TIMEOUT_S)
    server.signal(15)  # SIGTERM: nginx's fast shutdown, workers first
    server.expect_exit(0, 30)
    report = client.json_output()
    t.check(not report["errors"], f"{tag}: {report['errors']}")
    return server, client, report


@case("nginx", ["reuseport", "shared"])
def nginx(t, variant):
    """nginx (Debian's) with two workers serving files of random sizes to 4 threads, over
    keep-alive connections and a connection per request, every body checked. reuseport:
    `listen ... reuseport`, one listening socket per worker (an SO_REUSEPORT group): every
    connection shm at both ends. shared: one listening socket both workers accept on:
    most connections shm, the rest plain at both ends (accepted_elsewhere)."""
    if shutil.which("nginx") is None and not Path("/usr/sbin/nginx").exists():
        raise TestFailure("nginx not found (apt-get install nginx)")
    root = nginx_files(t)
    reuseport = variant == "reuseport"
    _, _, plain = nginx_run(t, "plain", root, False, reuseport)
    server, client, slip = nginx_run(t, "slip", root, not t.settings.plain, reuseport)
    t.check(plain["requests"] == slip["requests"] and plain["bytes"] == slip["bytes"],
            f"the runs differ: plain {plain}, slip {slip}")
    if t.settings.plain:
        for p in (server, client):
            t.expect_no_stats(p)
    else:
        groups = {p.name: p.stats_records() for p in (server, client)}
        # Keep-alive connections, one per thread, then one per fresh request.
        conns = NGINX_THREADS + slip["requests"] - NGINX_THREADS * NGINX_ROUNDS * NGINX_FILES
        # Both ends of each on shm with SO_REUSEPORT; with a shared listener, most of them.
        c = check_transports(t, groups, plain_ports=(), elsewhere_ok=not reuseport,
                             min_shm=2 * conns if reuseport else conns)
        print_connections(groups)
        print(f"connections by transport: {c}")
    timing_table(f"nginx.{variant} (client)",
                 [("keep-alive, 4 threads x 3 rounds", plain["keepalive_s"], slip["keepalive_s"]),
                  ("a connection per request, 200", plain["fresh_s"], slip["fresh_s"])])


# ---------------------------------------------------------------------------------------


if __name__ == "__main__":
    sys.exit(harness_main(__doc__, CASES))
