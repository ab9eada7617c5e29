// slip-perf wire protocol, qperf style: one control connection per client session, and
// the data links of each test beside it.
//
//   control, per test:
//     client -> server  TestRequest
//     server -> client  Ack: kOk, or why the test is refused
//     data links open   lat, bw, rr: `links` of them, each starting with a Join;
//                       crr: a new connection per transaction, without a Join
//     client -> server  Mark kBegin: every link has warmed up, the client measures now
//     client -> server  Mark kEnd: the client stopped measuring; for crr it carries the
//                       number of transactions it completed in all (warm-up included)
//     server -> client  ServerReport, once the server's side of every link is done: the
//                       verdict, and the server's CPU use between the two marks
//   The client closes the control connection after its last test.
//
//   data links:
//     lat, rr  the client sends `size` bytes, the server reads all of them and echoes them,
//              repeated until the client shuts down its side; the server then closes.
//     bw       the client streams writes of `size` bytes and shuts down its side; the
//              server checks the bytes against the stream pattern (in full or sampled,
//              see Pattern), answers with a BwReport and closes.
//     crr      connect, `size` bytes, their echo, the server closes, the client sees EOF
//              and closes (so TIME_WAIT stays on the server's side, and the client does not
//              run out of ports).
//
// All fields are big-endian.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "tools/slip-perf/budget.h"

namespace slipperf {

constexpr uint32_t kMagic = 0x534c5046;  // "SLPF"
constexpr uint16_t kVersion = 2;
constexpr uint16_t kDefaultPort = 5301;
constexpr uint32_t kMaxMessageSize = 64u << 20;
constexpr uint32_t kMaxLinks = 1024;

// What a test measures, whatever the transport: the names a table or plot lines up on.
enum class TestId : uint16_t { kLat = 1, kBw = 2, kRr = 3, kCrr = 4 };

// "lat", "bw", "rr", "crr".
const char* TestKind(TestId test);
std::optional<TestId> TestFromKind(std::string_view kind);

enum class Status : uint32_t {
  kOk = 0,
  kBadMagic = 1,
  kBadVersion = 2,
  kUnknownTest = 3,
  kBadSize = 4,
  kContentMismatch = 5,
  kBadVerify = 6,
  kBadLinks = 7,
  kBadJoin = 8,
  kTestFailed = 9,
};
const char* StatusText(Status status);

// How the server checks tcp_bw content.
enum class Verify : uint32_t { kSampled = 0, kFull = 1 };
const char* VerifyName(Verify verify);

struct TestRequest {
  TestId test = TestId::kLat;
  uint32_t size = 0;  // bytes per message or per write
  Verify verify = Verify::kSampled;
  Budget budget;       // informational for the server: the client decides when to stop
  uint64_t seed = 0;   // of the stream pattern; link i uses seed + i
  uint32_t links = 1;  // data links (bw: streams; rr, crr: connections or threads)
};

// The first bytes on a data link: which link of which test it is.
struct Join {
  uint32_t index = 0;
  uint64_t seed = 0;  // the test's seed, so a stray connection is not taken for a link
};

enum class MarkKind : uint32_t { kBegin = 1, kEnd = 2 };
struct Mark {
  MarkKind kind = MarkKind::kBegin;
  uint64_t count = 0;
};

struct ServerReport {
  Status status = Status::kOk;
  uint64_t cpu_ns = 0;   // user + system time of the server process between the marks
  uint64_t wall_ns = 0;  // time between the marks, as the server saw them
};

// The bandwidth verdict: bytes the server received, and the stream offset of the first
// byte that differed from the pattern (kNoMismatch when all matched).
struct BwReport {
  Status status = Status::kOk;
  uint64_t bytes = 0;
  uint64_t first_bad_offset = 0;
};
constexpr uint64_t kNoMismatch = ~uint64_t{0};

constexpr size_t kRequestBytes = 48;
constexpr size_t kAckBytes = 8;
constexpr size_t kJoinBytes = 16;
constexpr size_t kMarkBytes = 16;
constexpr size_t kReportBytes = 24;  // ServerReport and BwReport

std::array<uint8_t, kRequestBytes> EncodeRequest(const TestRequest& r);
// Returns kOk and fills *out, or the reason the request is refused.
Status DecodeRequest(const std::array<uint8_t, kRequestBytes>& bytes, TestRequest* out);

std::array<uint8_t, kAckBytes> EncodeAck(Status status);
Status DecodeAck(const std::array<uint8_t, kAckBytes>& bytes);

std::array<uint8_t, kJoinBytes> EncodeJoin(const Join& j);
// nullopt when the bytes are not a Join.
std::optional<Join> DecodeJoin(const std::array<uint8_t, kJoinBytes>& bytes);

std::array<uint8_t, kMarkBytes> EncodeMark(const Mark& m);
std::optional<Mark> DecodeMark(const std::array<uint8_t, kMarkBytes>& bytes);

// The reports' one layout: status u32 | reserved u32 | u64 | u64.
std::array<uint8_t, kReportBytes> EncodeVerdict(Status status, uint64_t first, uint64_t second);
Status DecodeVerdict(const std::array<uint8_t, kReportBytes>& bytes, uint64_t* first,
                     uint64_t* second);

// ServerReport or BwReport: a status and two counts, in the order they are declared.
template <typename Report>
std::array<uint8_t, kReportBytes> EncodeReport(const Report& r) {
  const auto& [status, first, second] = r;
  return EncodeVerdict(status, first, second);
}
template <typename Report>
Report DecodeReport(const std::array<uint8_t, kReportBytes>& bytes) {
  Report r;
  auto& [status, first, second] = r;
  status = DecodeVerdict(bytes, &first, &second);
  return r;
}

}  // namespace slipperf
