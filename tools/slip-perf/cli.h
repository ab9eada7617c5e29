// Command line of slip-perf: subcommands, their options, usage.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <variant>
#include <vector>

#include "tools/slip-perf/args.h"
#include "tools/slip-perf/budget.h"
#include "tools/slip-perf/protocol.h"
#include "tools/slip-perf/report.h"
#include "tools/slip-perf/sweep.h"

namespace slipperf {

constexpr double kDefaultDurationS = 3.0;
constexpr double kDefaultCompareDurationS = 0.5;
constexpr uint32_t kDefaultCompareRepeat = 3;
constexpr uint64_t kDefaultMemcpySize = 1 << 20;

struct HelpCommand {};

struct ServerOptions {
  std::string bind;  // "" = any address
  uint16_t port = kDefaultPort;
  uint64_t max_sessions = 0;  // 0 = serve until interrupted
  bool reuseport = false;     // SO_REUSEPORT on the listener (as gRPC's default)
};

struct OutputOptions {
  Format format = Format::kTable;
  ReportMeta meta{"-", "-"};
};

struct ClientOptions {
  std::string host;
  uint16_t port = kDefaultPort;
  SweepOptions sweep;
  OutputOptions output;
};

// Where the two sides run: -1 = wherever the scheduler puts them.
struct CpuPair {
  int server = -1;
  int client = -1;
};

// The native tests: the same sweep straight on a transport (shm), between this process and
// a child it forks.
struct NativeOptions {
  SweepOptions sweep;
  OutputOptions output;
  CpuPair cpus;
};

struct MemcpyOptions {
  uint64_t size = kDefaultMemcpySize;
  Budget budget;
  OutputOptions output;
};

// What `compare` runs: "tcp" (plain), "shm" (under slip-run, named after the transport its
// connections used) and "shm-native".
struct CompareOptions {
  SweepOptions sweep;
  std::vector<std::string> transports;
  std::string out_dir = ".";
  std::string remote;  // "" = a server on this host, started by compare
  uint16_t port = kDefaultPort;
  CpuPair cpus;
};

using Command = std::variant<HelpCommand, ServerOptions, ClientOptions, NativeOptions,
                             MemcpyOptions, CompareOptions>;

// argv[0] is the program name. Throws UsageError.
Command ParseCommandLine(int argc, char** argv);

// The options that make a child slip-perf run the same sweep (compare passes them on).
std::vector<std::string> SweepArguments(const SweepOptions& sweep);

void PrintUsage(FILE* out);

}  // namespace slipperf
