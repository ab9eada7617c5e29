// slip-perf server: accepts one client session at a time on its control connection, and
// the data connections of each test on the same port.
#include <signal.h>

#include <cstdio>
#include <exception>
#include <string>

#include "tools/slip-perf/commands.h"
#include "tools/slip-perf/net.h"
#include "tools/slip-perf/session.h"

namespace slipperf {
namespace {

void OnStopSignal(int) {
  RequestStop();
}

// SIGINT and SIGTERM end the server through a normal return from main (so that exit-time
// handlers run, e.g. the stats record of a preloaded library). No SA_RESTART: a blocked
// accept, poll or recv returns EINTR and the server stops.
void InstallStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
}

}  // namespace

int RunServer(const ServerOptions& options) {
  InstallStopHandlers();
  Fd listener = Listen(options.bind, options.port, options.reuseport);
  // compare (and scripts) read the port from this line when they asked for port 0.
  std::fprintf(stderr, "slip-perf server: listening on %s\n", LocalName(listener.get()).c_str());
  SocketAcceptor acceptor(listener.get());
  uint64_t sessions = 0;
  uint64_t failed = 0;
  try {
    while (options.max_sessions == 0 || sessions < options.max_sessions) {
      std::unique_ptr<Link> control = acceptor.Accept({});
      const std::string peer =
          "slip-perf server: " + PeerName(static_cast<SocketLink&>(*control).fd());
      try {
        control->SetNoDelay();
        failed += ServeSession(*control, acceptor, peer, /*verbose=*/true);
      } catch (const Interrupted&) {
        throw;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s: error: %s\n", peer.c_str(), e.what());
        ++failed;
      }
      ++sessions;
    }
  } catch (const Interrupted&) {
    std::fprintf(stderr, "slip-perf server: stopped by signal\n");
  }
  std::fprintf(stderr, "slip-perf server: served %llu session(s), %llu failed test(s)\n",
               static_cast<unsigned long long>(sessions), static_cast<unsigned long long>(failed));
  return failed == 0 ? 0 : 1;
}

}  // namespace slipperf
