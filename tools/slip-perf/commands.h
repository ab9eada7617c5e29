// The subcommands. Each returns the process exit status.
#pragma once

#include "tools/slip-perf/cli.h"

namespace slipperf {

int RunServer(const ServerOptions& options);
int RunClient(const ClientOptions& options);
int RunNative(const NativeOptions& options);
int RunCompare(const CompareOptions& options);
int RunMemcpy(const MemcpyOptions& options);

}  // namespace slipperf
