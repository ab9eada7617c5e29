// The server side of a session: each test's request, its data links served on one thread
// each (crr: `links` threads accepting connections until the client's count is served),
// the marks around the measured interval, and the report.
#include <atomic>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tools/slip-perf/clock.h"
#include "tools/slip-perf/cpu.h"
#include "tools/slip-perf/first_error.h"
#include "tools/slip-perf/net.h"
#include "tools/slip-perf/session.h"
#include "tools/slip-perf/tests.h"

namespace slipperf {
namespace {

// How long the client may take to open its data links, and, for crr, how long its last
// connections may take to reach the server after the end mark.
constexpr uint64_t kLinkTimeoutNs = 10'000'000'000;

using Links = std::vector<std::unique_ptr<Link>>;

Links AcceptJoins(Acceptor& acceptor, const TestRequest& r) {
  const uint64_t deadline = NowNs() + kLinkTimeoutNs;
  Links links(r.links);
  for (uint32_t n = 0; n < r.links; ++n) {
    std::unique_ptr<Link> link = acceptor.Accept([&] { return NowNs() > deadline; });
    if (!link) throw std::runtime_error("the client did not open its data links");
    const auto join = DecodeJoin(RecvMessage<kJoinBytes>(*link, "a join"));
    if (!join || join->seed != r.seed || join->index >= r.links || links[join->index]) {
      throw std::runtime_error(StatusText(Status::kBadJoin));
    }
    links[join->index] = std::move(link);
  }
  return links;
}

Mark ExpectMark(Link& control, MarkKind kind) {
  const auto mark = DecodeMark(RecvMessage<kMarkBytes>(control, "a mark"));
  if (!mark || mark->kind != kind) throw std::runtime_error("protocol error: expected a mark");
  return *mark;
}

struct Outcome {
  bool ok = true;
  std::string line;  // for the log
};

// Serves one test whose request was acknowledged. Throws when the session cannot go on;
// a failure on a data link fails the test, not the session.
class TestServer {
 public:
  TestServer(Link& control, Acceptor& acceptor, const TestRequest& r)
      : control_(control), acceptor_(acceptor), r_(r) {}

  Outcome Run() {
    if (r_.test != TestId::kCrr) links_ = AcceptJoins(acceptor_, r_);
    CpuSample begin, end;
    {
      std::vector<std::jthread> threads;
      for (uint32_t i = 0; i < r_.links; ++i) threads.emplace_back([this, i] { ServeLink(i); });
      try {
        ExpectMark(control_, MarkKind::kBegin);
        begin = SampleCpu();
        const Mark last = ExpectMark(control_, MarkKind::kEnd);
        end = SampleCpu();
        if (r_.test == TestId::kCrr) AwaitTransactions(last.count);
      } catch (...) {
        StopAll();
        throw;  // after the threads are joined
      }
      stop_ = true;
    }
    ServerReport report;
    report.status = failure_.failed() ? Status::kTestFailed : Status::kOk;
    report.cpu_ns = end.cpu_ns - begin.cpu_ns;
    report.wall_ns = end.wall_ns - begin.wall_ns;
    SendMessage(control_, EncodeReport(report));
    if (failure_.failed()) return {false, "error: " + failure_.What()};
    return {true, Summary()};
  }

 private:
  void ServeLink(uint32_t i) {
    try {
      switch (r_.test) {
        case TestId::kLat:
        case TestId::kRr:
          served_ += ServeEchoes(*links_[i], r_.size);
          links_[i]->ShutdownWrite();  // the client's end of stream, as a close would be
          break;
        case TestId::kBw:
          served_ += ServeStream(*links_[i], r_, i);
          links_[i]->ShutdownWrite();
          break;
        case TestId::kCrr:
          ServeConnections();
          break;
      }
    } catch (...) {
      failure_.Record();
    }
  }

  void ServeConnections() {
    std::vector<uint8_t> buffer(r_.size);
    while (auto link = acceptor_.Accept([this] { return stop_.load(); })) {
      ServeTransaction(*link, buffer);
      ++served_;
    }
  }

  // The client counted its transactions once they were complete, and a transaction is
  // complete on the client once the server closed; the server's count is raised just after.
  void AwaitTransactions(uint64_t count) {
    const uint64_t deadline = NowNs() + kLinkTimeoutNs;
    while (served_ < count && !failure_.failed()) {
      if (NowNs() > deadline) {
        throw std::runtime_error("served " + std::to_string(served_) + " of the client's " +
                                 std::to_string(count) + " connections");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  void StopAll() noexcept {
    stop_ = true;
    for (const auto& link : links_) {
      if (link) link->Abort();
    }
  }

  std::string Summary() const {
    const std::string on = " on " + std::to_string(r_.links) + " link(s)";
    switch (r_.test) {
      case TestId::kLat:
      case TestId::kRr:
        return "echoed " + std::to_string(served_) + " messages" + on;
      case TestId::kBw:
        return "received " + std::to_string(served_) + " bytes" + on + ", content ok (" +
               VerifyName(r_.verify) + " check)";
      case TestId::kCrr:
        return "served " + std::to_string(served_) + " connections";
    }
    return "";
  }

  Link& control_;
  Acceptor& acceptor_;
  const TestRequest r_;
  Links links_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> served_{0};
  FirstError failure_;
};

}  // namespace

uint64_t ServeSession(Link& control, Acceptor& acceptor, const std::string& who, bool verbose) {
  uint64_t failed = 0;
  for (;;) {
    std::array<uint8_t, kRequestBytes> wire;
    if (!RecvAll(control, wire.data(), wire.size())) return failed;
    TestRequest r;
    const Status status = DecodeRequest(wire, &r);
    SendMessage(control, EncodeAck(status));
    if (status != Status::kOk) {
      std::fprintf(stderr, "%s: refused a test: %s\n", who.c_str(), StatusText(status));
      ++failed;
      continue;
    }
    const std::string what = std::string(TestKind(r.test)) + " size " + std::to_string(r.size);
    Outcome outcome;
    try {
      outcome = TestServer(control, acceptor, r).Run();
    } catch (const Interrupted&) {
      throw;
    } catch (const std::exception& e) {
      throw std::runtime_error(what + ": " + e.what());
    }
    if (!outcome.ok) ++failed;
    if (verbose || !outcome.ok) {
      std::fprintf(stderr, "%s: %s: %s\n", who.c_str(), what.c_str(), outcome.line.c_str());
    }
  }
}

}  // namespace slipperf
