// Command line of slip-perf: subcommands, options, usage.
#pragma once

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "tools/slip-perf/budget.h"
#include "tools/slip-perf/protocol.h"
#include "tools/slip-perf/report.h"

namespace slipperf {

constexpr double kDefaultDurationS = 3.0;
constexpr uint32_t kDefaultLatSize = 64;
constexpr uint32_t kDefaultBwSize = 64 * 1024;
constexpr uint64_t kDefaultMemcpySize = 1 << 20;

// Bad command line: main prints the message and the usage on stderr and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct HelpCommand {};

struct ServerOptions {
  std::string bind;  // "" = any address
  uint16_t port = kDefaultPort;
  uint64_t max_tests = 0;  // 0 = serve until interrupted
};

struct OutputOptions {
  Format format = Format::kTable;
  ReportMeta meta{"-", "-"};
};

struct ClientOptions {
  std::string host;
  uint16_t port = kDefaultPort;
  std::vector<TestId> tests;
  uint32_t size = 0;  // 0 = the test's default
  Budget budget;
  Verify verify = Verify::kSampled;
  OutputOptions output;
};

struct MemcpyOptions {
  uint64_t size = kDefaultMemcpySize;
  Budget budget;
  OutputOptions output;
};

using Command = std::variant<HelpCommand, ServerOptions, ClientOptions, MemcpyOptions>;

// argv[0] is the program name. Throws UsageError.
Command ParseCommandLine(int argc, char** argv);

void PrintUsage(FILE* out);

}  // namespace slipperf
