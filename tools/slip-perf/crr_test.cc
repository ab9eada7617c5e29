// crr: each transaction connects, sends one `size`-byte request, reads its echo, waits for
// the server's close and closes: the cost of setting a connection up and tearing it down,
// which under the shim includes registering at the listener's rendezvous.
#include <atomic>
#include <stdexcept>

#include "tools/slip-perf/clock.h"
#include "tools/slip-perf/echo.h"
#include "tools/slip-perf/tests.h"

namespace slipperf {
namespace {

class ConnectWorker final : public TimedWorker {
 public:
  ConnectWorker(Connector& connector, const TestRequest& r, uint32_t index)
      : TimedWorker(r.size), connector_(connector), echo_(r.seed + index, r.size) {}

  void Finish() override {}

  // Takes effect at the next transaction: the current one ends by itself, since the
  // server is alive or its connection fails.
  void Abort() noexcept override { aborted_ = true; }

 private:
  // Returns the time the connection was closed.
  uint64_t Once() override {
    if (aborted_) throw std::runtime_error("aborted");
    std::unique_ptr<Link> link = connector_.Open();
    link->SetNoDelay();
    echo_.Exchange(*link);
    ExpectEof(*link);
    link.reset();
    return NowNs();
  }

  Connector& connector_;
  Echo echo_;
  std::atomic<bool> aborted_{false};
};

}  // namespace

std::unique_ptr<ClientWorker> MakeConnectWorker(Connector& connector, const TestRequest& r,
                                                uint32_t index) {
  return std::make_unique<ConnectWorker>(connector, r, index);
}

void ServeTransaction(Link& link, std::vector<uint8_t>& buffer) {
  link.SetNoDelay();
  if (!RecvAll(link, buffer.data(), buffer.size())) {
    throw std::runtime_error("a connection closed before its request");
  }
  SendAll(link, buffer.data(), buffer.size());
}

}  // namespace slipperf
