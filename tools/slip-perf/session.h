// One client session over a control link, both sides: the client runs a test at a time
// (RunTest), the server serves them until the client closes (ServeSession). The control
// link is a TCP connection for the socket tests and a socketpair to a forked process for
// the native ones; the data links come from the Connector and the Acceptor.
#pragma once

#include <cstdint>
#include <string>

#include "tools/slip-perf/endpoints.h"
#include "tools/slip-perf/protocol.h"
#include "tools/slip-perf/report.h"

namespace slipperf {

// Runs one test. The result is named by the caller (Result::test is left empty); its CPU
// figures are this process's and the server's over the measured interval. Throws when
// the test could not run or its content check failed.
Result RunTest(Link& control, Connector& connector, const TestRequest& request);

// Serves tests until the client closes `control`. Logs a line per test on stderr (only
// failures unless `verbose`), each starting with `who`. Returns the number of failed tests;
// throws when the session broke off.
uint64_t ServeSession(Link& control, Acceptor& acceptor, const std::string& who, bool verbose);

}  // namespace slipperf
