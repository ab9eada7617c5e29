// The data phase of each test, both sides. The connection is set up and the header and
// ack exchanged before these run; they leave the connection to be closed by the caller.
#pragma once

#include <string>

#include "tools/slip-perf/protocol.h"
#include "tools/slip-perf/report.h"

namespace slipperf {

// Client side: warms up, measures, checks the content, and waits for the server's close.
Result RunLatencyClient(int fd, const TestHeader& h);
Result RunBandwidthClient(int fd, const TestHeader& h);

// Server side: serves until the client shuts down its side. Returns a line for the log;
// throws when the test failed.
std::string ServeLatency(int fd, const TestHeader& h);
std::string ServeBandwidth(int fd, const TestHeader& h);

}  // namespace slipperf
