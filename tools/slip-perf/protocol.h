// slip-perf wire protocol. One TCP connection per test:
//
//   client -> server  TestHeader (kHeaderBytes, big-endian fields)
//   server -> client  Ack (kAckBytes): kOk, or why the test is refused
//   data phase        tcp_lat: the client sends `size` bytes, the server echoes them back,
//                     repeated until the client shuts down its side.
//                     tcp_bw: the client streams writes of `size` bytes and shuts down its
//                     side; the server checks the bytes against the stream pattern (in full
//                     or sampled, see Pattern) and answers with a BwReport (kReportBytes).
//   close             the server closes after the data phase; the client waits for its EOF.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "tools/slip-perf/budget.h"

namespace slipperf {

constexpr uint32_t kMagic = 0x534c5046;  // "SLPF"
constexpr uint16_t kVersion = 1;
constexpr uint16_t kDefaultPort = 5301;
constexpr uint32_t kMaxMessageSize = 64u << 20;

enum class TestId : uint16_t { kTcpLat = 1, kTcpBw = 2 };

std::optional<TestId> TestFromName(std::string_view name);
const char* TestName(TestId test);

enum class Status : uint32_t {
  kOk = 0,
  kBadMagic = 1,
  kBadVersion = 2,
  kUnknownTest = 3,
  kBadSize = 4,
  kContentMismatch = 5,
  kBadVerify = 6,
};
const char* StatusText(Status status);

// How the server checks tcp_bw content.
enum class Verify : uint32_t { kSampled = 0, kFull = 1 };
const char* VerifyName(Verify verify);

struct TestHeader {
  TestId test = TestId::kTcpLat;
  uint32_t size = 0;  // bytes per message or per write
  Verify verify = Verify::kSampled;
  Budget budget;      // informational for the server: the client decides when to stop
  uint64_t seed = 0;  // of the stream pattern
};

// The bandwidth verdict: bytes the server received, and the stream offset of the first
// byte that differed from the pattern (kNoMismatch when all matched).
struct BwReport {
  Status status = Status::kOk;
  uint64_t bytes = 0;
  uint64_t first_bad_offset = 0;
};
constexpr uint64_t kNoMismatch = ~uint64_t{0};

constexpr size_t kHeaderBytes = 40;
constexpr size_t kAckBytes = 8;
constexpr size_t kReportBytes = 24;

std::array<uint8_t, kHeaderBytes> EncodeHeader(const TestHeader& h);
// Returns kOk and fills *out, or the reason the header is refused.
Status DecodeHeader(const std::array<uint8_t, kHeaderBytes>& bytes, TestHeader* out);

std::array<uint8_t, kAckBytes> EncodeAck(Status status);
Status DecodeAck(const std::array<uint8_t, kAckBytes>& bytes);

std::array<uint8_t, kReportBytes> EncodeReport(const BwReport& r);
BwReport DecodeReport(const std::array<uint8_t, kReportBytes>& bytes);

}  // namespace slipperf
