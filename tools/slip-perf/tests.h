// The data links of each test, both sides. Links are open (and, except for crr, have sent
// their Join) before these run. A client worker runs on its own thread; its three phases
// are separated by the test's Gate, so all links measure over one interval.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tools/slip-perf/budget.h"
#include "tools/slip-perf/endpoints.h"
#include "tools/slip-perf/protocol.h"
#include "tools/slip-perf/summary.h"

namespace slipperf {

// What one client worker did.
struct Tally {
  uint64_t warmup_iters = 0;
  uint64_t iters = 0;   // measured round trips, writes or transactions
  uint64_t bytes = 0;   // measured payload bytes, one direction
  uint64_t end_ns = 0;  // when its measured phase ended
  Histogram ns;         // the time of each measured round trip or transaction
};

class ClientWorker {
 public:
  virtual ~ClientWorker() = default;
  virtual void Warmup(const Budget& budget) = 0;
  // Measures from `start_ns`, the same for every worker of the test.
  virtual void Measure(const Budget& budget, uint64_t start_ns) = 0;
  // Ends the link cleanly (shutdown, the server's close).
  virtual void Finish() = 0;
  // From another thread: makes the worker's blocked or next call fail.
  virtual void Abort() noexcept = 0;

  const Tally& tally() const { return tally_; }

 protected:
  Tally tally_;
};

// lat, rr: `size`-byte requests echoed back, each checked.
std::unique_ptr<ClientWorker> MakeEchoWorker(std::unique_ptr<Link> link, const TestRequest& r,
                                             uint32_t index);
// bw: a stream of `size`-byte writes, checked by the server.
std::unique_ptr<ClientWorker> MakeStreamWorker(std::unique_ptr<Link> link, const TestRequest& r,
                                               uint32_t index);
// crr: connect, one echo, close, over and over.
std::unique_ptr<ClientWorker> MakeConnectWorker(Connector& connector, const TestRequest& r,
                                                uint32_t index);

// Server sides. Each returns what it served (messages, bytes, transactions) and throws when
// the test failed.
uint64_t ServeEchoes(Link& link, uint32_t size);
uint64_t ServeStream(Link& link, const TestRequest& r, uint32_t index);
// One crr transaction; `buffer` holds a request.
void ServeTransaction(Link& link, std::vector<uint8_t>& buffer);

}  // namespace slipperf
