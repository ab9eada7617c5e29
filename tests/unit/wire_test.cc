// Tests for the negotiation wire format. Every byte a peer sends goes through ParseMessage, so
// each malformed input must be reported with the right status, and no input may make the parser
// read past the bytes it was given: Parse() below puts them right before an inaccessible page.
#include "core/wire.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <ostream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "tests/fuzz/wire_samples.h"

namespace slip::wire {

// Found by argument-dependent lookup, so it must live in the enum's own namespace.
void PrintTo(ParseStatus s, std::ostream* os) {
  *os << ParseStatusName(s);
}

namespace {

using Bytes = std::vector<uint8_t>;

// The wire layout, spelled out independently of core/wire.cc.
constexpr size_t kVersionAt = 4;
constexpr size_t kTypeAt = 5;
constexpr size_t kFlagsAt = 6;
constexpr size_t kLengthAt = 8;
constexpr size_t kChecksumAt = 12;
constexpr size_t kClientAt = 16;  // REGISTER and CANCEL
constexpr size_t kServerAt = 36;
constexpr size_t kEndpointPad = 1;  // endpoint: family, pad, port (2), address (16)
constexpr size_t kEndpointAddr = 4;
constexpr size_t kRegisterRingAt = 64;
constexpr size_t kRegisterFdCountAt = 68;
constexpr size_t kRegisterRegionAt = 72;
constexpr size_t kConfirmRingAt = 24;
constexpr size_t kConfirmReservedAt = 28;
constexpr size_t kDeclineReasonAt = 24;
constexpr size_t kFailoverCauseAt = 32;
constexpr size_t kFailoverReservedAt = 36;
constexpr size_t kUrgentByteAt = 24;
constexpr size_t kUrgentAckAt = 25;
constexpr size_t kUrgentReservedAt = 26;  // 2 bytes, then 8 more

constexpr Type kTypes[] = {Type::kRegister, Type::kCancel,   Type::kConfirm, Type::kAccept,
                           Type::kDecline,  Type::kFailover, Type::kUrgent,  Type::kWindow};

size_t MessageSize(Type t) {
  switch (t) {
    case Type::kRegister:
      return 80;
    case Type::kCancel:
      return 64;
    case Type::kConfirm:
      return 32;
    case Type::kAccept:
      return 24;
    case Type::kDecline:
      return 28;
    case Type::kFailover:
      return 40;
    case Type::kUrgent:
      return 36;
    case Type::kWindow:
      return 20;
  }
  return 0;
}

std::string TypeName(Type t) {
  switch (t) {
    case Type::kRegister:
      return "Register";
    case Type::kCancel:
      return "Cancel";
    case Type::kConfirm:
      return "Confirm";
    case Type::kAccept:
      return "Accept";
    case Type::kDecline:
      return "Decline";
    case Type::kFailover:
      return "Failover";
    case Type::kUrgent:
      return "Urgent";
    case Type::kWindow:
      return "Window";
  }
  return "Unknown";
}

bool SameMessage(const Message& a, const Message& b) {
  if (a.type != b.type) return false;
  switch (a.type) {
    case Type::kRegister:
      return a.reg.client == b.reg.client && a.reg.server == b.reg.server &&
             a.reg.nonce == b.reg.nonce && a.reg.ring_size == b.reg.ring_size &&
             a.reg.fd_count == b.reg.fd_count && a.reg.region_size == b.reg.region_size;
    case Type::kCancel:
      return a.cancel.client == b.cancel.client && a.cancel.server == b.cancel.server &&
             a.cancel.nonce == b.cancel.nonce;
    case Type::kConfirm:
      return a.confirm.nonce == b.confirm.nonce && a.confirm.ring_size == b.confirm.ring_size;
    case Type::kAccept:
      return a.accept.nonce == b.accept.nonce;
    case Type::kDecline:
      return a.decline.nonce == b.decline.nonce && a.decline.reason == b.decline.reason;
    case Type::kFailover:
      return a.failover.received == b.failover.received && a.failover.sent == b.failover.sent &&
             a.failover.cause == b.failover.cause;
    case Type::kUrgent:
      return a.urgent.offset == b.urgent.offset && a.urgent.byte == b.urgent.byte &&
             a.urgent.ack == b.urgent.ack;
    case Type::kWindow:
      return a.window.bytes == b.window.bytes;
  }
  return false;
}

Bytes FromHex(std::string_view hex) {
  Bytes out;
  std::string digits;
  for (char c : hex)
    if (c != ' ') digits += c;
  for (size_t i = 0; i + 1 < digits.size(); i += 2)
    out.push_back(uint8_t(std::stoul(digits.substr(i, 2), nullptr, 16)));
  return out;
}

Bytes Encode(const Message& m) {
  uint8_t buf[kMaxMessageSize];
  size_t n = EncodeMessage(m, buf, sizeof buf);
  EXPECT_EQ(n, MessageSize(m.type));
  return Bytes(buf, buf + n);
}

void PutLe(Bytes* b, size_t at, uint64_t value, size_t width) {
  for (size_t i = 0; i < width; ++i) b->at(at + i) = uint8_t(value >> (8 * i));
}

// Recomputes the checksum, so that the parser sees an edited field and not a bad checksum.
void Reseal(Bytes* b) {
  PutLe(b, kChecksumAt, 0, 4);
  PutLe(b, kChecksumAt, Crc32c(b->data(), b->size()), 4);
}

struct Parsed {
  ParseStatus status;
  Message msg;
  size_t consumed;
};

// Parses a copy of [data, data+len) that ends exactly where an inaccessible page begins:
// reading even one byte past `len` faults, with or without sanitizers.
Parsed Parse(const uint8_t* data, size_t len) {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  static uint8_t* const base = [] {
    void* p = mmap(nullptr, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || mprotect(static_cast<uint8_t*>(p) + page, page, PROT_NONE) != 0)
      std::abort();
    return static_cast<uint8_t*>(p);
  }();
  if (len > page) std::abort();
  uint8_t* at = base + page - len;
  if (len != 0) std::memcpy(at, data, len);
  Parsed p{};
  p.status = ParseMessage(at, len, &p.msg, &p.consumed);
  return p;
}

Parsed Parse(const Bytes& b) {
  return Parse(b.data(), b.size());
}

// `m` encoded, then `width` bytes at `at` set to `value`, and the checksum fixed.
Bytes EncodeWith(const Message& m, size_t at, uint64_t value, size_t width) {
  Bytes b = Encode(m);
  PutLe(&b, at, value, width);
  Reseal(&b);
  return b;
}

ParseStatus StatusWith(const Message& m, size_t at, uint64_t value, size_t width) {
  return Parse(EncodeWith(m, at, value, width)).status;
}

// ---------------------------------------------------------------------------------------------

TEST(WireCrc32c, KnownVectors) {
  const std::string_view check = "123456789";
  EXPECT_EQ(Crc32c(reinterpret_cast<const uint8_t*>(check.data()), check.size()), 0xE3069283u);
  EXPECT_EQ(Crc32c(nullptr, 0), 0u);
  // RFC 3720, B.4.
  Bytes zeros(32, 0x00), ones(32, 0xff), up(32), down(32);
  for (size_t i = 0; i < 32; ++i) {
    up[i] = uint8_t(i);
    down[i] = uint8_t(31 - i);
  }
  EXPECT_EQ(Crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(Crc32c(up.data(), up.size()), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(down.data(), down.size()), 0x113FDB5Cu);
}

TEST(WireCrc32c, Chains) {
  const std::string_view text = "The quick brown fox jumps over the lazy dog";
  const auto* data = reinterpret_cast<const uint8_t*>(text.data());
  const uint32_t whole = Crc32c(data, text.size());
  for (size_t split = 0; split <= text.size(); ++split)
    EXPECT_EQ(Crc32c(data + split, text.size() - split, Crc32c(data, split)), whole) << split;
}

// Byte-exact encodings, computed independently: they pin the format peers must agree on.
TEST(WireEncode, GoldenBytes) {
  using samples::V4;
  using samples::V6;
  const std::array<uint8_t, 16> v6 = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
  const struct {
    Message msg;
    const char* hex;
  } cases[] = {
      {samples::MakeRegister(V4({10, 0, 0, 1}, 0x1234), V6(v6, 0xabcd), 0x0102030405060708, 0x10000,
                             3, 0x40000),
       "534c4950010100005000000053dfda48 040034120a0000010000000000000000"
       "000000000600cdab20010db800000000 00000000000000020807060504030201"
       "00000100030000000000040000000000"},
      {samples::MakeCancel(V4({192, 168, 1, 2}, 80), V4({192, 168, 1, 3}, 443), 0xfedcba9876543210),
       "534c49500102000040000000a0ff6ef5 04005000c0a801020000000000000000"
       "000000000400bb01c0a8010300000000 00000000000000001032547698badcfe"},
      {samples::MakeConfirm(0x1122334455667788, 4096),
       "534c49500103000020000000e67f1f74 88776655443322110010000000000000"},
      {samples::MakeAccept(0x0807060504030201),
       "534c4950010400001800000075bb5656 0102030405060708"},
      {samples::MakeDecline(42, DeclineReason::kPolicy),
       "534c4950010500001c000000d3e5e77f 2a0000000000000005000000"},
      {samples::MakeFailover(0x123456789, 0x223456789, FailoverCause::kDeviceRemoved),
       "534c495001060000280000003bd4cd66 89674523010000008967452302000000"
       "0200000000000000"},
      {samples::MakeWindow(0x12000), "534c49500108000014000000cdee5b9a 00200100"},
      {samples::MakeUrgent(0x0102030405060708, 0xa5, false),
       "534c49500107000024000000f57c2510 0807060504030201a500000000000000"
       "00000000"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(TypeName(c.msg.type));
    const Bytes golden = FromHex(c.hex);
    EXPECT_EQ(Encode(c.msg), golden);
    const Parsed p = Parse(golden);
    ASSERT_EQ(p.status, ParseStatus::kOk);
    EXPECT_EQ(p.consumed, golden.size());
    EXPECT_TRUE(SameMessage(p.msg, c.msg));
  }
}

TEST(WireEncode, UnknownTypeEncodesNothing) {
  for (int t : {0, 9, 255}) {
    Message m;
    m.type = static_cast<Type>(t);
    uint8_t buf[kMaxMessageSize];
    EXPECT_EQ(EncodeMessage(m, buf, sizeof buf), 0u) << t;
  }
}

TEST(WireParse, EmptyInputNeedsMore) {
  Message m;
  size_t consumed = 1;
  EXPECT_EQ(ParseMessage(nullptr, 0, &m, &consumed), ParseStatus::kNeedMore);
}

// Application bytes must be handed back as early as the first byte that differs from the magic.
TEST(WireParse, ApplicationBytesAreNotSlipstream) {
  for (std::string_view app : {"G", "GET / HTTP/1.1\r\n\r\n", "\x16\x03\x01", "SLIX", "slip"}) {
    SCOPED_TRACE(app);
    EXPECT_EQ(Parse(reinterpret_cast<const uint8_t*>(app.data()), app.size()).status,
              ParseStatus::kNotSlipstream);
  }
}

TEST(WireParse, StatusNamesAreDistinct) {
  std::set<std::string> names;
  for (int s = 0; s <= static_cast<int>(ParseStatus::kBadField); ++s) {
    const std::string name = ParseStatusName(static_cast<ParseStatus>(s));
    EXPECT_NE(name, "?") << s;
    names.insert(name);
  }
  EXPECT_EQ(names.size(), size_t(ParseStatus::kBadField) + 1);
}

// ---------------------------------------------------------------------------------------------

sockaddr_in SockaddrV4(const char* ip, uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  EXPECT_EQ(inet_pton(AF_INET, ip, &sa.sin_addr), 1) << ip;
  return sa;
}

sockaddr_in6 SockaddrV6(const char* ip, uint16_t port) {
  sockaddr_in6 sa{};
  sa.sin6_family = AF_INET6;
  sa.sin6_port = htons(port);
  EXPECT_EQ(inet_pton(AF_INET6, ip, &sa.sin6_addr), 1) << ip;
  return sa;
}

template <typename SockaddrT>
Endpoint ToEndpoint(const SockaddrT& sa) {
  Endpoint e;
  EXPECT_TRUE(EndpointFromSockaddr(reinterpret_cast<const sockaddr*>(&sa), &e));
  return e;
}

TEST(WireEndpoint, FromSockaddrV4) {
  const Endpoint e = ToEndpoint(SockaddrV4("192.0.2.1", 443));
  EXPECT_EQ(e.family, 4);
  EXPECT_EQ(e.port, 443);
  EXPECT_EQ(e, samples::V4({192, 0, 2, 1}, 443));
}

TEST(WireEndpoint, FromSockaddrV6) {
  const Endpoint e = ToEndpoint(SockaddrV6("2001:db8::2a", 8443));
  EXPECT_EQ(e.family, 6);
  EXPECT_EQ(e.port, 8443);
  EXPECT_EQ(e, samples::V6(samples::kV6Addr, 8443));
}

TEST(WireEndpoint, FromSockaddrV4MappedEqualsV4) {
  EXPECT_EQ(ToEndpoint(SockaddrV6("::ffff:192.0.2.1", 443)),
            ToEndpoint(SockaddrV4("192.0.2.1", 443)));
  EXPECT_EQ(ToEndpoint(SockaddrV6("::ffff:127.0.0.1", 8080)), samples::V4({127, 0, 0, 1}, 8080));
}

// Only ::ffff:a.b.c.d is an IPv4 address in disguise; other embeddings stay IPv6.
TEST(WireEndpoint, FromSockaddrOtherV6StaysV6) {
  for (const char* ip : {"::1", "::", "::192.0.2.1", "64:ff9b::192.0.2.1", "::ffff:0:192.0.2.1"}) {
    SCOPED_TRACE(ip);
    const sockaddr_in6 sa = SockaddrV6(ip, 80);
    const Endpoint e = ToEndpoint(sa);
    EXPECT_EQ(e.family, 6);
    EXPECT_EQ(std::memcmp(e.addr, sa.sin6_addr.s6_addr, 16), 0);
  }
}

TEST(WireEndpoint, FromSockaddrUnsupportedFamily) {
  Endpoint e;
  sockaddr_un un{};
  un.sun_family = AF_UNIX;
  EXPECT_FALSE(EndpointFromSockaddr(reinterpret_cast<const sockaddr*>(&un), &e));
  sockaddr_storage unspec{};
  unspec.ss_family = AF_UNSPEC;
  EXPECT_FALSE(EndpointFromSockaddr(reinterpret_cast<const sockaddr*>(&unspec), &e));
}

TEST(WireEndpoint, Equality) {
  const Endpoint a = samples::V4({10, 1, 2, 3}, 80);
  Endpoint b = a;
  EXPECT_EQ(a, b);
  b.port = 81;
  EXPECT_FALSE(a == b);
  b = a;
  b.addr[3] = 4;
  EXPECT_FALSE(a == b);
  b = a;
  b.family = 6;
  EXPECT_FALSE(a == b);
}

// ---------------------------------------------------------------------------------------------
// Properties every valid message must have, over samples of every type.

class WireMessageTest : public ::testing::TestWithParam<Message> {
 protected:
  const Message& msg() const { return GetParam(); }
  Bytes bytes() const { return Encode(GetParam()); }
};

TEST_P(WireMessageTest, RoundTrips) {
  const Bytes b = bytes();
  ASSERT_EQ(b.size(), MessageSize(msg().type));
  const Parsed p = Parse(b);
  ASSERT_EQ(p.status, ParseStatus::kOk);
  EXPECT_EQ(p.consumed, b.size());
  EXPECT_TRUE(SameMessage(p.msg, msg()));
  EXPECT_EQ(Encode(p.msg), b);
}

TEST_P(WireMessageTest, ParsesOnlyTheFirstMessage) {
  const Bytes first = bytes();
  const Bytes second = Encode(samples::Typical(Type::kAccept));
  Bytes stream = first;
  stream.insert(stream.end(), second.begin(), second.end());
  stream.insert(stream.end(), {'G', 'E', 'T'});
  const Parsed p = Parse(stream);
  ASSERT_EQ(p.status, ParseStatus::kOk);
  EXPECT_EQ(p.consumed, first.size());
  EXPECT_TRUE(SameMessage(p.msg, msg()));
  const Parsed next = Parse(stream.data() + p.consumed, stream.size() - p.consumed);
  ASSERT_EQ(next.status, ParseStatus::kOk);
  EXPECT_EQ(next.consumed, second.size());
}

TEST_P(WireMessageTest, EveryTruncationNeedsMore) {
  const Bytes b = bytes();
  for (size_t n = 0; n < b.size(); ++n)
    EXPECT_EQ(Parse(b.data(), n).status, ParseStatus::kNeedMore) << "length " << n;
}

TEST_P(WireMessageTest, WrongMagicAtEachByte) {
  for (size_t at = 0; at < 4; ++at) {
    for (int v = 0; v < 256; ++v) {
      Bytes b = bytes();
      if (b[at] == v) continue;
      b[at] = uint8_t(v);
      for (size_t n = 0; n <= b.size(); ++n) {
        const ParseStatus want = n > at ? ParseStatus::kNotSlipstream : ParseStatus::kNeedMore;
        ASSERT_EQ(Parse(b.data(), n).status, want)
            << "byte " << at << " = " << v << ", length " << n;
      }
    }
  }
}

// No single changed byte goes unnoticed: each is covered by the magic, a header check or the
// checksum, and the status names the first check, in header order, that the change breaks.
TEST_P(WireMessageTest, EverySingleByteChangeIsRejected) {
  const Bytes good = bytes();
  for (size_t at = 0; at < good.size(); ++at) {
    for (int v = 0; v < 256; ++v) {
      if (good[at] == v) continue;
      ParseStatus want = ParseStatus::kBadChecksum;
      if (at < kVersionAt) {
        want = ParseStatus::kNotSlipstream;
      } else if (at == kVersionAt) {
        want = ParseStatus::kBadVersion;
      } else if (at == kTypeAt) {
        want = v >= 1 && v <= 8 ? ParseStatus::kBadLength : ParseStatus::kBadType;
      } else if (at < kLengthAt) {
        want = ParseStatus::kBadField;  // flags
      } else if (at < kChecksumAt) {
        want = ParseStatus::kBadLength;
      }
      Bytes b = good;
      b[at] = uint8_t(v);
      ASSERT_EQ(Parse(b).status, want) << "byte " << at << " = " << v;
    }
  }
}

TEST_P(WireMessageTest, WrongVersion) {
  for (int v = 0; v < 256; ++v) {
    if (v == kVersion) continue;
    EXPECT_EQ(StatusWith(msg(), kVersionAt, v, 1), ParseStatus::kBadVersion) << v;
  }
}

TEST_P(WireMessageTest, UnknownType) {
  for (int t = 0; t < 256; ++t) {
    if (t >= 1 && t <= 8) continue;
    EXPECT_EQ(StatusWith(msg(), kTypeAt, t, 1), ParseStatus::kBadType) << t;
  }
}

TEST_P(WireMessageTest, NonzeroFlags) {
  for (int bit = 0; bit < 16; ++bit)
    EXPECT_EQ(StatusWith(msg(), kFlagsAt, 1u << bit, 2), ParseStatus::kBadField) << bit;
}

// The length of each type is fixed: any other value is malformed, even when that many bytes are
// there to read, and even when it is the length of another type (or the type is another's).
TEST_P(WireMessageTest, LengthFieldMismatch) {
  const size_t size = MessageSize(msg().type);
  std::vector<uint64_t> lengths = {0,        1,        kHeaderSize - 1, kHeaderSize,
                                   size - 1, size + 1, kMaxMessageSize, kMaxMessageSize + 1,
                                   0xffff,   0x10000,  0xffffffff};
  for (Type t : kTypes)
    if (t != msg().type) lengths.push_back(MessageSize(t));
  for (uint64_t length : lengths) {
    Bytes b = EncodeWith(msg(), kLengthAt, length, 4);
    EXPECT_EQ(Parse(b).status, ParseStatus::kBadLength) << length;
    b.resize(b.size() + 512);
    EXPECT_EQ(Parse(b).status, ParseStatus::kBadLength) << length << " with bytes to spare";
  }
  for (Type t : kTypes) {
    if (t != msg().type) {
      EXPECT_EQ(StatusWith(msg(), kTypeAt, uint8_t(t), 1), ParseStatus::kBadLength) << TypeName(t);
    }
  }
}

TEST_P(WireMessageTest, BadChecksum) {
  const Bytes good = bytes();
  for (int bit = 0; bit < 32; ++bit) {
    Bytes b = good;
    b[kChecksumAt + bit / 8] ^= uint8_t(1u << (bit % 8));
    EXPECT_EQ(Parse(b).status, ParseStatus::kBadChecksum) << bit;
  }
  Bytes zero = good;
  PutLe(&zero, kChecksumAt, 0, 4);
  EXPECT_EQ(Parse(zero).status, ParseStatus::kBadChecksum);
  // A checksum over the message as sent (field included) instead of with the field zeroed.
  Bytes unzeroed = good;
  PutLe(&unzeroed, kChecksumAt, Crc32c(good.data(), good.size()), 4);
  EXPECT_EQ(Parse(unzeroed).status, ParseStatus::kBadChecksum);
}

TEST_P(WireMessageTest, EncodeFailsWhenTooSmall) {
  const size_t size = MessageSize(msg().type);
  constexpr uint8_t kUntouched = 0xa5;
  for (size_t cap = 0; cap < size; ++cap) {
    uint8_t buf[kMaxMessageSize];
    std::memset(buf, kUntouched, sizeof buf);
    EXPECT_EQ(EncodeMessage(msg(), buf, cap), 0u) << cap;
    for (size_t i = cap; i < sizeof buf; ++i)
      ASSERT_EQ(buf[i], kUntouched) << "capacity " << cap << ", wrote byte " << i;
  }
  uint8_t exact[kMaxMessageSize];
  EXPECT_EQ(EncodeMessage(msg(), exact, size), size);
}

INSTANTIATE_TEST_SUITE_P(Samples, WireMessageTest, ::testing::ValuesIn(samples::All()),
                         [](const ::testing::TestParamInfo<Message>& info) {
                           return TypeName(info.param.type) + std::to_string(info.index);
                         });

// ---------------------------------------------------------------------------------------------
// Field validation: each message is re-sealed after the edit, so only the field is at fault.

constexpr uint32_t kValidRings[] = {4096, 8192, 1u << 20, 256u << 20};
constexpr uint32_t kInvalidRings[] = {0,        1,          2048,       4095,     4097,      6144,
                                      3u << 20, 257u << 20, 512u << 20, 1u << 31, 0xffffffff};

TEST(WireFields, RegisterRingSize) {
  const Message m = samples::MakeRegister(samples::V4({127, 0, 0, 1}, 1),
                                          samples::V4({127, 0, 0, 1}, 2), 7, 4096, 1, 1ull << 30);
  for (uint32_t ring : kValidRings)
    EXPECT_EQ(StatusWith(m, kRegisterRingAt, ring, 4), ParseStatus::kOk) << ring;
  for (uint32_t ring : kInvalidRings)
    EXPECT_EQ(StatusWith(m, kRegisterRingAt, ring, 4), ParseStatus::kBadField) << ring;
}

TEST(WireFields, RegisterFdCount) {
  const Message m = samples::Typical(Type::kRegister);
  for (uint32_t fds = 1; fds <= 8; ++fds)
    EXPECT_EQ(StatusWith(m, kRegisterFdCountAt, fds, 4), ParseStatus::kOk) << fds;
  for (uint32_t fds : {0u, 9u, 16u, 0x100u, 0xffffffffu})
    EXPECT_EQ(StatusWith(m, kRegisterFdCountAt, fds, 4), ParseStatus::kBadField) << fds;
}

TEST(WireFields, RegisterRegionSize) {
  const Message m = samples::Typical(Type::kRegister);
  const uint64_t ring = m.reg.ring_size;
  constexpr uint64_t kMax = uint64_t{1} << 30;
  for (uint64_t region : {2 * ring, kMax})
    EXPECT_EQ(StatusWith(m, kRegisterRegionAt, region, 8), ParseStatus::kOk) << region;
  for (uint64_t region : {uint64_t{0}, ring, 2 * ring - 1, kMax + 1, kMax << 2, ~uint64_t{0}})
    EXPECT_EQ(StatusWith(m, kRegisterRegionAt, region, 8), ParseStatus::kBadField) << region;
}

// Both endpoints of both messages that carry them.
template <typename Check>
void ForEachEndpoint(Check check) {
  for (Type t : {Type::kRegister, Type::kCancel}) {
    for (size_t at : {kClientAt, kServerAt}) {
      SCOPED_TRACE(TypeName(t) + (at == kClientAt ? " client" : " server"));
      check(samples::Typical(t), at);
    }
  }
}

TEST(WireFields, EndpointFamily) {
  ForEachEndpoint([](const Message& m, size_t at) {
    for (int family = 0; family < 256; ++family) {
      // Family 6 takes any address, so the v4 one in the sample is fine too.
      const ParseStatus want =
          family == 4 || family == 6 ? ParseStatus::kOk : ParseStatus::kBadField;
      EXPECT_EQ(StatusWith(m, at, family, 1), want) << family;
    }
  });
}

TEST(WireFields, V4EndpointBytesBeyondFour) {
  ForEachEndpoint([](const Message& m, size_t at) {
    for (size_t i = 4; i < 16; ++i)
      EXPECT_EQ(StatusWith(m, at + kEndpointAddr + i, 1, 1), ParseStatus::kBadField) << i;
  });
}

TEST(WireFields, V6EndpointTakesAnyAddress) {
  ForEachEndpoint([](const Message& m, size_t at) {
    Bytes b = EncodeWith(m, at, 6, 1);
    for (size_t i = 0; i < 16; ++i) b[at + kEndpointAddr + i] = 0xff;
    Reseal(&b);
    EXPECT_EQ(Parse(b).status, ParseStatus::kOk);
  });
}

TEST(WireFields, EndpointPad) {
  ForEachEndpoint([](const Message& m, size_t at) {
    for (int pad = 1; pad < 256; ++pad)
      EXPECT_EQ(StatusWith(m, at + kEndpointPad, pad, 1), ParseStatus::kBadField) << pad;
  });
}

TEST(WireFields, ConfirmRingSize) {
  const Message m = samples::Typical(Type::kConfirm);
  for (uint32_t ring : kValidRings)
    EXPECT_EQ(StatusWith(m, kConfirmRingAt, ring, 4), ParseStatus::kOk) << ring;
  for (uint32_t ring : kInvalidRings)
    EXPECT_EQ(StatusWith(m, kConfirmRingAt, ring, 4), ParseStatus::kBadField) << ring;
}

TEST(WireFields, ConfirmReserved) {
  const Message m = samples::Typical(Type::kConfirm);
  for (int bit = 0; bit < 32; ++bit)
    EXPECT_EQ(StatusWith(m, kConfirmReservedAt, 1ull << bit, 4), ParseStatus::kBadField) << bit;
}

TEST(WireFields, FailoverCause) {
  const Message m = samples::Typical(Type::kFailover);
  for (uint32_t c = 0; c <= static_cast<uint32_t>(FailoverCause::kHandBack); ++c) {
    const Parsed p = Parse(EncodeWith(m, kFailoverCauseAt, c, 4));
    ASSERT_EQ(p.status, ParseStatus::kOk) << c;
    EXPECT_EQ(p.msg.failover.cause, static_cast<FailoverCause>(c));
    EXPECT_EQ(p.msg.failover.received, m.failover.received);
    EXPECT_EQ(p.msg.failover.sent, m.failover.sent);
  }
  for (uint32_t c : {4u, 5u, 0xffu, 0x80000000u, 0xffffffffu})
    EXPECT_EQ(StatusWith(m, kFailoverCauseAt, c, 4), ParseStatus::kBadField) << c;
  for (int bit = 0; bit < 32; ++bit)
    EXPECT_EQ(StatusWith(m, kFailoverReservedAt, 1ull << bit, 4), ParseStatus::kBadField) << bit;
}

TEST(WireFields, UrgentAckAndReserved) {
  const Message mark = samples::Typical(Type::kUrgent);
  const Parsed ack = Parse(EncodeWith(samples::MakeUrgent(7, 0, false), kUrgentAckAt, 1, 1));
  ASSERT_EQ(ack.status, ParseStatus::kOk);
  EXPECT_TRUE(ack.msg.urgent.ack);
  EXPECT_EQ(ack.msg.urgent.offset, 7u);
  for (uint64_t v : {2u, 3u, 0x80u, 0xffu})
    EXPECT_EQ(StatusWith(mark, kUrgentAckAt, v, 1), ParseStatus::kBadField) << v;
  // An answer carries no byte.
  EXPECT_EQ(StatusWith(samples::MakeUrgent(7, 0, true), kUrgentByteAt, 1, 1),
            ParseStatus::kBadField);
  for (int bit = 0; bit < 16; ++bit)
    EXPECT_EQ(StatusWith(mark, kUrgentReservedAt, 1ull << bit, 2), ParseStatus::kBadField) << bit;
  for (int bit = 0; bit < 64; ++bit)
    EXPECT_EQ(StatusWith(mark, kUrgentReservedAt + 2, 1ull << bit, 8), ParseStatus::kBadField)
        << bit;
}

TEST(WireFields, WindowBound) {
  const Message m = samples::Typical(Type::kWindow);
  EXPECT_EQ(Parse(EncodeWith(m, kHeaderSize, kMaxWindow, 4)).status, ParseStatus::kOk);
  for (uint64_t v : {uint64_t(kMaxWindow) + 1, uint64_t(0xffffffff)})
    EXPECT_EQ(StatusWith(m, kHeaderSize, v, 4), ParseStatus::kBadField) << v;
}

TEST(WireFields, DeclineReason) {
  const Message m = samples::Typical(Type::kDecline);
  for (uint32_t r = 0; r <= static_cast<uint32_t>(DeclineReason::kDescriptors); ++r) {
    const Parsed p = Parse(EncodeWith(m, kDeclineReasonAt, r, 4));
    ASSERT_EQ(p.status, ParseStatus::kOk) << r;
    EXPECT_EQ(p.msg.decline.reason, static_cast<DeclineReason>(r));
  }
  for (uint32_t r : {9u, 10u, 0xffu, 0x100u, 0x80000000u, 0xffffffffu})
    EXPECT_EQ(StatusWith(m, kDeclineReasonAt, r, 4), ParseStatus::kBadField) << r;
}

}  // namespace
}  // namespace slip::wire
