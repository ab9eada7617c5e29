// slip-stat: the live connections of every process under Slipstream on this host (like
// smcss or vma_stats). See Usage() in cli.cc; the reading is in scan.h and stats_file.h.
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <string>

#include "tools/slip-stat/cli.h"
#include "tools/slip-stat/format.h"
#include "tools/slip-stat/scan.h"
#include "tools/slip-stat/view.h"

namespace {

volatile sig_atomic_t g_stop = 0;

void OnStop(int) {
  g_stop = 1;
}

std::string Render(const slipstat::Options& o, const slipstat::ScanResult& scan) {
  if (o.json) return slipstat::RenderJson(scan.processes, o.view);
  if (o.reasons) return slipstat::RenderReasons(scan.processes);
  return slipstat::RenderConnections(scan.processes, o.view);
}

// One scan to stdout after `heading`, then its notes to stderr (after, so that a redraw
// does not wipe them). False when stdout fails (a closed pipe).
bool Show(const slipstat::Options& o, const std::string& heading = {}) {
  slipstat::ScanResult scan = slipstat::Scan(o.scan);
  std::string out = heading + Render(o, scan);
  bool ok =
      std::fwrite(out.data(), 1, out.size(), stdout) == out.size() && std::fflush(stdout) == 0;
  for (const std::string& note : scan.notes) {
    std::fprintf(stderr, "slip-stat: %s\n", slipstat::Printable(note).c_str());
  }
  return ok;
}

// Sleeps `seconds`, or less if SIGINT or SIGTERM arrives (they are set not to restart).
void Sleep(double seconds) {
  timespec left{static_cast<time_t>(seconds),
                static_cast<long>((seconds - std::floor(seconds)) * 1e9)};
  while (!g_stop && nanosleep(&left, &left) != 0 && errno == EINTR) {
  }
}

// Redraws until interrupted. The screen is cleared only on a terminal, and never for JSON,
// whose refreshes are a stream of lines for a program to read.
int Watch(const slipstat::Options& o) {
  struct sigaction action = {};
  action.sa_handler = OnStop;
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  bool clear = !o.json && isatty(STDOUT_FILENO);
  while (!g_stop) {
    std::string heading;
    if (!o.json) {
      std::time_t now = std::time(nullptr);
      char when[64];
      std::strftime(when, sizeof(when), "%H:%M:%S", std::localtime(&now));
      char line[128];
      snprintf(line, sizeof(line), "%sslip-stat every %gs, %s\n\n", clear ? "\033[H\033[2J" : "",
               o.watch_s, when);
      heading = line;
    }
    if (!Show(o, heading)) return 1;
    if (!clear && !o.json) std::putchar('\n');
    Sleep(o.watch_s);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  slipstat::Options o;
  try {
    o = slipstat::ParseCommandLine(argc, argv);
  } catch (const slipstat::UsageError& e) {
    std::fprintf(stderr, "slip-stat: %s\n\n%s", e.what(), slipstat::Usage().c_str());
    return 2;
  }
  if (o.help) {
    std::fputs(slipstat::Usage().c_str(), stdout);
    return 0;
  }
  if (o.watch_s > 0) return Watch(o);
  return Show(o) ? 0 : 1;
}
