// bw: one stream of `size`-byte writes from the client on each link. The server checks the
// bytes against the link's stream pattern as they arrive (sampled by default, in full with
// --verify full) and reports the byte count and the first mismatch; the client checks both.
// A link's measured time runs from the test's start to the server's report, so data still
// in flight at the end counts only once it was delivered.
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/slip-perf/clock.h"
#include "tools/slip-perf/pattern.h"
#include "tools/slip-perf/tests.h"

namespace slipperf {
namespace {

class StreamWorker final : public ClientWorker {
 public:
  StreamWorker(std::unique_ptr<Link> link, const TestRequest& r, uint32_t index)
      : link_(std::move(link)), pattern_(r.seed + index, r.size), size_(r.size) {}

  void Warmup(const Budget& budget) override {
    Phase warmup(budget);
    for (; !warmup.Done(); warmup.Tick()) WriteOnce();
    tally_.warmup_iters = warmup.count();
  }

  void Measure(const Budget& budget, uint64_t start_ns) override {
    const uint64_t measured_from = offset_;
    Phase measure(budget, start_ns);
    for (; !measure.Done(); measure.Tick()) WriteOnce();
    link_->ShutdownWrite();
    const BwReport report =
        DecodeReport<BwReport>(RecvMessage<kReportBytes>(*link_, "its bandwidth report"));
    tally_.end_ns = NowNs();
    if (report.status != Status::kOk) {
      throw std::runtime_error("server: " + std::string(StatusText(report.status)) +
                               " (first bad byte at stream offset " +
                               std::to_string(report.first_bad_offset) + ")");
    }
    if (report.bytes != offset_) {
      throw std::runtime_error("sent " + std::to_string(offset_) + " bytes, server got " +
                               std::to_string(report.bytes));
    }
    tally_.iters = measure.count();
    tally_.bytes = offset_ - measured_from;
  }

  void Finish() override { ExpectEof(*link_); }

  void Abort() noexcept override { link_->Abort(); }

 private:
  void WriteOnce() {
    SendAll(*link_, pattern_.At(offset_), size_);
    offset_ += size_;
  }

  std::unique_ptr<Link> link_;
  Pattern pattern_;
  uint32_t size_;
  uint64_t offset_ = 0;
};

}  // namespace

std::unique_ptr<ClientWorker> MakeStreamWorker(std::unique_ptr<Link> link, const TestRequest& r,
                                               uint32_t index) {
  return std::make_unique<StreamWorker>(std::move(link), r, index);
}

uint64_t ServeStream(Link& link, const TestRequest& r, uint32_t index) {
  const Pattern pattern(r.seed + index, r.size);
  std::vector<uint8_t> buf(r.size);
  auto matches = [&](uint64_t offset, size_t n) {
    return r.verify == Verify::kFull ? pattern.Matches(offset, buf.data(), n)
                                     : pattern.MatchesSampled(offset, buf.data(), n);
  };
  BwReport report;
  report.first_bad_offset = kNoMismatch;
  for (;;) {
    const size_t n = link.RecvSome(buf.data(), buf.size());
    if (n == 0) break;
    if (report.status == Status::kOk && !matches(report.bytes, n)) {
      report.status = Status::kContentMismatch;
      report.first_bad_offset = report.bytes + pattern.FirstMismatch(report.bytes, buf.data(), n);
    }
    report.bytes += n;
  }
  SendMessage(link, EncodeReport(report));
  if (report.status != Status::kOk) {
    throw std::runtime_error("received " + std::to_string(report.bytes) +
                             " bytes, content MISMATCH at stream offset " +
                             std::to_string(report.first_bad_offset));
  }
  return report.bytes;
}

}  // namespace slipperf
