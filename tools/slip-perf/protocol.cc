#include "tools/slip-perf/protocol.h"

namespace slipperf {
namespace {

template <typename T>
void Put(uint8_t* p, T v) {
  for (size_t i = 0; i < sizeof(T); ++i)
    p[i] = static_cast<uint8_t>(v >> (8 * (sizeof(T) - 1 - i)));
}

template <typename T>
T Get(const uint8_t* p) {
  T v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>((v << 8) | p[i]);
  return v;
}

}  // namespace

std::optional<TestId> TestFromName(std::string_view name) {
  if (name == "tcp_lat") return TestId::kTcpLat;
  if (name == "tcp_bw") return TestId::kTcpBw;
  return std::nullopt;
}

const char* TestName(TestId test) {
  switch (test) {
    case TestId::kTcpLat:
      return "tcp_lat";
    case TestId::kTcpBw:
      return "tcp_bw";
  }
  return "unknown";
}

const char* StatusText(Status status) {
  switch (status) {
    case Status::kOk:
      return "ok";
    case Status::kBadMagic:
      return "not a slip-perf client (bad magic)";
    case Status::kBadVersion:
      return "protocol version mismatch";
    case Status::kUnknownTest:
      return "unknown test";
    case Status::kBadSize:
      return "message size out of range";
    case Status::kContentMismatch:
      return "received bytes differ from what was sent";
    case Status::kBadVerify:
      return "unknown verify mode";
  }
  return "unknown status";
}

const char* VerifyName(Verify verify) {
  return verify == Verify::kFull ? "full" : "sampled";
}

// Layout: magic u32 | version u16 | test u16 | size u32 | verify u32 | duration_ns u64 |
// iters u64 | seed u64.
std::array<uint8_t, kHeaderBytes> EncodeHeader(const TestHeader& h) {
  std::array<uint8_t, kHeaderBytes> b{};
  Put<uint32_t>(&b[0], kMagic);
  Put<uint16_t>(&b[4], kVersion);
  Put<uint16_t>(&b[6], static_cast<uint16_t>(h.test));
  Put<uint32_t>(&b[8], h.size);
  Put<uint32_t>(&b[12], static_cast<uint32_t>(h.verify));
  Put<uint64_t>(&b[16], h.budget.duration_ns);
  Put<uint64_t>(&b[24], h.budget.iters);
  Put<uint64_t>(&b[32], h.seed);
  return b;
}

Status DecodeHeader(const std::array<uint8_t, kHeaderBytes>& b, TestHeader* out) {
  if (Get<uint32_t>(&b[0]) != kMagic) return Status::kBadMagic;
  if (Get<uint16_t>(&b[4]) != kVersion) return Status::kBadVersion;
  const auto test = static_cast<TestId>(Get<uint16_t>(&b[6]));
  if (test != TestId::kTcpLat && test != TestId::kTcpBw) return Status::kUnknownTest;
  const uint32_t size = Get<uint32_t>(&b[8]);
  if (size == 0 || size > kMaxMessageSize) return Status::kBadSize;
  const auto verify = static_cast<Verify>(Get<uint32_t>(&b[12]));
  if (verify != Verify::kSampled && verify != Verify::kFull) return Status::kBadVerify;
  out->test = test;
  out->verify = verify;
  out->size = size;
  out->budget.duration_ns = Get<uint64_t>(&b[16]);
  out->budget.iters = Get<uint64_t>(&b[24]);
  out->seed = Get<uint64_t>(&b[32]);
  return Status::kOk;
}

std::array<uint8_t, kAckBytes> EncodeAck(Status status) {
  std::array<uint8_t, kAckBytes> b{};
  Put<uint32_t>(&b[0], kMagic);
  Put<uint32_t>(&b[4], static_cast<uint32_t>(status));
  return b;
}

Status DecodeAck(const std::array<uint8_t, kAckBytes>& b) {
  if (Get<uint32_t>(&b[0]) != kMagic) return Status::kBadMagic;
  return static_cast<Status>(Get<uint32_t>(&b[4]));
}

// Layout: status u32 | reserved u32 | bytes u64 | first_bad_offset u64.
std::array<uint8_t, kReportBytes> EncodeReport(const BwReport& r) {
  std::array<uint8_t, kReportBytes> b{};
  Put<uint32_t>(&b[0], static_cast<uint32_t>(r.status));
  Put<uint64_t>(&b[8], r.bytes);
  Put<uint64_t>(&b[16], r.first_bad_offset);
  return b;
}

BwReport DecodeReport(const std::array<uint8_t, kReportBytes>& b) {
  BwReport r;
  r.status = static_cast<Status>(Get<uint32_t>(&b[0]));
  r.bytes = Get<uint64_t>(&b[8]);
  r.first_bad_offset = Get<uint64_t>(&b[16]);
  return r;
}

}  // namespace slipperf
