#include "tools/slip-perf/cli.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <string_view>

namespace slipperf {
namespace {

constexpr const char* kUsage =
    R"(usage:
  slip-perf server [-p PORT] [--bind ADDR] [--once | --count N]
  slip-perf client HOST [-p PORT] TEST... [--size N] [--duration SEC | --iters N]
                   [--verify sampled|full] [--format table|csv|json] [--label NAME]
  slip-perf memcpy [--size N] [--duration SEC | --iters N] [--format F] [--label NAME]
  slip-perf --help

Measures what an unmodified program gets from the ordinary blocking socket API, so it
runs the same plain or under build/bin/slip-run.

server   serves tests one connection at a time (default port 5301, any address);
         --once exits after one test, --count N after N; SIGINT/SIGTERM stop it cleanly.
client   runs each TEST on its own connection to a slip-perf server:
           tcp_lat  ping-pong of N-byte messages (default 64), TCP_NODELAY; reports
                    one-way latency = round trip / 2 in microseconds: mean, p50, p99, p99.9
           tcp_bw   one stream of N-byte writes (default 64K); reports Gbit/s and MB/s;
                    the server checks the byte count and the content: --verify sampled
                    (default: the ends of each read and one cache line in four, about a
                    tenth of the cost of a copy) or full (every byte, about one copy)
memcpy   copies an N-byte buffer (default 1M) repeatedly: memory bandwidth in GB/s, the
         physical limit of a shared-memory ring of that size.

  --size N        bytes; K, M, G suffixes are powers of 1024
  --duration SEC  measured time (default 3); a warm-up of a tenth of it (at most 1 s)
                  runs first
  --iters N       measure N iterations instead (warm-up N/10)
  --format F      table (default), csv (header row) or json (one object)
  --label NAME    fills the label and transport columns (e.g. tcp, shm)
)";

// Options of one subcommand: a name, whether it takes a value, what to do with it.
struct Option {
  std::string_view name;   // "--size"
  std::string_view alias;  // "-p" or ""
  bool takes_value;
  std::function<void(std::string_view)> apply;
};

// Walks the arguments: "--name VALUE", "--name=VALUE", "-p VALUE" and positionals.
void ParseOptions(const std::vector<std::string_view>& args, const std::vector<Option>& options,
                  const std::function<void(std::string_view)>& positional) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    if (arg.size() < 2 || arg[0] != '-') {
      positional(arg);
      continue;
    }
    std::string_view inline_value;
    bool has_inline = false;
    if (const size_t eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline = true;
    }
    const Option* match = nullptr;
    for (const Option& o : options) {
      if (arg == o.name || (!o.alias.empty() && arg == o.alias)) match = &o;
    }
    if (match == nullptr) throw UsageError("unknown option '" + std::string(arg) + "'");
    if (!match->takes_value) {
      if (has_inline) throw UsageError(std::string(arg) + " takes no value");
      match->apply({});
    } else if (has_inline) {
      match->apply(inline_value);
    } else if (i + 1 < args.size()) {
      match->apply(args[++i]);
    } else {
      throw UsageError(std::string(arg) + " needs a value");
    }
  }
}

[[noreturn]] void Bad(std::string_view what, std::string_view value, std::string_view expected) {
  throw UsageError("bad " + std::string(what) + " '" + std::string(value) + "': expected " +
                   std::string(expected));
}

uint64_t ParseUnsigned(std::string_view what, std::string_view s, uint64_t min, uint64_t max,
                       bool size_suffix) {
  const std::string text(s);
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  const char* expected = size_suffix ? "a byte count like 64, 64K or 1M" : "a whole number";
  if (text.empty() || text[0] == '-' || end == text.c_str() || errno != 0) Bad(what, s, expected);
  uint64_t scale = 1;
  const std::string_view rest(end);
  if (size_suffix && rest.size() == 1) {
    switch (rest[0]) {
      case 'k':
      case 'K':
        scale = 1ull << 10;
        break;
      case 'm':
      case 'M':
        scale = 1ull << 20;
        break;
      case 'g':
      case 'G':
        scale = 1ull << 30;
        break;
      default:
        Bad(what, s, expected);
    }
  } else if (!rest.empty()) {
    Bad(what, s, expected);
  }
  if (v > max / scale || v * scale < min || v * scale > max) {
    Bad(what, s, "a value in " + std::to_string(min) + ".." + std::to_string(max));
  }
  return v * scale;
}

uint64_t ParseDurationNs(std::string_view s) {
  const std::string text(s);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v) || v <= 0 || v > 86400) {
    Bad("--duration", s, "seconds, more than 0 and at most 86400");
  }
  return static_cast<uint64_t>(v * 1e9);
}

Format ParseFormat(std::string_view s) {
  if (s == "table") return Format::kTable;
  if (s == "csv") return Format::kCsv;
  if (s == "json") return Format::kJson;
  Bad("--format", s, "table, csv or json");
}

// The options that set how long a test runs; checks that at most one is given.
void AddBudgetOptions(Budget* budget, std::vector<Option>* options) {
  options->push_back({"--duration", "", true, [budget](std::string_view v) {
                        if (budget->iters != 0)
                          throw UsageError("--duration and --iters exclude each other");
                        budget->duration_ns = ParseDurationNs(v);
                      }});
  options->push_back({"--iters", "", true, [budget](std::string_view v) {
                        if (budget->duration_ns != 0)
                          throw UsageError("--duration and --iters exclude each other");
                        budget->iters = ParseUnsigned("--iters", v, 1, UINT64_MAX / 2, false);
                      }});
}

void AddOutputOptions(OutputOptions* output, std::vector<Option>* options) {
  options->push_back(
      {"--format", "", true, [output](std::string_view v) { output->format = ParseFormat(v); }});
  options->push_back({"--label", "", true, [output](std::string_view v) {
                        if (v.empty()) throw UsageError("--label needs a non-empty name");
                        output->meta = {std::string(v), std::string(v)};
                      }});
}

void DefaultBudget(Budget* budget) {
  if (budget->duration_ns == 0 && budget->iters == 0) {
    budget->duration_ns = static_cast<uint64_t>(kDefaultDurationS * 1e9);
  }
}

Option PortOption(uint16_t* port) {
  return {"--port", "-p", true, [port](std::string_view v) {
            *port = static_cast<uint16_t>(ParseUnsigned("--port", v, 1, 65535, false));
          }};
}

[[noreturn]] void NoPositional(std::string_view arg) {
  throw UsageError("unexpected argument '" + std::string(arg) + "'");
}

ServerOptions ParseServer(const std::vector<std::string_view>& args) {
  ServerOptions o;
  bool count_given = false;
  auto set_count = [&](uint64_t n) {
    if (count_given) throw UsageError("--once and --count exclude each other");
    count_given = true;
    o.max_tests = n;
  };
  const std::vector<Option> options = {
      PortOption(&o.port),
      {"--bind", "", true, [&](std::string_view v) { o.bind = std::string(v); }},
      {"--once", "", false, [&](std::string_view) { set_count(1); }},
      {"--count", "", true,
       [&](std::string_view v) { set_count(ParseUnsigned("--count", v, 1, UINT64_MAX, false)); }},
  };
  ParseOptions(args, options, NoPositional);
  return o;
}

ClientOptions ParseClient(const std::vector<std::string_view>& args) {
  ClientOptions o;
  std::vector<Option> options = {
      PortOption(&o.port),
      {"--size", "", true,
       [&](std::string_view v) {
         o.size = static_cast<uint32_t>(ParseUnsigned("--size", v, 1, kMaxMessageSize, true));
       }},
      {"--verify", "", true,
       [&](std::string_view v) {
         if (v == "sampled") {
           o.verify = Verify::kSampled;
         } else if (v == "full") {
           o.verify = Verify::kFull;
         } else {
           Bad("--verify", v, "sampled or full");
         }
       }},
  };
  AddBudgetOptions(&o.budget, &options);
  AddOutputOptions(&o.output, &options);
  ParseOptions(args, options, [&](std::string_view arg) {
    if (o.host.empty()) {
      o.host = std::string(arg);
    } else if (const auto test = TestFromName(arg)) {
      o.tests.push_back(*test);
    } else {
      Bad("test", arg, "tcp_lat or tcp_bw");
    }
  });
  if (o.host.empty()) throw UsageError("client needs a HOST");
  if (o.tests.empty()) throw UsageError("client needs at least one TEST (tcp_lat, tcp_bw)");
  DefaultBudget(&o.budget);
  return o;
}

MemcpyOptions ParseMemcpy(const std::vector<std::string_view>& args) {
  MemcpyOptions o;
  std::vector<Option> options = {
      {"--size", "", true,
       [&](std::string_view v) { o.size = ParseUnsigned("--size", v, 1, 1ull << 32, true); }},
  };
  AddBudgetOptions(&o.budget, &options);
  AddOutputOptions(&o.output, &options);
  ParseOptions(args, options, NoPositional);
  DefaultBudget(&o.budget);
  return o;
}

}  // namespace

Command ParseCommandLine(int argc, char** argv) {
  std::vector<std::string_view> args(argv + 1, argv + argc);
  for (const std::string_view a : args) {
    if (a == "--help" || a == "-h") return HelpCommand{};
  }
  if (args.empty()) throw UsageError("missing subcommand");
  const std::string_view sub = args.front();
  args.erase(args.begin());
  if (sub == "server") return ParseServer(args);
  if (sub == "client") return ParseClient(args);
  if (sub == "memcpy") return ParseMemcpy(args);
  throw UsageError("unknown subcommand '" + std::string(sub) + "'");
}

void PrintUsage(FILE* out) {
  std::fputs(kUsage, out);
}

}  // namespace slipperf
