// slip-perf server: accepts one connection per test and serves the tests one at a time.
#include <signal.h>

#include <cstdio>
#include <exception>
#include <string>

#include "tools/slip-perf/commands.h"
#include "tools/slip-perf/net.h"
#include "tools/slip-perf/tests.h"

namespace slipperf {
namespace {

void OnStopSignal(int) {
  RequestStop();
}

// SIGINT and SIGTERM end the server through a normal return from main (so that exit-time
// handlers run, e.g. the stats record of a preloaded library). No SA_RESTART: a blocked
// accept or recv returns EINTR and the server stops.
void InstallStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

// Reads the header, answers it, runs the data phase. Returns the log line; throws on failure.
std::string ServeOne(int fd) {
  std::array<uint8_t, kHeaderBytes> wire;
  if (!RecvAll(fd, wire.data(), wire.size())) return "closed before sending a test header";
  TestHeader h;
  const Status status = DecodeHeader(wire, &h);
  const auto ack = EncodeAck(status);
  SendAll(fd, ack.data(), ack.size());
  if (status != Status::kOk)
    throw std::runtime_error(std::string("refused: ") + StatusText(status));
  const std::string what = std::string(TestName(h.test)) + " size " + std::to_string(h.size) + ": ";
  switch (h.test) {
    case TestId::kTcpLat:
      return what + ServeLatency(fd, h);
    case TestId::kTcpBw:
      return what + ServeBandwidth(fd, h);
  }
  return what + "unknown test";
}

}  // namespace

int RunServer(const ServerOptions& options) {
  InstallStopHandlers();
  Fd listener = Listen(options.bind, options.port);
  std::fprintf(stderr, "slip-perf server: listening on %s\n", LocalName(listener.get()).c_str());
  uint64_t served = 0;
  uint64_t failed = 0;
  try {
    while (options.max_tests == 0 || served < options.max_tests) {
      Fd conn = Accept(listener.get());
      const std::string peer = PeerName(conn.get());
      try {
        const std::string line = ServeOne(conn.get());
        std::fprintf(stderr, "slip-perf server: %s: %s\n", peer.c_str(), line.c_str());
      } catch (const Interrupted&) {
        throw;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "slip-perf server: %s: error: %s\n", peer.c_str(), e.what());
        ++failed;
      }
      ++served;
    }
  } catch (const Interrupted&) {
    std::fprintf(stderr, "slip-perf server: stopped by signal\n");
  }
  std::fprintf(stderr, "slip-perf server: served %llu test(s), %llu failed\n",
               static_cast<unsigned long long>(served), static_cast<unsigned long long>(failed));
  return failed == 0 ? 0 : 1;
}

}  // namespace slipperf
