// Start-up and exit of the shim: configuration, logging, stats, fork handling.
#include "preload/runtime.h"

#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

#include <string>

#include "core/log.h"
#include "core/own_fds.h"
#include "core/stats.h"
#include "core/sys.h"
#include "preload/closer.h"
#include "preload/control.h"
#include "preload/fork.h"
#include "preload/transports.h"

extern char** environ;

namespace slip::preload {

namespace {

// Hidden descriptors go to the upper half of the soft limit, so the numbers the
// application sees for its own descriptors are those it would get without Slipstream.
int ChooseHiddenFloor() noexcept {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 512;
  long floor = long(rl.rlim_cur) / 2;
  return floor < 64 ? 0 : int(floor);
}

Runtime Initialise() noexcept {
  Runtime rt;
  try {
    std::string error;
    if (!ParseConfigFromEnv(&rt.config, &error) || !SetUpTransports(rt.config, &error)) {
      LogAlways("%s; Slipstream disabled for this process (plain TCP)",
                error.empty() ? "the configuration cannot be read (no memory?)" : error.c_str());
      return rt;
    }
  } catch (...) {
    LogAlways("no memory to read the configuration; Slipstream disabled for this process");
    rt.enabled = false;
    return rt;
  }
  rt.enabled = rt.config.enabled;
  if (!rt.enabled) return rt;
  sys::SetHiddenFdFloor(ChooseHiddenFloor());  // first: the log file goes above it
  // Every descriptor of ours from here on is marked, and the program's calls find it not
  // open (preload/hidden_fds.cc); our own code's calls are recognised by where they come from.
  EnableOwnFds();
  NoteOwnCode(reinterpret_cast<const void*>(&ChooseHiddenFloor));
  LogInit(rt.config.log_level, rt.config.log_file.c_str());
  try {
    const std::vector<const char*> known = TransportOptionNames();
    for (const std::string& name : UnknownSlipVariables(environ, known))
      SLIP_LOG(kWarn, "unknown variable %s ignored", name.c_str());
  } catch (...) {
  }
  StatsInit();
  InstallForkHandlers();
  SLIP_LOG(kDebug, "active: ring %u bytes, spin %u us", rt.config.ring_size, rt.config.spin_us);
  return rt;
}

}  // namespace

const Runtime& GetRuntime() noexcept {
  static const Runtime runtime = Initialise();
  return runtime;
}

namespace {

__attribute__((constructor)) void SlipstreamStart() {
  GetRuntime();
}

__attribute__((destructor)) void SlipstreamExit() {
  const Runtime& rt = GetRuntime();
  if (!rt.enabled) return;
  // Connections still settling hold bytes their peer has not taken yet (a client's, in
  // its ring, until its listener answers): they settle first, bounded, and their stats say
  // how they ended.
  ControlWaitSettled(2 * uint64_t(rt.config.handshake_timeout_ms) + 1000);
  // Writes posted but not yet acknowledged would die with the process: TCP would still
  // deliver them, so wait for them (bounded).
  DrainCloser(5000);
  for (Transport* t : Transports()) t->Flush(5000);
  if (!rt.config.stats_file.empty()) StatsWriteExitRecord(rt.config.stats_file.c_str());
  StatsShutdown();
}

}  // namespace
}  // namespace slip::preload
