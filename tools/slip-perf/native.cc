// slip-perf native: the sweep straight on the shm transport, between this process (the
// client) and a child it forks (the server), over a socketpair that carries the session's
// control messages and the regions' descriptors. Ring size and spin come from
// SLIP_RING_SIZE and SLIP_SPIN_US, as the shim would take them.
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <exception>
#include <string>
#include <system_error>

#include "core/config.h"
#include "tools/slip-perf/commands.h"
#include "tools/slip-perf/cpu.h"
#include "tools/slip-perf/net.h"
#include "tools/slip-perf/session.h"
#include "tools/slip-perf/shm_native.h"

namespace slipperf {
namespace {

// The child's whole life: serve the session until the parent closes it.
int ServeNative(int fd, const slip::Config& config, int cpu) {
  try {
    PinToCpu(cpu);
    SocketLink control{Fd(fd)};
    PeerWatch watch(fd);  // after control: stops before the descriptor closes
    ShmAcceptor acceptor(fd, config.spin_us, &watch);
    return ServeSession(control, acceptor, "slip-perf native (server side)", false) == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "slip-perf native (server side): %s\n", e.what());
    return 1;
  }
}

std::vector<Result> RunNativeClient(int fd, const slip::Config& config, const SweepOptions& sweep,
                                    int cpu) {
  SocketLink control{Fd(fd)};
  PinToCpu(cpu);
  PeerWatch watch(fd);
  ShmConnector connector(fd, config.ring_size, config.spin_us, &watch);
  return RunSweep(control, connector, sweep, "shm");
}

}  // namespace

int RunNative(const NativeOptions& options) {
  slip::Config config;
  std::string error;
  if (!slip::ParseConfigFromEnv(&config, &error)) {
    std::fprintf(stderr, "slip-perf native: %s\n", error.c_str());
    return 2;
  }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    throw std::system_error(errno, std::generic_category(), "socketpair");
  }
  // Forked before any thread exists; the child leaves with _exit, so nothing of the
  // parent's (buffered output, exit handlers) runs twice.
  std::fflush(nullptr);
  const pid_t child = fork();
  if (child < 0) throw std::system_error(errno, std::generic_category(), "fork");
  if (child == 0) {
    close(sv[0]);
    const int status = ServeNative(sv[1], config, options.cpus.server);
    std::fflush(nullptr);
    _exit(status);
  }
  close(sv[1]);
  std::vector<Result> results;
  int rc = 0;
  try {
    // Closes sv[0] when done, which ends the child.
    results = RunNativeClient(sv[0], config, options.sweep, options.cpus.client);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "slip-perf native: %s\n", e.what());
    rc = 1;
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  if (rc == 0) WriteReport(stdout, options.output.format, options.output.meta, results);
  return rc;
}

}  // namespace slipperf
