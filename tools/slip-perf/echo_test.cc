// lat and rr: ping-pong of `size`-byte messages on each link. The server reads a whole
// message before it echoes it (so large messages cannot deadlock with both sides blocked
// in send); the client times each round trip and checks the echo.
#include "tools/slip-perf/echo.h"

#include <vector>

#include "tools/slip-perf/tests.h"

namespace slipperf {
namespace {

class EchoWorker final : public TimedWorker {
 public:
  EchoWorker(std::unique_ptr<Link> link, const TestRequest& r, uint32_t index)
      : TimedWorker(r.size), link_(std::move(link)), echo_(r.seed + index, r.size) {
    link_->SetNoDelay();
  }

  void Finish() override {
    link_->ShutdownWrite();
    ExpectEof(*link_);
  }

  void Abort() noexcept override { link_->Abort(); }

 private:
  uint64_t Once() override { return echo_.Exchange(*link_); }

  std::unique_ptr<Link> link_;
  Echo echo_;
};

}  // namespace

std::unique_ptr<ClientWorker> MakeEchoWorker(std::unique_ptr<Link> link, const TestRequest& r,
                                             uint32_t index) {
  return std::make_unique<EchoWorker>(std::move(link), r, index);
}

uint64_t ServeEchoes(Link& link, uint32_t size) {
  link.SetNoDelay();
  std::vector<uint8_t> buf(size);
  uint64_t messages = 0;
  while (RecvAll(link, buf.data(), buf.size())) {
    SendAll(link, buf.data(), buf.size());
    ++messages;
  }
  return messages;
}

}  // namespace slipperf
