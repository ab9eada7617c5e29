#include "tools/slip-perf/compare_setup.h"

#include <sys/stat.h>
#include <sys/utsname.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string_view>
#include <system_error>
#include <thread>

#include "tools/slip-perf/args.h"

namespace slipperf {
namespace {

std::string CpuText(int cpu) {
  return cpu < 0 ? "unpinned" : "CPU " + std::to_string(cpu);
}

}  // namespace

void MakeDirectories(const std::string& path) {
  for (size_t at = path.find('/', 1);; at = path.find('/', at + 1)) {
    const std::string prefix = path.substr(0, at);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      throw std::system_error(errno, std::generic_category(), "cannot create " + prefix);
    }
    if (at == std::string::npos) return;
  }
}

std::string HostDescription() {
  utsname u{};
  uname(&u);
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model = "?";
  while (std::getline(cpuinfo, line)) {
    if (line.starts_with("model name")) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return std::string(u.sysname) + " " + u.release + " " + u.machine + ", " + model + " (" +
         std::to_string(std::thread::hardware_concurrency()) + " CPUs)";
}

void DropPreloadFromEnvironment() {
  const char* preload = std::getenv("LD_PRELOAD");
  if (preload == nullptr) return;
  std::string kept;
  std::string list(preload);
  for (char& ch : list) {
    if (ch == ':' || ch == ' ') ch = ',';
  }
  for (const std::string_view entry : SplitList(list)) {
    if (entry.empty() || entry.find("libslipstream") != std::string_view::npos) continue;
    kept += (kept.empty() ? "" : ":") + std::string(entry);
  }
  if (kept.empty()) {
    unsetenv("LD_PRELOAD");
  } else {
    setenv("LD_PRELOAD", kept.c_str(), 1);
  }
}

void DescribeSettings(const CompareOptions& o, Comparison* c) {
  const SweepOptions& s = o.sweep;
  std::string tests, sizes;
  for (const TestId t : s.tests) {
    tests += (tests.empty() ? "" : ",") + std::string(TestKind(t));
    c->tests.push_back(TestKind(t));
  }
  for (const uint32_t size : s.sizes) sizes += (sizes.empty() ? "" : ",") + std::to_string(size);
  char budget[64];
  if (s.budget.iters != 0) {
    std::snprintf(budget, sizeof(budget), "%llu iterations",
                  static_cast<unsigned long long>(s.budget.iters));
  } else {
    std::snprintf(budget, sizeof(budget), "%.3g s",
                  static_cast<double>(s.budget.duration_ns) * 1e-9);
  }
  const std::string where = o.remote.empty() ? "this host (127.0.0.1)" : o.remote;
  c->plot_note = "median of " + std::to_string(s.repeat) + " run(s) of " + budget +
                 " per point, whiskers from the slowest to the fastest run; " + HostDescription();
  c->settings = "tests " + tests + "; " + std::to_string(s.sizes.size()) + " sizes from " +
                HumanSize(s.sizes.front()) + " to " + HumanSize(s.sizes.back()) + "; " + budget +
                " per run, " + std::to_string(s.repeat) + " run(s) per point; server " + where +
                "; CPUs: server " + CpuText(o.cpus.server) + ", client " + CpuText(o.cpus.client) +
                "; host " + HostDescription();
  c->settings_json =
      "{\"tests\":\"" + tests + "\",\"sizes\":[" + sizes + "],\"duration_s\":" +
      (s.budget.iters != 0 ? "null"
                           : std::to_string(static_cast<double>(s.budget.duration_ns) * 1e-9)) +
      ",\"iters\":" + (s.budget.iters != 0 ? std::to_string(s.budget.iters) : "null") +
      ",\"repeat\":" + std::to_string(s.repeat) + ",\"streams\":" + std::to_string(s.streams) +
      ",\"conns\":" + std::to_string(s.conns) + ",\"server\":" + JsonEscape(where) +
      ",\"cpus\":" + JsonEscape(CpuText(o.cpus.server) + "," + CpuText(o.cpus.client)) +
      ",\"host\":" + JsonEscape(HostDescription()) + "}";
}

}  // namespace slipperf
