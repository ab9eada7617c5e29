// slip-run: runs a program with Slipstream preloaded (like smc_run).
//
//   slip-run [OPTIONS] [--] CMD [ARGS...]
//
// Finds libslipstream.so relative to itself (../lib/), prepends it to LD_PRELOAD, turns
// options into SLIP_* variables and execs CMD. Options are validated by the library
// itself at start-up, exactly as if they had been set in the environment.
//
// --summary cannot exec: the counters of CMD's processes die with them, and only their
// exit records (SLIP_STATS_FILE) outlive them. So slip-run then runs CMD as its child,
// waits, and reads the records CMD's processes appended.
#include <arpa/inet.h>
#include <dlfcn.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/trusted_path.h"
#include "fabric/options.h"
#include "tools/slip-stat/exit_records.h"
#include "tools/slip-stat/summary.h"
#include "verbs/options.h"

extern char** environ;

namespace {

using slip::Config;

// The library's defaults: core's and each transport's.
struct Defaults {
  Config core;
  slip::verbs::Options verbs;
  slip::fabric::Options fabric;
};

// By slip::LogLevel, the names SLIP_LOG takes.
constexpr const char* kLevelNames[] = {"error", "warn", "info", "debug", "trace"};

std::string TransportsText(const Config& c) {
  std::string text;
  for (slip::TransportKind kind : c.transports) {
    text += (text.empty() ? "" : ",") + std::string(slip::TransportName(kind));
  }
  return text;
}

// 1048576 -> "1M": the form SLIP_RING_SIZE takes.
std::string SizeText(uint64_t bytes) {
  static constexpr std::pair<char, int> kUnits[] = {{'G', 30}, {'M', 20}, {'K', 10}};
  for (auto [unit, shift] : kUnits) {
    if (bytes != 0 && bytes % (uint64_t{1} << shift) == 0) {
      return std::to_string(bytes >> shift) + unit;
    }
  }
  return std::to_string(bytes);
}

// An empty list means no restriction: `when_empty` says which way.
std::string PortsText(const std::vector<slip::PortRange>& ports, const char* when_empty) {
  std::string text;
  for (const slip::PortRange& r : ports) {
    text += (text.empty() ? "" : ",") + std::to_string(r.first);
    if (r.last != r.first) text += "-" + std::to_string(r.last);
  }
  return text.empty() ? when_empty : text;
}

std::string CidrsText(const std::vector<slip::Cidr>& cidrs, const char* when_empty) {
  std::string text;
  for (const slip::Cidr& c : cidrs) {
    char host[INET6_ADDRSTRLEN] = "?";
    inet_ntop(c.family, c.addr, host, sizeof(host));
    text += (text.empty() ? "" : ",") + std::string(host) + "/" + std::to_string(c.prefix_len);
  }
  return text.empty() ? when_empty : text;
}

std::string PathText(const std::string& path, const char* when_empty) {
  return path.empty() ? when_empty : path;
}

struct Option {
  const char* flag;   // takes a value: --flag=VALUE or --flag VALUE
  const char* value;  // what VALUE looks like
  const char* env;    // the SLIP_* variable it sets
  const char* help;
  std::string (*default_of)(const Defaults&);  // the library's default
};

// Every variable the library reads (core/config.cc, verbs/options.cc), one option each.
const Option kOptions[] = {
    {"--transports", "LIST", "SLIP_TRANSPORTS", "transports in preference order",
     [](const Defaults& d) { return TransportsText(d.core); }},
    {"--ring-size", "SIZE", "SLIP_RING_SIZE",
     "ring bytes per direction: a power of two from 4K to 256M (K, M, G suffixes)",
     [](const Defaults& d) { return SizeText(d.core.ring_size); }},
    {"--spin-us", "N", "SLIP_SPIN_US", "busy-poll before sleeping, in microseconds (0..1000000)",
     [](const Defaults& d) { return std::to_string(d.core.spin_us); }},
    {"--handshake-timeout-ms", "N", "SLIP_HANDSHAKE_TIMEOUT_MS",
     "negotiation timeout in milliseconds (1..600000)",
     [](const Defaults& d) { return std::to_string(d.core.handshake_timeout_ms); }},
    {"--device", "NAME", "SLIP_DEVICE", "RDMA device for verbs (e.g. rxe0)",
     [](const Defaults& d) { return PathText(d.verbs.device, "any"); }},
    {"--gid-index", "N", "SLIP_GID_INDEX", "RoCE GID table index (0..255)",
     [](const Defaults& d) {
       return d.verbs.gid_index < 0 ? std::string("the RoCEv2 GID of the address")
                                    : std::to_string(d.verbs.gid_index);
     }},
    {"--verbs-notify", "MODE", "SLIP_VERBS_NOTIFY",
     "imm (RDMA WRITE WITH IMMEDIATE), send (SEND after WRITE, as iWARP needs) or auto",
     [](const Defaults& d) {
       return std::string(d.verbs.notify == slip::verbs::NotifyMode::kImm    ? "imm"
                          : d.verbs.notify == slip::verbs::NotifyMode::kSend ? "send"
                                                                             : "auto");
     }},
    {"--negative-ttl-ms", "N", "SLIP_NEGATIVE_TTL_MS",
     "how long a destination that answered 'no RDMA' is tried plainly (0..3600000)",
     [](const Defaults& d) { return std::to_string(d.verbs.negative_ttl_ms); }},
    {"--fabric-provider", "NAME", "SLIP_FABRIC_PROVIDER",
     "the libfabric provider for the fabric transport (tcp, shm, verbs, efa, or as fi_info "
     "names it)",
     [](const Defaults& d) { return PathText(d.fabric.provider, "the best match"); }},
    {"--fabric-endpoint", "TYPE", "SLIP_FABRIC_ENDPOINT",
     "fabric streams' endpoints: msg (one connected endpoint per stream), rdm (one reliable "
     "datagram endpoint per process), auto (msg where the provider has it, else rdm)",
     [](const Defaults& d) {
       using slip::fabric::EndpointChoice;
       return std::string(d.fabric.endpoint == EndpointChoice::kConnected  ? "msg"
                          : d.fabric.endpoint == EndpointChoice::kDatagram ? "rdm"
                                                                           : "auto");
     }},
    {"--fabric-notes", "MODE", "SLIP_FABRIC_NOTES",
     "fabric streams' cursors: word (in the peer's ring memory, with a 4-byte doorbell) or "
     "inline (8 bytes of CQ data where the provider can; only where every host is trusted)",
     [](const Defaults& d) { return std::string(d.fabric.word_notes ? "word" : "inline"); }},
    {"--fabric-data", "MODE", "SLIP_FABRIC_DATA",
     "fabric streams' bytes: write (RMA into the peer's ring), send (into the peer's posted "
     "receives, for providers without RMA; connected endpoints) or auto (write where it can)",
     [](const Defaults& d) {
       using slip::fabric::DataChoice;
       return std::string(d.fabric.data == DataChoice::kWrite  ? "write"
                          : d.fabric.data == DataChoice::kSend ? "send"
                                                               : "auto");
     }},
    {"--verbs-reuse", "N", "SLIP_VERBS_REUSE",
     "queue pairs kept after their connections closed, for the next ones (0..1024; 0: none)",
     [](const Defaults& d) { return std::to_string(d.verbs.reuse); }},
    {"--verbs-pin-max", "SIZE", "SLIP_VERBS_PIN_MAX",
     "the most bytes of rings pinned for RDMA (1M..1024G; default: a quarter of memory)",
     [](const Defaults& d) {
       return d.verbs.pin_max ? std::to_string(d.verbs.pin_max) : std::string("auto");
     }},
    {"--rendezvous-dir", "DIR", "SLIP_RENDEZVOUS_DIR",
     "a directory shared with other network namespaces of this host (pods), for shm "
     "between them (absolute, at most 255 characters)",
     [](const Defaults& d) { return PathText(d.core.rendezvous_dir, "none"); }},
    {"--failover", "0|1", "SLIP_FAILOVER",
     "continue a connection on TCP when its RDMA path fails mid-stream (0: reset it)",
     [](const Defaults& d) { return std::string(d.core.failover ? "1" : "0"); }},
    {"--short-conns", "MODE", "SLIP_SHORT_CONNS",
     "adaptive (a destination whose connections keep closing before their setup paid off "
     "gets plain TCP, a probe now and then) or accelerate (every connection, however short)",
     [](const Defaults& d) {
       return std::string(d.core.short_conns_adaptive ? "adaptive" : "accelerate");
     }},
    {"--include-ports", "PORTS", "SLIP_INCLUDE_PORTS",
     "accelerate only these ports (local or remote), e.g. 80,8000-9000",
     [](const Defaults& d) { return PortsText(d.core.include_ports, "all"); }},
    {"--exclude-ports", "PORTS", "SLIP_EXCLUDE_PORTS", "never accelerate these ports",
     [](const Defaults& d) { return PortsText(d.core.exclude_ports, "none"); }},
    {"--include-cidr", "PREFIXES", "SLIP_INCLUDE_CIDR",
     "accelerate only these remote prefixes, e.g. 127.0.0.0/8,::1/128",
     [](const Defaults& d) { return CidrsText(d.core.include_cidrs, "all"); }},
    {"--exclude-cidr", "PREFIXES", "SLIP_EXCLUDE_CIDR", "never accelerate these remote prefixes",
     [](const Defaults& d) { return CidrsText(d.core.exclude_cidrs, "none"); }},
    {"--log", "LEVEL", "SLIP_LOG", "error, warn, info, debug or trace",
     [](const Defaults& d) {
       return std::string(kLevelNames[static_cast<int>(d.core.log_level)]);
     }},
    {"--log-file", "PATH", "SLIP_LOG_FILE", "where log lines go",
     [](const Defaults& d) { return PathText(d.core.log_file, "stderr"); }},
    {"--stats", "PATH", "SLIP_STATS_FILE",
     "each process appends one JSON line of per-connection stats at exit",
     [](const Defaults& d) { return PathText(d.core.stats_file, "none"); }},
    {"--enable", "0|1", "SLIP_ENABLE", "0 runs CMD with Slipstream inert (plain TCP)",
     [](const Defaults& d) { return std::string(d.core.enabled ? "1" : "0"); }},
};

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: slip-run [OPTIONS] [--] CMD [ARGS...]\n\n"
               "Runs CMD with Slipstream preloaded: its TCP connections to other Slipstream\n"
               "processes on this host move to shared memory; all others stay plain TCP.\n"
               "See them live with slip-stat.\n\n"
               "Each option sets the SLIP_* variable named after it, and setting that variable\n"
               "instead has the same effect; these are all the variables the library reads.\n"
               "A bad value is reported on stderr and leaves that process on plain TCP.\n\n");
  const Defaults defaults;
  for (const Option& o : kOptions) {
    std::fprintf(out, "  %s=%s  %s, default %s\n      %s\n", o.flag, o.value, o.env,
                 o.default_of(defaults).c_str(), o.help);
  }
  std::fprintf(out,
               "  --summary\n"
               "      when CMD exits, print on stderr what its processes accelerated:\n"
               "      connections by transport and fallback reason, and bytes. CMD then runs\n"
               "      as a child of slip-run, which passes SIGINT, SIGTERM and SIGHUP on to\n"
               "      it and exits with its status (128+N if it was killed by signal N)\n"
               "  -h, --help\n"
               "      this text\n\n"
               "Exit status: CMD's; 2 for a bad command line, 127 if CMD cannot be run.\n");
}

[[noreturn]] void UsageError(const std::string& message) {
  std::fprintf(stderr, "slip-run: %s\n\n", message.c_str());
  Usage(stderr);
  std::exit(2);
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

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_init();  // NOLINT(bugprone-reserved-identifier)
#elif defined(__SANITIZE_ADDRESS__)
extern "C" void __asan_init();  // NOLINT(bugprone-reserved-identifier)
#endif

// A sanitizer build of the shim (make test-sanitize-suite) runs inside programs that are
// not instrumented, so its runtime must be preloaded too, after the shim: before libc, or
// its interceptors would come after libc's symbols and see none of the shim's locks, and
// after the shim, or the program's calls would enter the shim from inside the runtime's
// interceptors (a blocking one hides every lock taken inside it). Where slip-run itself
// was built that way, it names the runtime it was linked with; elsewhere: empty.
std::string SanitizerRuntime() {
  Dl_info info{};
#if defined(__SANITIZE_THREAD__)
  if (dladdr(reinterpret_cast<void*>(&__tsan_init), &info) != 0 && info.dli_fname)
    return info.dli_fname;
#elif defined(__SANITIZE_ADDRESS__)
  if (dladdr(reinterpret_cast<void*>(&__asan_init), &info) != 0 && info.dli_fname)
    return info.dli_fname;
#endif
  (void)info;
  return {};
}

const Option* FindOption(std::string_view flag) {
  for (const Option& o : kOptions) {
    if (flag == o.flag) return &o;
  }
  return nullptr;
}

struct CommandLine {
  bool summary = false;
  char** command = nullptr;  // CMD and its arguments, null-terminated (argv's tail)
};

// Applies the options to the environment; the first argument that is not an option, or
// the one after "--", starts CMD.
CommandLine Parse(int argc, char** argv) {
  CommandLine line;
  int i = 1;
  for (; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-') break;
    if (arg == "--help" || arg == "-h") {
      Usage(stdout);
      std::exit(0);
    }
    if (arg == "--summary") {
      line.summary = true;
      continue;
    }
    size_t eq = arg.find('=');
    const Option* o = FindOption(arg.substr(0, eq));
    if (o == nullptr) UsageError("unknown option '" + std::string(arg) + "'");
    if (eq == std::string_view::npos && i + 1 >= argc) {
      UsageError(std::string(arg) + " needs a value (" + o->value + ")");
    }
    std::string value(eq == std::string_view::npos ? argv[++i] : arg.substr(eq + 1));
    setenv(o->env, value.c_str(), 1);
  }
  if (i >= argc) UsageError("no command given");
  line.command = argv + i;
  return line;
}

constexpr int kPassedSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Where CMD's processes append their exit records, and where ours start.
struct StatsTarget {
  std::string path;
  uint64_t offset = 0;     // the file's size before CMD ran
  bool temporary = false;  // ours to remove
};

// The user's SLIP_STATS_FILE (from --stats or the environment), or a temporary file.
bool ChooseStatsFile(StatsTarget* target) {
  const char* given = getenv("SLIP_STATS_FILE");
  if (given != nullptr && *given != '\0') {
    target->path = given;
    // Only a file of ours is read (or appended to: core/stats.cc), never through a link.
    slip::PathVerdict verdict;
    const int fd = slip::OpenOwnFileForRead(given, &verdict);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0) target->offset = static_cast<uint64_t>(st.st_size);
    if (fd >= 0) close(fd);
    return true;
  }
  const char* tmp = getenv("TMPDIR");
  std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/slip-run-summary.XXXXXX";
  int fd = mkstemp(pattern.data());
  if (fd < 0) {
    std::fprintf(stderr, "slip-run: cannot create %s: %s\n", pattern.c_str(), strerror(errno));
    return false;
  }
  close(fd);
  target->path = pattern;
  target->temporary = true;
  setenv("SLIP_STATS_FILE", pattern.c_str(), 1);
  return true;
}

// Passes `info`'s signal on to CMD (`child`). A terminal's ^C, ^\ and hangup (si_code
// SI_KERNEL) already reach CMD, which shares our foreground process group; passing them on
// would deliver them twice.
void PassOn(pid_t child, const signalfd_siginfo& info) {
  if (info.ssi_code != SI_KERNEL) kill(child, int(info.ssi_signo));
}

// Spawns CMD with the signal mask and dispositions slip-run was given, waits for it and
// returns its status as an exit code; -1 if it could not be started.
//
// The signals slip-run passes on stay blocked in slip-run from before the spawn, and are
// taken from a signalfd while it waits for CMD's pidfd: synchronously, no handler (an
// ignored signal stays ignored, for CMD too: nohup, background jobs). Where the kernel has
// no pidfd, the wait looks at CMD every 50 ms instead.
int SpawnAndWait(char** command) {
  sigset_t passed, original;
  sigemptyset(&passed);
  for (int sig : kPassedSignals) {
    struct sigaction old;
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler != SIG_IGN) sigaddset(&passed, sig);
  }
  sigprocmask(SIG_BLOCK, &passed, &original);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setsigmask(&attr, &original);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
  pid_t pid;
  int err = posix_spawnp(&pid, command[0], nullptr, &attr, command, environ);
  posix_spawnattr_destroy(&attr);
  if (err != 0) {
    sigprocmask(SIG_SETMASK, &original, nullptr);
    std::fprintf(stderr, "slip-run: cannot run '%s': %s\n", command[0], std::strerror(err));
    return -1;
  }
  const int signals = signalfd(-1, &passed, SFD_CLOEXEC | SFD_NONBLOCK);
  const int exited = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  int status = 0;
  bool reaped = false;
  while (!reaped) {
    pollfd fds[2] = {{signals, POLLIN, 0}, {exited, POLLIN, 0}};  // (-1: not polled)
    if (poll(fds, 2, exited >= 0 ? -1 : 50) < 0 && errno != EINTR) break;
    signalfd_siginfo info;
    while (signals >= 0 && read(signals, &info, sizeof(info)) == sizeof(info)) PassOn(pid, info);
    const pid_t r = waitpid(pid, &status, WNOHANG);
    reaped = r == pid || (r < 0 && errno != EINTR);
  }
  while (!reaped && waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // (The passed signals stay blocked: one that comes now finds CMD reaped, and is dropped
  // as the handler that was here dropped it.)
  if (signals >= 0) close(signals);
  if (exited >= 0) close(exited);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

int RunWithSummary(char** command) {
  StatsTarget stats;
  if (!ChooseStatsFile(&stats)) return 127;
  int code = SpawnAndWait(command);
  slipstat::ExitRecords records;
  std::string error;
  if (!slipstat::ReadExitRecords(stats.path, stats.offset, &records, &error)) {
    std::fprintf(stderr, "slip-run: summary: cannot read %s\n", error.c_str());
  } else if (code >= 0) {
    std::string summary = slipstat::RenderSummary(records, "slip-run: summary: ");
    std::fputs(summary.c_str(), stderr);
  }
  if (stats.temporary) unlink(stats.path.c_str());
  return code < 0 ? 127 : code;
}

}  // namespace

int main(int argc, char** argv) {
  CommandLine line = Parse(argc, argv);
  std::string lib = LibraryPath();
  if (lib.empty()) {
    std::fprintf(stderr, "slip-run: cannot find libslipstream.so next to %s\n", argv[0]);
    return 127;
  }
  const char* old = getenv("LD_PRELOAD");
  std::string preload = lib;
  const std::string runtime = SanitizerRuntime();
  if (!runtime.empty() && !(old && std::strstr(old, runtime.c_str()))) preload += ":" + runtime;
  if (old && *old) preload += std::string(":") + old;
  setenv("LD_PRELOAD", preload.c_str(), 1);
  if (line.summary) return RunWithSummary(line.command);
  execvp(line.command[0], line.command);
  std::fprintf(stderr, "slip-run: cannot run '%s': %s\n", line.command[0], std::strerror(errno));
  return 127;
}
