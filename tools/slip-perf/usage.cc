#include "tools/slip-perf/cli.h"

namespace slipperf {

void PrintUsage(FILE* out) {
  std::fputs(R"(usage:
  slip-perf server [-p PORT] [--bind ADDR] [--once | --count N] [--reuseport]
  slip-perf client HOST [-p PORT] TEST... [SWEEP] [--format F] [--label NAME]
  slip-perf native TEST... [SWEEP] [--cpus S,C] [--format F] [--label NAME]
  slip-perf compare [--tests LIST] [SWEEP] [--transports LIST] [--out DIR] [--cpus S,C]
                    [--remote HOST [-p PORT]]
  slip-perf memcpy [--size N] [--duration SEC | --iters N] [--format F] [--label NAME]
  slip-perf --help

Measures what an unmodified program gets from the ordinary blocking socket API, so it
runs the same plain or under build/bin/slip-run, and the transports underneath natively.

server   serves client sessions one at a time (default port 5301, any address; 0 picks a
         free port, printed on stderr); --once exits after one session, --count N after
         N; SIGINT/SIGTERM stop it cleanly. --reuseport: the listener has SO_REUSEPORT, as
         gRPC's servers do by default.
client   one control connection to a slip-perf server, and per test its data connections:
           tcp_lat  ping-pong of N-byte messages (default 64), TCP_NODELAY: one-way
                    latency = round trip / 2, in microseconds: mean, p50, p99, p99.9
           tcp_bw   --streams N streams of N-byte writes (default 64K): Gbit/s in all; the
                    server checks the count and the content (--verify sampled: the ends of
                    each read and one cache line in four, about a tenth of a copy; full:
                    every byte, about one copy)
           tcp_rr   --conns N connections, each a request/response loop of N-byte messages
                    (default 64): transactions/s and the time of a transaction
           tcp_crr  --conns N threads, each connecting, sending one request, reading the
                    response and closing, over and over: connections/s (setup cost)
native   the same tests straight on a transport, between this process and a child, with
         no sockets and no preload: shm_lat, shm_bw, shm_rr (shared-memory rings, as the
         shim builds them; SLIP_RING_SIZE and SLIP_SPIN_US apply).
compare  runs a sweep plain (tcp), with both ends under slip-run (shm) and natively
         (shm-native), prints a side-by-side table, and writes DIR/compare.csv,
         DIR/compare.json and DIR/compare.svg (latency and bandwidth against message
         size) and the raw outputs under DIR/raw/. Checks in slip-run's stats that every
         connection used shm. Defaults: --tests lat,bw --sizes 1:4M --duration 0.5
         --repeat 3 --out . --transports tcp,shm,shm-native. --remote HOST runs the client
         against a slip-perf server already running there (under slip-run there for an
         accelerated column), plain and under slip-run, without native tests.
         --cpus S,C runs the server side on CPU S and the client side on CPU C (default:
         wherever the scheduler puts them, as for any program).
memcpy   copies an N-byte buffer (default 1M) repeatedly: memory bandwidth in GB/s, the
         physical limit of a shared-memory ring of that size.

SWEEP:
  --size N         one message size; K, M, G suffixes are powers of 1024
  --sizes LIST     sizes and ranges, e.g. 64,64K or 1:4M (powers of 2) or 16:1M:4
  --duration SEC   measured time per run (default 3, compare 0.5); a warm-up of a
                   tenth of it (at most 1 s) runs first
  --iters N        measure N iterations per link instead (warm-up N/10)
  --repeat N       runs per point (default 1, compare 3); reports the median run and the
                   min/median/max of its main figure (lat: p50; bw: Gbit/s; rr, crr:
                   transactions/s)
  --streams N      tcp_bw: parallel streams (default 1)
  --conns N        tcp_rr, tcp_crr: connections or connecting threads (default 1)
  --verify MODE    sampled (default) or full
Output:
  --format F       table (default), csv (header row) or json (one object)
  --label NAME     fills the label and transport columns (e.g. tcp, shm)
Every result also reports the CPU use of each side over the measured interval, in % of
one core (user + system time of the whole process).
)",
             out);
}

}  // namespace slipperf
