// The client side of one test: the request, the data links, one thread per link (or per
// connecting thread for crr) lined up by a Gate, the marks around the measured interval,
// and the server's report.
#include <algorithm>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tools/slip-perf/cpu.h"
#include "tools/slip-perf/first_error.h"
#include "tools/slip-perf/gate.h"
#include "tools/slip-perf/session.h"
#include "tools/slip-perf/tests.h"

namespace slipperf {
namespace {

using Workers = std::vector<std::unique_ptr<ClientWorker>>;

Workers OpenWorkers(Connector& connector, const TestRequest& r) {
  Workers workers;
  for (uint32_t i = 0; i < r.links; ++i) {
    if (r.test == TestId::kCrr) {
      workers.push_back(MakeConnectWorker(connector, r, i));
      continue;
    }
    std::unique_ptr<Link> link = connector.Open();
    SendMessage(*link, EncodeJoin({.index = i, .seed = r.seed}));
    workers.push_back(r.test == TestId::kBw ? MakeStreamWorker(std::move(link), r, i)
                                            : MakeEchoWorker(std::move(link), r, i));
  }
  return workers;
}

// The interval between the two openings of the gate, on the client's clock and CPU.
struct Interval {
  CpuSample begin;
  CpuSample end;
};

Result Tabulate(const TestRequest& r, const Workers& workers, const Interval& interval,
                const ServerReport& report) {
  Result result;
  result.size = r.size;
  result.links = r.links;
  Histogram ns;
  uint64_t end_ns = interval.begin.wall_ns;
  for (const auto& w : workers) {
    const Tally& t = w->tally();
    result.iters += t.iters;
    result.bytes += t.bytes;
    end_ns = std::max(end_ns, t.end_ns);
    ns.Merge(t.ns);
  }
  result.seconds = static_cast<double>(end_ns - interval.begin.wall_ns) * 1e-9;
  const double per_second = result.seconds > 0 ? 1 / result.seconds : 0;
  if (r.test == TestId::kBw) {
    result.bytes_per_s = static_cast<double>(result.bytes) * per_second;
    result.figure = Figure::kGbitS;
  } else {
    // Ping-pong latency is one-way (round trip / 2), as sockperf and qperf report it; a
    // transaction's latency is all of it.
    result.latency = Summarize(ns, r.test == TestId::kLat ? 0.5 : 1.0);
    result.trans_per_s = static_cast<double>(result.iters) * per_second;
    result.figure = r.test == TestId::kLat ? Figure::kP50Us : Figure::kTransS;
  }
  result.cpu_client = CpuPercent(interval.begin, interval.end);
  result.cpu_server = CpuPercent(report.cpu_ns, report.wall_ns);
  const double figure = FigureValue(result);
  result.spread = {figure, figure, figure, 1};
  return result;
}

}  // namespace

Result RunTest(Link& control, Connector& connector, const TestRequest& r) {
  SendMessage(control, EncodeRequest(r));
  const Status ack = DecodeAck(RecvMessage<kAckBytes>(control, "an answer to the test request"));
  if (ack != Status::kOk) {
    throw std::runtime_error(std::string("server refused the test: ") + StatusText(ack));
  }
  const Workers workers = OpenWorkers(connector, r);

  Interval interval;
  Gate gate(workers.size() + 1, [&](uint64_t opening) {
    (opening == 0 ? interval.begin : interval.end) = SampleCpu();
  });
  FirstError failure;
  {
    std::vector<std::jthread> threads;
    for (const auto& w : workers) {
      threads.emplace_back([&, worker = w.get()] {
        try {
          worker->Warmup(WarmupOf(r.budget));
          gate.Arrive();
          worker->Measure(r.budget, interval.begin.wall_ns);
          gate.Arrive();
          worker->Finish();
        } catch (const GateBroken&) {
          // Another thread failed first and recorded why.
        } catch (...) {
          failure.Record();
          gate.Break();
        }
      });
    }
    try {
      gate.Arrive();
      SendMessage(control, EncodeMark({.kind = MarkKind::kBegin}));
      gate.Arrive();
      uint64_t transactions = 0;
      for (const auto& w : workers) transactions += w->tally().warmup_iters + w->tally().iters;
      SendMessage(control, EncodeMark({.kind = MarkKind::kEnd, .count = transactions}));
    } catch (...) {
      failure.Record();  // kept only if no worker failed first (then this is GateBroken)
      gate.Break();
      for (const auto& w : workers) w->Abort();
    }
  }  // the threads are joined here
  failure.RethrowIfAny();
  const ServerReport report =
      DecodeReport<ServerReport>(RecvMessage<kReportBytes>(control, "its report"));
  if (report.status != Status::kOk) {
    throw std::runtime_error(std::string("server: ") + StatusText(report.status) +
                             " (see its log)");
  }
  return Tabulate(r, workers, interval, report);
}

}  // namespace slipperf
