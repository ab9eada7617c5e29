// slip-perf: latency, bandwidth and connection rates of TCP connections as an unmodified
// program sees them, plain or under the Slipstream preload; the same tests natively on the
// transports underneath; a side-by-side comparison of all three; and memcpy bandwidth as
// the physical limit.
#include <signal.h>

#include <cstdio>
#include <exception>
#include <variant>

#include "tools/slip-perf/cli.h"
#include "tools/slip-perf/commands.h"

namespace {

struct Dispatch {
  int operator()(const slipperf::HelpCommand&) const {
    slipperf::PrintUsage(stdout);
    return 0;
  }
  int operator()(const slipperf::ServerOptions& o) const { return slipperf::RunServer(o); }
  int operator()(const slipperf::ClientOptions& o) const { return slipperf::RunClient(o); }
  int operator()(const slipperf::NativeOptions& o) const { return slipperf::RunNative(o); }
  int operator()(const slipperf::CompareOptions& o) const { return slipperf::RunCompare(o); }
  int operator()(const slipperf::MemcpyOptions& o) const { return slipperf::RunMemcpy(o); }
};

}  // namespace

int main(int argc, char** argv) {
  slipperf::Command command;
  try {
    command = slipperf::ParseCommandLine(argc, argv);
  } catch (const slipperf::UsageError& e) {
    std::fprintf(stderr, "slip-perf: %s\n\n", e.what());
    slipperf::PrintUsage(stderr);
    return 2;
  }
  // A peer that goes away shows as EPIPE from send, not as a signal.
  signal(SIGPIPE, SIG_IGN);
  try {
    return std::visit(Dispatch{}, command);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "slip-perf: %s\n", e.what());
    return 1;
  }
}
