// slip-run: runs a program with Slipstream preloaded (like smc_run).
//
//   slip-run [OPTIONS] -- CMD [ARGS...]
//
// Finds libslipstream.so relative to itself (../lib/), prepends it to LD_PRELOAD, turns
// options into SLIP_* variables and execs CMD. Options are validated by the library
// itself at start-up, exactly as if they had been set in the environment.
#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

struct Option {
  const char* flag;  // "--name"
  const char* env;   // SLIP_* variable it sets
  const char* help;
};

constexpr Option kOptions[] = {
    {"--transports", "SLIP_TRANSPORTS", "transports in preference order (default shm,tcp)"},
    {"--stats", "SLIP_STATS_FILE", "append one JSON line of per-connection stats at exit"},
    {"--ring-size", "SLIP_RING_SIZE", "ring bytes per direction, power of two (default 1M)"},
    {"--spin-us", "SLIP_SPIN_US", "busy-poll before sleeping, microseconds (default 50)"},
    {"--log", "SLIP_LOG", "error|warn|info|debug|trace (default warn)"},
    {"--log-file", "SLIP_LOG_FILE", "log file (default stderr)"},
    {"--include-ports", "SLIP_INCLUDE_PORTS", "only these ports, e.g. 80,8000-9000"},
    {"--exclude-ports", "SLIP_EXCLUDE_PORTS", "never these ports"},
    {"--include-cidr", "SLIP_INCLUDE_CIDR", "only these remote prefixes, e.g. 127.0.0.0/8"},
    {"--exclude-cidr", "SLIP_EXCLUDE_CIDR", "never these remote prefixes"},
    {"--handshake-timeout-ms", "SLIP_HANDSHAKE_TIMEOUT_MS", "negotiation timeout (default 2000)"},
};

void Usage(FILE* out) {
  std::fprintf(out, "usage: slip-run [OPTIONS] -- CMD [ARGS...]\n\n"
                    "Runs CMD with Slipstream preloaded: its TCP connections to other Slipstream\n"
                    "processes move to faster transports; all others stay plain TCP.\n\noptions:\n");
  for (const Option& o : kOptions) std::fprintf(out, "  %s=VALUE\n      %s (%s)\n", o.flag, o.help, o.env);
  std::fprintf(out, "  --help\n      this text\n");
}

// The library sits in ../lib relative to this executable (build/bin -> build/lib).
std::string LibraryPath() {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return {};
  self[n] = '\0';
  std::string dir(self);
  dir.resize(dir.rfind('/'));
  std::string lib = dir + "/../lib/libslipstream.so";
  char real[PATH_MAX];
  if (!realpath(lib.c_str(), real)) return {};
  return real;
}

bool ApplyOption(const char* arg) {
  for (const Option& o : kOptions) {
    size_t len = std::strlen(o.flag);
    if (std::strncmp(arg, o.flag, len) == 0 && arg[len] == '=') {
      setenv(o.env, arg + len + 1, 1);
      return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  int i = 1;
  for (; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      ++i;
      break;
    }
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      Usage(stdout);
      return 0;
    }
    if (!ApplyOption(argv[i])) {
      std::fprintf(stderr, "slip-run: unknown option '%s'\n\n", argv[i]);
      Usage(stderr);
      return 2;
    }
  }
  if (i >= argc) {
    std::fprintf(stderr, "slip-run: no command given\n\n");
    Usage(stderr);
    return 2;
  }
  std::string lib = LibraryPath();
  if (lib.empty()) {
    std::fprintf(stderr, "slip-run: cannot find libslipstream.so next to %s\n", argv[0]);
    return 127;
  }
  const char* old = getenv("LD_PRELOAD");
  std::string preload = old && *old ? lib + ":" + old : lib;
  setenv("LD_PRELOAD", preload.c_str(), 1);
  execvp(argv[i], argv + i);
  std::fprintf(stderr, "slip-run: cannot run '%s': %s\n", argv[i], std::strerror(errno));
  return 127;
}
