#include "tools/slip-perf/protocol.h"

#include "tools/slip-perf/codec.h"

namespace slipperf {
namespace {

bool KnownTest(uint16_t test) {
  return test >= static_cast<uint16_t>(TestId::kLat) && test <= static_cast<uint16_t>(TestId::kCrr);
}

}  // namespace

const char* TestKind(TestId test) {
  switch (test) {
    case TestId::kLat:
      return "lat";
    case TestId::kBw:
      return "bw";
    case TestId::kRr:
      return "rr";
    case TestId::kCrr:
      return "crr";
  }
  return "unknown";
}

std::optional<TestId> TestFromKind(std::string_view kind) {
  for (const TestId t : {TestId::kLat, TestId::kBw, TestId::kRr, TestId::kCrr}) {
    if (kind == TestKind(t)) return t;
  }
  return std::nullopt;
}

const char* StatusText(Status status) {
  switch (status) {
    case Status::kOk:
      return "ok";
    case Status::kBadMagic:
      return "not a slip-perf peer (bad magic)";
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
    case Status::kBadLinks:
      return "number of links out of range";
    case Status::kBadJoin:
      return "a data link did not identify itself";
    case Status::kTestFailed:
      return "the test failed on the server";
  }
  return "unknown status";
}

const char* VerifyName(Verify verify) {
  return verify == Verify::kFull ? "full" : "sampled";
}

// magic u32 | version u16 | test u16 | size u32 | verify u32 | duration_ns u64 | iters u64 |
// seed u64 | links u32 | reserved u32
std::array<uint8_t, kRequestBytes> EncodeRequest(const TestRequest& r) {
  return Writer<kRequestBytes>()
      .Put(kMagic)
      .Put(kVersion)
      .Put(static_cast<uint16_t>(r.test))
      .Put(r.size)
      .Put(static_cast<uint32_t>(r.verify))
      .Put(r.budget.duration_ns)
      .Put(r.budget.iters)
      .Put(r.seed)
      .Put(r.links)
      .bytes();
}

Status DecodeRequest(const std::array<uint8_t, kRequestBytes>& bytes, TestRequest* out) {
  Reader in(bytes);
  if (in.Get<uint32_t>() != kMagic) return Status::kBadMagic;
  if (in.Get<uint16_t>() != kVersion) return Status::kBadVersion;
  const auto test = in.Get<uint16_t>();
  if (!KnownTest(test)) return Status::kUnknownTest;
  TestRequest r;
  r.test = static_cast<TestId>(test);
  r.size = in.Get<uint32_t>();
  if (r.size == 0 || r.size > kMaxMessageSize) return Status::kBadSize;
  const auto verify = in.Get<uint32_t>();
  if (verify > static_cast<uint32_t>(Verify::kFull)) return Status::kBadVerify;
  r.verify = static_cast<Verify>(verify);
  r.budget.duration_ns = in.Get<uint64_t>();
  r.budget.iters = in.Get<uint64_t>();
  r.seed = in.Get<uint64_t>();
  r.links = in.Get<uint32_t>();
  if (r.links == 0 || r.links > kMaxLinks) return Status::kBadLinks;
  *out = r;
  return Status::kOk;
}

std::array<uint8_t, kAckBytes> EncodeAck(Status status) {
  return Writer<kAckBytes>().Put(kMagic).Put(static_cast<uint32_t>(status)).bytes();
}

Status DecodeAck(const std::array<uint8_t, kAckBytes>& bytes) {
  Reader in(bytes);
  if (in.Get<uint32_t>() != kMagic) return Status::kBadMagic;
  return static_cast<Status>(in.Get<uint32_t>());
}

// magic u32 | index u32 | seed u64
std::array<uint8_t, kJoinBytes> EncodeJoin(const Join& j) {
  return Writer<kJoinBytes>().Put(kMagic).Put(j.index).Put(j.seed).bytes();
}

std::optional<Join> DecodeJoin(const std::array<uint8_t, kJoinBytes>& bytes) {
  Reader in(bytes);
  if (in.Get<uint32_t>() != kMagic) return std::nullopt;
  Join j;
  j.index = in.Get<uint32_t>();
  j.seed = in.Get<uint64_t>();
  return j;
}

// magic u32 | kind u32 | count u64
std::array<uint8_t, kMarkBytes> EncodeMark(const Mark& m) {
  return Writer<kMarkBytes>().Put(kMagic).Put(static_cast<uint32_t>(m.kind)).Put(m.count).bytes();
}

std::optional<Mark> DecodeMark(const std::array<uint8_t, kMarkBytes>& bytes) {
  Reader in(bytes);
  if (in.Get<uint32_t>() != kMagic) return std::nullopt;
  const auto kind = in.Get<uint32_t>();
  if (kind != static_cast<uint32_t>(MarkKind::kBegin) &&
      kind != static_cast<uint32_t>(MarkKind::kEnd)) {
    return std::nullopt;
  }
  Mark m;
  m.kind = static_cast<MarkKind>(kind);
  m.count = in.Get<uint64_t>();
  return m;
}

std::array<uint8_t, kReportBytes> EncodeVerdict(Status status, uint64_t first, uint64_t second) {
  return Writer<kReportBytes>()
      .Put(static_cast<uint32_t>(status))
      .Put(uint32_t{0})
      .Put(first)
      .Put(second)
      .bytes();
}

Status DecodeVerdict(const std::array<uint8_t, kReportBytes>& bytes, uint64_t* first,
                     uint64_t* second) {
  Reader in(bytes);
  const auto status = static_cast<Status>(in.Get<uint32_t>());
  in.Get<uint32_t>();
  *first = in.Get<uint64_t>();
  *second = in.Get<uint64_t>();
  return status;
}

}  // namespace slipperf
