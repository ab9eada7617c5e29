// slip-perf client: one control connection to the server for the whole sweep.
#include <cstdio>
#include <exception>

#include "tools/slip-perf/commands.h"
#include "tools/slip-perf/net.h"

namespace slipperf {

int RunClient(const ClientOptions& options) {
  SocketConnector connector(options.host, options.port);
  std::unique_ptr<Link> control = connector.Open();
  control->SetNoDelay();
  std::vector<Result> results;
  try {
    results = RunSweep(*control, connector, options.sweep, "tcp");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "slip-perf client: %s\n", e.what());
    return 1;
  }
  WriteReport(stdout, options.output.format, options.output.meta, results);
  return 0;
}

}  // namespace slipperf
