#include "tools/slip-perf/cli.h"

#include <algorithm>
#include <cstdio>
#include <string_view>

namespace slipperf {
namespace {

Format ParseFormat(std::string_view s) {
  if (s == "table") return Format::kTable;
  if (s == "csv") return Format::kCsv;
  if (s == "json") return Format::kJson;
  Bad("--format", s, "table, csv or json");
}

// The options that set how long a run lasts; checks that at most one is given.
void AddBudgetOptions(Budget* budget, std::vector<Option>* options) {
  options->push_back({"--duration", "", true, [budget](std::string_view v) {
                        if (budget->iters != 0)
                          throw UsageError("--duration and --iters exclude each other");
                        budget->duration_ns = ParseDurationNs("--duration", v);
                      }});
  options->push_back({"--iters", "", true, [budget](std::string_view v) {
                        if (budget->duration_ns != 0)
                          throw UsageError("--duration and --iters exclude each other");
                        budget->iters = ParseUnsigned("--iters", v, 1, UINT64_MAX / 2, false);
                      }});
}

void DefaultBudget(Budget* budget, double seconds) {
  if (budget->duration_ns == 0 && budget->iters == 0) {
    budget->duration_ns = static_cast<uint64_t>(seconds * 1e9);
  }
}

void AddOutputOptions(OutputOptions* output, std::vector<Option>* options) {
  options->push_back(
      {"--format", "", true, [output](std::string_view v) { output->format = ParseFormat(v); }});
  options->push_back({"--label", "", true, [output](std::string_view v) {
                        if (v.empty()) throw UsageError("--label needs a non-empty name");
                        output->meta = {std::string(v), std::string(v)};
                      }});
}

uint32_t ParseCount(std::string_view what, std::string_view v, uint64_t max) {
  return static_cast<uint32_t>(ParseUnsigned(what, v, 1, max, false));
}

void AddSweepOptions(SweepOptions* sweep, std::vector<Option>* options) {
  auto sizes = [sweep](std::string_view v) { sweep->sizes = ParseSizes(v, kMaxMessageSize); };
  options->push_back({"--size", "", true, sizes});
  options->push_back({"--sizes", "", true, sizes});
  options->push_back({"--repeat", "", true, [sweep](std::string_view v) {
                        sweep->repeat = ParseCount("--repeat", v, 1000);
                      }});
  options->push_back({"--streams", "", true, [sweep](std::string_view v) {
                        sweep->streams = ParseCount("--streams", v, kMaxLinks);
                      }});
  options->push_back({"--conns", "", true, [sweep](std::string_view v) {
                        sweep->conns = ParseCount("--conns", v, kMaxLinks);
                      }});
  options->push_back({"--verify", "", true, [sweep](std::string_view v) {
                        if (v == "sampled") {
                          sweep->verify = Verify::kSampled;
                        } else if (v == "full") {
                          sweep->verify = Verify::kFull;
                        } else {
                          Bad("--verify", v, "sampled or full");
                        }
                      }});
  AddBudgetOptions(&sweep->budget, options);
}

Option PortOption(uint16_t* port, uint64_t min) {
  return {"--port", "-p", true, [port, min](std::string_view v) {
            *port = static_cast<uint16_t>(ParseUnsigned("--port", v, min, 65535, false));
          }};
}

Option CpusOption(CpuPair* cpus) {
  return {"--cpus", "", true, [cpus](std::string_view v) {
            const size_t comma = v.find(',');
            if (comma == std::string_view::npos) Bad("--cpus", v, "S,C (two CPU numbers)");
            cpus->server =
                static_cast<int>(ParseUnsigned("--cpus", v.substr(0, comma), 0, 4095, false));
            cpus->client =
                static_cast<int>(ParseUnsigned("--cpus", v.substr(comma + 1), 0, 4095, false));
          }};
}

[[noreturn]] void NoPositional(std::string_view arg) {
  throw UsageError("unexpected argument '" + std::string(arg) + "'");
}

// "tcp_lat" with prefix "tcp" -> kLat; only the kinds in `allowed`.
std::optional<TestId> TestNamed(std::string_view name, std::string_view prefix,
                                const std::vector<TestId>& allowed) {
  if (!name.starts_with(prefix) || name.substr(prefix.size(), 1) != "_") return std::nullopt;
  const auto test = TestFromKind(name.substr(prefix.size() + 1));
  if (!test || std::find(allowed.begin(), allowed.end(), *test) == allowed.end()) {
    return std::nullopt;
  }
  return test;
}

std::string TestNames(std::string_view prefix, const std::vector<TestId>& allowed) {
  std::string names;
  for (const TestId t : allowed) {
    names += (names.empty() ? "" : ", ") + std::string(prefix) + "_" + TestKind(t);
  }
  return names;
}

const std::vector<TestId> kSocketTests = {TestId::kLat, TestId::kBw, TestId::kRr, TestId::kCrr};
// A native link is built in memory, not connected: connection setup (crr) is not a test.
const std::vector<TestId> kNativeTests = {TestId::kLat, TestId::kBw, TestId::kRr};

// Positional test names of the client and native subcommands.
void AddTest(std::string_view arg, std::string_view prefix, const std::vector<TestId>& allowed,
             SweepOptions* sweep) {
  const auto test = TestNamed(arg, prefix, allowed);
  if (!test) Bad("test", arg, TestNames(prefix, allowed));
  sweep->tests.push_back(*test);
}

void RequireTests(const SweepOptions& sweep, std::string_view prefix,
                  const std::vector<TestId>& allowed) {
  if (sweep.tests.empty()) {
    throw UsageError("needs at least one TEST (" + TestNames(prefix, allowed) + ")");
  }
}

ServerOptions ParseServer(const std::vector<std::string_view>& args) {
  ServerOptions o;
  bool count_given = false;
  auto set_count = [&](uint64_t n) {
    if (count_given) throw UsageError("--once and --count exclude each other");
    count_given = true;
    o.max_sessions = n;
  };
  const std::vector<Option> options = {
      PortOption(&o.port, 0),
      {"--bind", "", true, [&](std::string_view v) { o.bind = std::string(v); }},
      {"--once", "", false, [&](std::string_view) { set_count(1); }},
      {"--reuseport", "", false, [&](std::string_view) { o.reuseport = true; }},
      {"--count", "", true,
       [&](std::string_view v) { set_count(ParseUnsigned("--count", v, 1, UINT64_MAX, false)); }},
  };
  ParseOptions(args, options, NoPositional);
  return o;
}

ClientOptions ParseClient(const std::vector<std::string_view>& args) {
  ClientOptions o;
  std::vector<Option> options = {PortOption(&o.port, 1)};
  AddSweepOptions(&o.sweep, &options);
  AddOutputOptions(&o.output, &options);
  ParseOptions(args, options, [&](std::string_view arg) {
    if (o.host.empty()) {
      o.host = std::string(arg);
    } else {
      AddTest(arg, "tcp", kSocketTests, &o.sweep);
    }
  });
  if (o.host.empty()) throw UsageError("client needs a HOST");
  RequireTests(o.sweep, "tcp", kSocketTests);
  DefaultBudget(&o.sweep.budget, kDefaultDurationS);
  return o;
}

NativeOptions ParseNative(const std::vector<std::string_view>& args) {
  NativeOptions o;
  o.output.meta = {"shm-native", "shm-native"};
  std::vector<Option> options = {CpusOption(&o.cpus)};
  AddSweepOptions(&o.sweep, &options);
  AddOutputOptions(&o.output, &options);
  ParseOptions(args, options,
               [&](std::string_view arg) { AddTest(arg, "shm", kNativeTests, &o.sweep); });
  RequireTests(o.sweep, "shm", kNativeTests);
  DefaultBudget(&o.sweep.budget, kDefaultDurationS);
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
  DefaultBudget(&o.budget, kDefaultDurationS);
  return o;
}

CompareOptions ParseCompare(const std::vector<std::string_view>& args) {
  CompareOptions o;
  o.sweep.repeat = kDefaultCompareRepeat;
  o.sweep.tests = {TestId::kLat, TestId::kBw};
  o.sweep.sizes = ParseSizes("1:4M", kMaxMessageSize);
  std::vector<Option> options = {
      PortOption(&o.port, 1),
      CpusOption(&o.cpus),
      {"--tests", "", true,
       [&](std::string_view v) {
         o.sweep.tests.clear();
         for (const std::string_view kind : SplitList(v)) {
           const auto test = TestFromKind(kind);
           if (!test) Bad("--tests", v, "a list of lat, bw, rr, crr");
           o.sweep.tests.push_back(*test);
         }
       }},
      {"--transports", "", true,
       [&](std::string_view v) {
         o.transports.clear();
         for (const std::string_view t : SplitList(v)) {
           if (t != "tcp" && t != "shm" && t != "shm-native") {
             Bad("--transports", v, "a list of tcp, shm, shm-native");
           }
           o.transports.emplace_back(t);
         }
       }},
      {"--out", "", true,
       [&](std::string_view v) {
         if (v.empty()) throw UsageError("--out needs a directory");
         o.out_dir = std::string(v);
       }},
      {"--remote", "", true, [&](std::string_view v) { o.remote = std::string(v); }},
  };
  AddSweepOptions(&o.sweep, &options);
  ParseOptions(args, options, NoPositional);
  DefaultBudget(&o.sweep.budget, kDefaultCompareDurationS);
  if (o.transports.empty()) {
    o.transports = {"tcp", "shm"};
    if (o.remote.empty()) o.transports.emplace_back("shm-native");
  }
  if (!o.remote.empty() &&
      std::find(o.transports.begin(), o.transports.end(), "shm-native") != o.transports.end()) {
    throw UsageError("--remote runs no native tests: they need both ends on this host");
  }
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
  if (sub == "native") return ParseNative(args);
  if (sub == "compare") return ParseCompare(args);
  if (sub == "memcpy") return ParseMemcpy(args);
  throw UsageError("unknown subcommand '" + std::string(sub) + "'");
}

std::vector<std::string> SweepArguments(const SweepOptions& sweep) {
  std::string sizes;
  for (const uint32_t size : sweep.sizes)
    sizes += (sizes.empty() ? "" : ",") + std::to_string(size);
  std::vector<std::string> args;
  if (!sizes.empty()) args.insert(args.end(), {"--sizes", sizes});
  if (sweep.budget.iters != 0) {
    args.insert(args.end(), {"--iters", std::to_string(sweep.budget.iters)});
  } else {
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%.9g",
                  static_cast<double>(sweep.budget.duration_ns) * 1e-9);
    args.insert(args.end(), {"--duration", seconds});
  }
  args.insert(args.end(),
              {"--repeat", std::to_string(sweep.repeat), "--streams", std::to_string(sweep.streams),
               "--conns", std::to_string(sweep.conns), "--verify", VerifyName(sweep.verify)});
  return args;
}

}  // namespace slipperf
