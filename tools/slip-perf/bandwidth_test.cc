// tcp_bw: one stream of `size`-byte writes from the client. The server checks the bytes
// against the stream pattern as they arrive (sampled by default, in full with --verify full)
// and reports the byte count and the first mismatch; the client checks both. The rate is the bytes
// written while measuring over the time from the start of measuring to the server's report, which
// includes draining what was in flight.
#include <array>
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/slip-perf/budget.h"
#include "tools/slip-perf/clock.h"
#include "tools/slip-perf/net.h"
#include "tools/slip-perf/pattern.h"
#include "tools/slip-perf/tests.h"

namespace slipperf {

Result RunBandwidthClient(int fd, const TestHeader& h) {
  const Pattern pattern(h.seed, h.size);
  uint64_t offset = 0;
  auto write_once = [&] {
    SendAll(fd, pattern.At(offset), h.size);
    offset += h.size;
  };

  for (Phase warmup(WarmupOf(h.budget)); !warmup.Done(); warmup.Tick()) write_once();

  const uint64_t measured_from = offset;
  Phase measure(h.budget);
  for (; !measure.Done(); measure.Tick()) write_once();
  ShutdownWrite(fd);

  std::array<uint8_t, kReportBytes> wire;
  if (!RecvAll(fd, wire.data(), wire.size())) {
    throw std::runtime_error("server closed without a report");
  }
  const uint64_t end = NowNs();
  ExpectEof(fd);

  const BwReport report = DecodeReport(wire);
  if (report.status != Status::kOk) {
    throw std::runtime_error("server: " + std::string(StatusText(report.status)) +
                             " (first bad byte at stream offset " +
                             std::to_string(report.first_bad_offset) + ")");
  }
  if (report.bytes != offset) {
    throw std::runtime_error("sent " + std::to_string(offset) + " bytes, server got " +
                             std::to_string(report.bytes));
  }

  Result r;
  r.test = TestName(h.test);
  r.size = h.size;
  r.iters = measure.count();
  r.bytes = offset - measured_from;
  r.seconds = static_cast<double>(end - measure.start_ns()) * 1e-9;
  r.bytes_per_s = static_cast<double>(r.bytes) / r.seconds;
  return r;
}

std::string ServeBandwidth(int fd, const TestHeader& h) {
  const Pattern pattern(h.seed, h.size);
  std::vector<uint8_t> buf(h.size);
  auto matches = [&](uint64_t offset, size_t n) {
    return h.verify == Verify::kFull ? pattern.Matches(offset, buf.data(), n)
                                     : pattern.MatchesSampled(offset, buf.data(), n);
  };
  BwReport report;
  report.first_bad_offset = kNoMismatch;
  for (;;) {
    const size_t n = RecvSome(fd, buf.data(), buf.size());
    if (n == 0) break;
    if (report.status == Status::kOk && !matches(report.bytes, n)) {
      report.status = Status::kContentMismatch;
      report.first_bad_offset = report.bytes + pattern.FirstMismatch(report.bytes, buf.data(), n);
    }
    report.bytes += n;
  }
  const auto wire = EncodeReport(report);
  SendAll(fd, wire.data(), wire.size());
  const std::string line = "received " + std::to_string(report.bytes) + " bytes, ";
  if (report.status != Status::kOk) {
    throw std::runtime_error(line + "content MISMATCH at stream offset " +
                             std::to_string(report.first_bad_offset));
  }
  return line + "content ok (" + VerifyName(h.verify) + " check)";
}

}  // namespace slipperf
