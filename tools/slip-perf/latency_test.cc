// tcp_lat: ping-pong of `size`-byte messages. The server reads a whole message before it
// echoes it (so large messages cannot deadlock with both sides blocked in send); the client
// times each round trip and checks the echo.
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/slip-perf/budget.h"
#include "tools/slip-perf/clock.h"
#include "tools/slip-perf/net.h"
#include "tools/slip-perf/pattern.h"
#include "tools/slip-perf/tests.h"

namespace slipperf {

Result RunLatencyClient(int fd, const TestHeader& h) {
  SetNoDelay(fd);
  const Pattern pattern(h.seed, h.size);
  std::vector<uint8_t> echo(h.size);
  uint64_t offset = 0;
  auto round_trip = [&] {
    SendAll(fd, pattern.At(offset), h.size);
    if (!RecvAll(fd, echo.data(), h.size)) throw std::runtime_error("server closed during tcp_lat");
  };
  auto check_echo = [&] {
    if (!pattern.Matches(offset, echo.data(), h.size)) {
      throw std::runtime_error("echo differs from the message at stream offset " +
                               std::to_string(offset));
    }
    offset += h.size;
  };

  Phase warmup(WarmupOf(h.budget));
  for (; !warmup.Done(); warmup.Tick()) {
    round_trip();
    check_echo();
  }

  Histogram rtt_ns;
  Phase measure(h.budget);
  uint64_t now = measure.start_ns();
  for (; !measure.Done(now); measure.Tick()) {
    const uint64_t start = NowNs();
    round_trip();
    now = NowNs();
    rtt_ns.Add(now - start);
    check_echo();
  }
  const double seconds = static_cast<double>(now - measure.start_ns()) * 1e-9;

  ShutdownWrite(fd);
  ExpectEof(fd);

  Result r;
  r.test = TestName(h.test);
  r.size = h.size;
  r.iters = measure.count();
  r.bytes = measure.count() * h.size;
  r.seconds = seconds;
  r.latency = SummarizeRoundTrips(rtt_ns);
  return r;
}

std::string ServeLatency(int fd, const TestHeader& h) {
  SetNoDelay(fd);
  std::vector<uint8_t> buf(h.size);
  uint64_t messages = 0;
  while (RecvAll(fd, buf.data(), buf.size())) {
    SendAll(fd, buf.data(), buf.size());
    ++messages;
  }
  return "echoed " + std::to_string(messages) + " messages";
}

}  // namespace slipperf
