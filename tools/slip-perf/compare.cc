// slip-perf compare: runs one sweep plain, under slip-run and natively, each as child
// processes of this one (so the preload applies to them and not to this process), collects
// their CSV, checks in slip-run's stats which transport the connections used, and writes
// the side-by-side table, CSV, JSON and SVG.
#include "tools/slip-perf/compare.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "tools/slip-perf/clock.h"
#include "tools/slip-perf/commands.h"
#include "tools/slip-perf/compare_setup.h"
#include "tools/slip-perf/spawn.h"
#include "tools/slip-perf/stats_file.h"

namespace slipperf {
namespace {

constexpr uint64_t kListenTimeoutMs = 15'000;
constexpr uint64_t kServerExitMs = 10'000;
constexpr uint64_t kInterruptedExitMs = 5'000;
constexpr uint64_t kIterationRunsTimeoutMs = 3'600'000;

class CompareRun {
 public:
  explicit CompareRun(const CompareOptions& o) : o_(o), raw_(o.out_dir + "/raw/") {}

  int Run() {
    MakeDirectories(o_.out_dir + "/raw");
    DescribeSettings(o_, &c_);
    std::printf("slip-perf compare: %s\n  raw outputs in %s\n\n", c_.settings.c_str(),
                raw_.c_str());
    for (const std::string& t : o_.transports) {
      const uint64_t started = NowNs();
      std::printf("  %-11s ", t.c_str());
      std::fflush(stdout);
      try {
        if (t == "shm-native") {
          RunNative();
        } else {
          RunSockets(t == "shm");
        }
        std::printf("done (%.1f s)\n", static_cast<double>(NowNs() - started) * 1e-9);
      } catch (const std::exception& e) {
        std::printf("FAILED: %s\n", e.what());
        c_.warnings.push_back(t + " failed: " + e.what());
      }
      std::fflush(stdout);
    }
    std::printf("\n");
    PrintComparison(stdout, c_);
    const std::string base = o_.out_dir + "/compare.";
    WriteComparisonCsv(base + "csv", c_);
    WriteComparisonJson(base + "json", c_);
    WriteComparisonSvg(base + "svg", c_);
    std::printf("\nwritten: %scsv, %sjson, %ssvg\n", base.c_str(), base.c_str(), base.c_str());
    return c_.warnings.empty() ? 0 : 1;
  }

 private:
  // The child's test names: tcp_lat ... for the socket API, shm_lat ... natively.
  std::vector<std::string> TestArgs(const std::string& prefix, bool native) const {
    std::vector<std::string> names;
    for (const TestId t : o_.sweep.tests) {
      if (native && t == TestId::kCrr) continue;  // a native link is not connected
      names.push_back(prefix + "_" + TestKind(t));
    }
    return names;
  }

  uint64_t TimeoutMs() const {
    const SweepOptions& s = o_.sweep;
    if (s.budget.iters != 0) return kIterationRunsTimeoutMs;
    const double runs = static_cast<double>(s.tests.size() * s.sizes.size() * s.repeat);
    const double per_run_ms = static_cast<double>(s.budget.duration_ns) * 1.1e-6 + 500;
    return static_cast<uint64_t>(runs * per_run_ms * 2) + 60'000;
  }

  // Runs a child to its end; throws, naming its log, when it fails.
  void RunToEnd(Child& child, const std::string& what, const std::string& log) {
    const int status = child.Wait(TimeoutMs());
    if (status == 0) return;
    if (status < 0) {
      child.Signal(SIGINT);
      if (child.Wait(kInterruptedExitMs) < 0) child.Signal(SIGKILL);
      throw std::runtime_error(what + " timed out (see " + log + ")");
    }
    throw std::runtime_error(what + " exited with status " + std::to_string(status) + ": " +
                             LastLine(log));
  }

  static std::string LastLine(const std::string& path) {
    std::ifstream in(path);
    std::string line, last = "(no message)";
    while (std::getline(in, line)) {
      if (!line.empty()) last = line;
    }
    return last;
  }

  // Waits for the server's "listening on ADDR:PORT" line.
  uint16_t AwaitPort(Child& server, const std::string& log) {
    const uint64_t deadline = NowNs() + kListenTimeoutMs * 1'000'000;
    for (;;) {
      std::ifstream in(log);
      std::string line;
      while (std::getline(in, line)) {
        const size_t at = line.find("listening on ");
        if (at != std::string::npos)
          return static_cast<uint16_t>(std::stoul(line.substr(line.rfind(':') + 1)));
      }
      if (!server.Running()) throw std::runtime_error("the server exited: " + LastLine(log));
      if (NowNs() > deadline)
        throw std::runtime_error("the server did not listen (see " + log + ")");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // tcp: both ends plain. shm: both ends under slip-run, named after the transport their
  // connections used. With --remote, the client only: the server runs there.
  void RunSockets(bool preload) {
    const std::string mode = preload ? "slip-run" : "tcp";
    const std::string stats = raw_ + mode + ".stats.jsonl";
    std::remove(stats.c_str());
    std::vector<std::string> prefix;
    if (preload) {
      const std::string slip_run = SiblingPath("slip-run");
      if (access(slip_run.c_str(), X_OK) != 0)
        throw std::runtime_error(slip_run + " not found: build it first");
      prefix = {slip_run, "--stats=" + stats, "--"};
      // What is compared is the transport: tcp_crr's connections are accelerated however
      // short, unless the caller chose otherwise (the default policy would carry them plain,
      // core/short_conns.h).
      setenv("SLIP_SHORT_CONNS", "accelerate", /*overwrite=*/0);
    }
    const std::string self = SelfPath();
    std::optional<Child> server;
    std::string host = o_.remote;
    uint16_t port = o_.port;
    const std::string server_log = raw_ + mode + ".server.log";
    if (o_.remote.empty()) {
      ChildSpec spec{prefix, "", server_log, o_.cpus.server};
      spec.argv.insert(spec.argv.end(),
                       {self, "server", "--bind", "127.0.0.1", "-p", "0", "--once"});
      server.emplace(spec);
      port = AwaitPort(*server, server_log);
      host = "127.0.0.1";
    }
    const std::string csv = raw_ + mode + ".csv";
    const std::string client_log = raw_ + mode + ".client.log";
    ChildSpec spec{prefix, csv, client_log, o_.cpus.client};
    spec.argv.insert(spec.argv.end(), {self, "client", host, "-p", std::to_string(port)});
    for (const std::string& a : TestArgs("tcp", false)) spec.argv.push_back(a);
    for (const std::string& a : SweepArguments(o_.sweep)) spec.argv.push_back(a);
    spec.argv.insert(spec.argv.end(), {"--format", "csv", "--label", mode});
    {
      Child client(spec);
      try {
        RunToEnd(client, "the client", client_log);
      } catch (...) {
        if (server) StopServer(*server);
        throw;
      }
    }
    if (server) {
      if (server->Wait(kServerExitMs) != 0) StopServer(*server);
    }
    Collect(csv, preload ? NameFromStats(stats) : "tcp");
  }

  static void StopServer(Child& server) {
    server.Signal(SIGINT);
    if (server.Wait(kInterruptedExitMs) < 0) server.Signal(SIGKILL);
  }

  // The preload column is named after the transport its connections used ("shm" on one
  // host); anything else is flagged, as its figures are then (partly) kernel TCP.
  std::string NameFromStats(const std::string& path) {
    const StatsSummary stats = ReadStats(path);
    const std::string only = stats.OnlyTransport();
    const bool accelerated = !only.empty() && only != "tcp" && only.find('(') == std::string::npos;
    const std::string name = accelerated ? only : "slip-run";
    const std::string sides = o_.remote.empty() ? "both ends" : "the client";
    c_.how.push_back(name + ": " + sides + " under slip-run; connections, each end counted by " +
                     "its process: " + stats.Describe());
    c_.how_json.push_back("{\"transport\":" + JsonEscape(name) +
                          ",\"how\":" + JsonEscape(sides + " under slip-run") +
                          ",\"connections\":" + JsonEscape(stats.Describe()) +
                          ",\"processes\":" + std::to_string(stats.processes) +
                          ",\"accelerated\":" + (accelerated ? "true" : "false") + "}");
    if (!accelerated) {
      c_.warnings.push_back("not every connection under slip-run was accelerated (" +
                            stats.Describe() + "): the " + name +
                            " figures are (partly) kernel TCP");
    } else if (o_.remote.empty() && only != "shm") {
      c_.warnings.push_back("connections under slip-run on one host used " + only + ", not shm");
    }
    if (stats.dropped != 0) {
      c_.warnings.push_back(std::to_string(stats.dropped) +
                            " connections were not recorded in slip-run's stats: their "
                            "transport is unknown");
    }
    return name;
  }

  void RunNative() {
    slip::Config config;
    std::string error;
    if (!slip::ParseConfigFromEnv(&config, &error)) throw std::runtime_error(error);
    const std::string csv = raw_ + "shm-native.csv";
    const std::string log = raw_ + "shm-native.log";
    ChildSpec spec{{SelfPath(), "native"}, csv, log, -1};
    for (const std::string& a : TestArgs("shm", true)) spec.argv.push_back(a);
    for (const std::string& a : SweepArguments(o_.sweep)) spec.argv.push_back(a);
    if (o_.cpus.server >= 0) {
      spec.argv.insert(spec.argv.end(), {"--cpus", std::to_string(o_.cpus.server) + "," +
                                                       std::to_string(o_.cpus.client)});
    }
    spec.argv.insert(spec.argv.end(), {"--format", "csv"});
    Child native(spec);
    RunToEnd(native, "slip-perf native", log);
    const std::string how = "a forked pair on shm rings through slip::Stream, no sockets; ring " +
                            HumanSize(config.ring_size) + ", spin " +
                            std::to_string(config.spin_us) + " us";
    c_.how.push_back("shm-native: " + how);
    c_.how_json.push_back("{\"transport\":\"shm-native\",\"how\":" + JsonEscape(how) + "}");
    Collect(csv, "shm-native");
  }

  // Adds a child's rows under `transport`, with `test` reduced to the kind ("tcp_lat" and
  // "shm_lat" are both "lat").
  void Collect(const std::string& path, const std::string& transport) {
    CsvTable table = ParseCsv(ReadFile(path));
    if (table.rows.empty()) throw std::runtime_error(path + " has no results");
    if (c_.columns.empty()) {
      c_.columns = {"transport", "test", "size"};
      for (const std::string& col : table.columns) {
        if (col != "label" && col != "transport" && col != "test" && col != "size") {
          c_.columns.push_back(col);
        }
      }
    }
    for (CsvRow& row : table.rows) {
      const std::string& test = row["test"];
      row["test"] = test.substr(test.find('_') + 1);
      row["transport"] = transport;
      row.erase("label");
      c_.rows.push_back(std::move(row));
    }
    c_.transports.push_back(transport);
  }

  const CompareOptions& o_;
  const std::string raw_;
  Comparison c_;
};

}  // namespace

int RunCompare(const CompareOptions& options) {
  DropPreloadFromEnvironment();
  return CompareRun(options).Run();
}

}  // namespace slipperf
