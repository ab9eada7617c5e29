// slip-perf client: one connection per test, header and ack, then the test's data phase.
#include <cstdio>
#include <random>

#include "tools/slip-perf/commands.h"
#include "tools/slip-perf/net.h"
#include "tools/slip-perf/tests.h"

namespace slipperf {
namespace {

Result RunTest(const ClientOptions& options, TestId test) {
  TestHeader h;
  h.test = test;
  h.size = options.size != 0 ? options.size
                             : (test == TestId::kTcpLat ? kDefaultLatSize : kDefaultBwSize);
  h.budget = options.budget;
  h.verify = options.verify;
  h.seed = std::random_device{}();

  Fd conn = Connect(options.host, options.port);
  const auto header = EncodeHeader(h);
  SendAll(conn.get(), header.data(), header.size());
  std::array<uint8_t, kAckBytes> ack;
  if (!RecvAll(conn.get(), ack.data(), ack.size())) {
    throw std::runtime_error("server closed the connection before answering");
  }
  if (const Status status = DecodeAck(ack); status != Status::kOk) {
    throw std::runtime_error(std::string("server refused the test: ") + StatusText(status));
  }
  switch (test) {
    case TestId::kTcpLat:
      return RunLatencyClient(conn.get(), h);
    case TestId::kTcpBw:
      return RunBandwidthClient(conn.get(), h);
  }
  throw std::logic_error("unknown test");
}

}  // namespace

int RunClient(const ClientOptions& options) {
  std::vector<Result> results;
  for (const TestId test : options.tests) {
    try {
      results.push_back(RunTest(options, test));
    } catch (const std::exception& e) {
      std::fprintf(stderr, "slip-perf client: %s: %s\n", TestName(test), e.what());
      return 1;
    }
  }
  WriteReport(stdout, options.output.format, options.output.meta, results);
  return 0;
}

}  // namespace slipperf
