// Tests for the bytes verbs puts on the wire outside the rings (rdma_cm private data, HELLO,
// notifications, link messages, REJ). Every byte of a REQ, REP or HELLO comes from a
// peer, so each malformed input must be reported with the right result, and no input may make a
// parser read past the bytes it was given: Parse() below puts them right before an inaccessible
// page.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "core/stats.h"
#include "core/wire.h"
#include "tests/fuzz/wire_samples.h"
#include "verbs/private_data.h"

namespace slip::verbs {

// Found by argument-dependent lookup, so it must live in the enum's own namespace.
void PrintTo(ParseResult r, std::ostream* os) {
  *os << ParseResultName(r);
}

namespace {

using Bytes = std::vector<uint8_t>;
using wire::Endpoint;
using wire::samples::V4;
using wire::samples::V6;

// The layouts, spelled out independently of verbs/private_data.cc.
constexpr size_t kMagicAt = 0;
constexpr size_t kVersionAt = 4;
// REQ
constexpr size_t kReqFlagsAt = 5;
constexpr size_t kReqRingAt = 6;
constexpr size_t kReqFamilyAt = 7;
constexpr size_t kReqClientPortAt = 8;
constexpr size_t kReqServerPortAt = 10;
constexpr size_t kReqNonceAt = 12;
constexpr size_t kReqClientAddrAt = 20;
constexpr size_t kReqServerAddrAt = 36;
// REP
constexpr size_t kRepFlagsAt = 5;
constexpr size_t kRepRingAt = 6;
constexpr size_t kRepPadAt = 7;
// HELLO
constexpr size_t kHelloRingAt = 5;
constexpr size_t kHelloPadAt = 6;

constexpr std::array<uint8_t, 16> kV6a = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0,
                                          0,    0,    0,    0,    0, 0, 0, 0x2a};
constexpr std::array<uint8_t, 16> kV6b = {0xfe, 0x80, 0,    0,    0,    0,    0,    0,
                                          0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55};

Bytes FromHex(std::string_view hex) {
  Bytes out;
  std::string digits;
  for (char c : hex)
    if (c != ' ') digits += c;
  for (size_t i = 0; i + 1 < digits.size(); i += 2)
    out.push_back(uint8_t(std::stoul(digits.substr(i, 2), nullptr, 16)));
  return out;
}

void PutLe(Bytes* b, size_t at, uint64_t value, size_t width) {
  for (size_t i = 0; i < width; ++i) b->at(at + i) = uint8_t(value >> (8 * i));
}

// A copy of [data, data+len) that ends exactly where an inaccessible page begins: reading even
// one byte past `len` faults, with or without sanitizers.
const uint8_t* Guarded(const uint8_t* data, size_t len) {
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
  return at;
}

// The three message kinds behind one interface, so that each check runs over all of them.
struct ReqKind {
  using Msg = Req;
  static constexpr size_t kSize = kReqSize;
  static constexpr const char* kName = "Req";
  static size_t Encode(const Msg& m, uint8_t* out, size_t cap) { return EncodeReq(m, out, cap); }
  static ParseResult Parse(const uint8_t* d, size_t n, Msg* m) { return ParseReq(d, n, m); }
  static bool Same(const Msg& a, const Msg& b) {
    return a.flags == b.flags && a.ring_log2 == b.ring_log2 && a.nonce == b.nonce &&
           a.client == b.client && a.server == b.server;
  }
};
struct RepKind {
  using Msg = Rep;
  static constexpr size_t kSize = kRepSize;
  static constexpr const char* kName = "Rep";
  static size_t Encode(const Msg& m, uint8_t* out, size_t cap) { return EncodeRep(m, out, cap); }
  static ParseResult Parse(const uint8_t* d, size_t n, Msg* m) { return ParseRep(d, n, m); }
  static bool Same(const Msg& a, const Msg& b) {
    return a.flags == b.flags && a.ring_log2 == b.ring_log2 && a.nonce == b.nonce &&
           a.ring_addr == b.ring_addr && a.rkey == b.rkey;
  }
};
struct HelloKind {
  using Msg = Hello;
  static constexpr size_t kSize = kHelloSize;
  static constexpr const char* kName = "Hello";
  static size_t Encode(const Msg& m, uint8_t* out, size_t cap) { return EncodeHello(m, out, cap); }
  static ParseResult Parse(const uint8_t* d, size_t n, Msg* m) { return ParseHello(d, n, m); }
  static bool Same(const Msg& a, const Msg& b) {
    return a.ring_log2 == b.ring_log2 && a.nonce == b.nonce && a.ring_addr == b.ring_addr &&
           a.rkey == b.rkey;
  }
};

struct LinkKind_ {
  using Msg = LinkMsg;
  static constexpr size_t kSize = kLinkSize;
  static constexpr const char* kName = "Link";
  static size_t Encode(const Msg& m, uint8_t* out, size_t cap) { return EncodeLink(m, out, cap); }
  static ParseResult Parse(const uint8_t* d, size_t n, Msg* m) { return ParseLink(d, n, m); }
  static bool Same(const Msg& a, const Msg& b) {
    return a.kind == b.kind && a.ring_log2 == b.ring_log2 && a.accepted == b.accepted &&
           a.nonce == b.nonce && a.client_port == b.client_port && a.server_port == b.server_port;
  }
};

template <typename K>
Bytes Encode(const typename K::Msg& m) {
  uint8_t buf[128];
  const size_t n = K::Encode(m, buf, sizeof buf);
  EXPECT_EQ(n, K::kSize);
  return Bytes(buf, buf + n);
}

template <typename K>
ParseResult ParseGuarded(const uint8_t* data, size_t len, typename K::Msg* out) {
  return K::Parse(Guarded(data, len), len, out);
}

template <typename K>
ParseResult ParseGuarded(const Bytes& b, typename K::Msg* out = nullptr) {
  typename K::Msg scratch;
  return ParseGuarded<K>(b.data(), b.size(), out ? out : &scratch);
}

// `m` encoded, then `width` bytes at `at` set to `value`.
template <typename K>
ParseResult ResultWith(const typename K::Msg& m, size_t at, uint64_t value, size_t width) {
  Bytes b = Encode<K>(m);
  PutLe(&b, at, value, width);
  return ParseGuarded<K>(b);
}

Req MakeReq(uint8_t flags, uint8_t ring_log2, uint64_t nonce, Endpoint client, Endpoint server) {
  Req r;
  r.flags = flags;
  r.ring_log2 = ring_log2;
  r.nonce = nonce;
  r.client = client;
  r.server = server;
  return r;
}

Rep MakeRep(uint8_t flags, uint8_t ring_log2, uint64_t nonce, uint64_t ring_addr, uint32_t rkey) {
  Rep r;
  r.flags = flags;
  r.ring_log2 = ring_log2;
  r.nonce = nonce;
  r.ring_addr = ring_addr;
  r.rkey = rkey;
  return r;
}

Hello MakeHello(uint8_t ring_log2, uint64_t nonce, uint64_t ring_addr, uint32_t rkey) {
  Hello h;
  h.ring_log2 = ring_log2;
  h.nonce = nonce;
  h.ring_addr = ring_addr;
  h.rkey = rkey;
  return h;
}

Req SampleReqV4() {
  return MakeReq(0, 16, 0x0102030405060708, V4({10, 0, 0, 1}, 40000), V4({10, 0, 0, 2}, 443));
}
Req SampleReqV6() {
  return MakeReq(kFlagSendNotify, 20, 0xfedcba9876543210, V6(kV6a, 1), V6(kV6b, 65535));
}
Rep SampleRep() {
  return MakeRep(kFlagSendNotify, 16, 0x1122334455667788, 0x00007f0012345000, 0xdeadbeef);
}
Hello SampleHello() {
  return MakeHello(16, 0x1122334455667788, 0x00007f00abcde000, 0x12345678);
}

// Valid messages of each kind, boundary values included.
std::vector<Req> ValidReqs() {
  return {
      SampleReqV4(),
      SampleReqV6(),
      MakeReq(0, kMinRingLog2, 0, V4({0, 0, 0, 0}, 1), V4({255, 255, 255, 255}, 65535)),
      MakeReq(kFlagSendNotify, kMaxRingLog2, ~uint64_t(0), V4({127, 0, 0, 1}, 65535),
              V4({127, 0, 0, 1}, 1)),
      MakeReq(0, kMaxRingLog2, 1, V6({}, 8080),
              V6({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, 8080)),
      MakeReq(kFlagSendNotify, kMinRingLog2, 42,
              V6({0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                  0xff, 0xff, 0xff},
                 2),
              V6(kV6a, 3)),
  };
}
std::vector<Rep> ValidReps() {
  return {SampleRep(), MakeRep(0, kMinRingLog2, 0, 0, 0),
          MakeRep(kFlagSendNotify, kMaxRingLog2, ~uint64_t(0), ~uint64_t(0), ~uint32_t(0))};
}
std::vector<Hello> ValidHellos() {
  return {SampleHello(), MakeHello(kMinRingLog2, 0, 0, 0),
          MakeHello(kMaxRingLog2, ~uint64_t(0), ~uint64_t(0), ~uint32_t(0))};
}

template <typename K>
void ExpectRoundTrip(const typename K::Msg& m) {
  const Bytes b = Encode<K>(m);
  ASSERT_EQ(b.size(), K::kSize);
  typename K::Msg back;
  ASSERT_EQ(ParseGuarded<K>(b, &back), ParseResult::kOk);
  EXPECT_TRUE(K::Same(back, m));
  // And re-encoding what was parsed gives back the same bytes.
  EXPECT_EQ(Encode<K>(back), b);
}

// Every prefix shorter than the message is kShort, and leaves the output untouched.
template <typename K>
void ExpectEveryPrefixShort(const typename K::Msg& m) {
  const Bytes b = Encode<K>(m);
  for (size_t n = 0; n < b.size(); ++n) {
    typename K::Msg out = m;
    EXPECT_EQ(ParseGuarded<K>(b.data(), n, &out), ParseResult::kShort) << K::kName << " " << n;
    EXPECT_TRUE(K::Same(out, m)) << K::kName << " " << n;
  }
}

// A later version may append fields: a longer buffer still parses, to the same message.
template <typename K>
void ExpectLongerBufferParses(const typename K::Msg& m) {
  Bytes b = Encode<K>(m);
  for (size_t extra : {1, 4, 28, 100}) {
    Bytes longer = b;
    for (size_t i = 0; i < extra; ++i) longer.push_back(uint8_t(0xa5 ^ i));
    typename K::Msg back;
    ASSERT_EQ(ParseGuarded<K>(longer, &back), ParseResult::kOk) << K::kName << " +" << extra;
    EXPECT_TRUE(K::Same(back, m)) << K::kName << " +" << extra;
  }
}

template <typename K>
void ExpectHeaderChecked(const typename K::Msg& m, uint32_t magic) {
  // Wrong magic: any single bit flipped, the other kinds' magics, and SLIP's.
  for (int bit = 0; bit < 32; ++bit)
    EXPECT_EQ(ResultWith<K>(m, kMagicAt, magic ^ (1u << bit), 4), ParseResult::kBadMagic)
        << K::kName << " bit " << bit;
  for (uint32_t other : {kReqMagic, kRepMagic, kHelloMagic, wire::kMagic, 0u, ~0u}) {
    if (other == magic) continue;
    EXPECT_EQ(ResultWith<K>(m, kMagicAt, other, 4), ParseResult::kBadMagic) << K::kName;
  }
  // Wrong version.
  for (int v : {0, 2, 3, 0x81, 255})
    EXPECT_EQ(ResultWith<K>(m, kVersionAt, uint64_t(v), 1), ParseResult::kBadVersion)
        << K::kName << " version " << v;
  // The magic is checked before the version, and both before the length (once 5 bytes are in).
  {
    Bytes b = Encode<K>(m);
    PutLe(&b, kMagicAt, magic ^ 1, 4);
    PutLe(&b, kVersionAt, 2, 1);
    EXPECT_EQ(ParseGuarded<K>(b), ParseResult::kBadMagic) << K::kName;
    for (size_t n = 5; n < b.size(); ++n) {
      typename K::Msg out;
      EXPECT_EQ(ParseGuarded<K>(b.data(), n, &out), ParseResult::kBadMagic) << K::kName << n;
    }
  }
  {
    Bytes b = Encode<K>(m);
    PutLe(&b, kVersionAt, 2, 1);
    for (size_t n = 5; n < b.size(); ++n) {
      typename K::Msg out;
      EXPECT_EQ(ParseGuarded<K>(b.data(), n, &out), ParseResult::kBadVersion) << K::kName << n;
    }
  }
}

template <typename K>
void ExpectRingLog2Checked(const typename K::Msg& m, size_t at) {
  for (int v = 0; v <= 255; ++v) {
    const ParseResult want = v >= 12 && v <= 28 ? ParseResult::kOk : ParseResult::kBadField;
    EXPECT_EQ(ResultWith<K>(m, at, uint64_t(v), 1), want) << K::kName << " ring_log2 " << v;
  }
}

template <typename K>
void ExpectFlagsChecked(const typename K::Msg& m, size_t at, uint8_t known) {
  for (int v = 0; v <= 255; ++v) {
    const ParseResult want = (v & ~known) ? ParseResult::kBadField : ParseResult::kOk;
    EXPECT_EQ(ResultWith<K>(m, at, uint64_t(v), 1), want) << K::kName << " flags " << v;
  }
}

// A rejected message leaves the output untouched.
template <typename K>
void ExpectRejectLeavesOutput(const typename K::Msg& m, size_t at, uint64_t value, size_t width) {
  Bytes b = Encode<K>(m);
  PutLe(&b, at, value, width);
  typename K::Msg sentinel = m;
  ASSERT_NE(ParseGuarded<K>(b, &sentinel), ParseResult::kOk) << K::kName;
  EXPECT_TRUE(K::Same(sentinel, m)) << K::kName;
}

// ---------------------------------------------------------------------------------------------

TEST(VerbsWire, SizesAndConstants) {
  EXPECT_LE(kReqSize, kMaxReqPrivateData);
  EXPECT_EQ(kMaxReqPrivateData, 56u);
  EXPECT_EQ(kReqSize, 52u);
  EXPECT_EQ(kRepSize, 28u);
  EXPECT_EQ(kHelloSize, 28u);
  // The three magics are distinct from each other and from the in-band SLIP magic.
  std::set<uint32_t> magics = {kReqMagic, kRepMagic, kHelloMagic, wire::kMagic};
  EXPECT_EQ(magics.size(), 4u);
}

TEST(VerbsWire, ParseResultNamesAreDistinct) {
  std::set<std::string> names;
  for (int r = 0; r <= static_cast<int>(ParseResult::kBadField); ++r) {
    const std::string name = ParseResultName(static_cast<ParseResult>(r));
    EXPECT_NE(name, "?") << r;
    names.insert(name);
  }
  EXPECT_EQ(names.size(), size_t(ParseResult::kBadField) + 1);
}

// Byte-exact encodings, computed by hand: they pin the format both ends must agree on.
TEST(VerbsWire, GoldenBytes) {
  {
    const Req req = MakeReq(kFlagSendNotify, 20, 0x0102030405060708, V4({10, 0, 0, 1}, 0x1234),
                            V4({10, 0, 0, 2}, 0xabcd));
    const Bytes golden = FromHex(
        "534c5251 01 01 14 04 3412 cdab 0807060504030201"
        "0a000001 000000000000000000000000"
        "0a000002 000000000000000000000000");
    EXPECT_EQ(Encode<ReqKind>(req), golden);
    Req back;
    ASSERT_EQ(ParseGuarded<ReqKind>(golden, &back), ParseResult::kOk);
    EXPECT_TRUE(ReqKind::Same(back, req));
  }
  {
    const Rep rep = MakeRep(0, 16, 0x1122334455667788, 0x00007f0012345000, 0xdeadbeef);
    const Bytes golden = FromHex("534c5250 01 00 10 00 8877665544332211 00503412007f0000 efbeadde");
    EXPECT_EQ(Encode<RepKind>(rep), golden);
    Rep back;
    ASSERT_EQ(ParseGuarded<RepKind>(golden, &back), ParseResult::kOk);
    EXPECT_TRUE(RepKind::Same(back, rep));
  }
  {
    const Hello hello = MakeHello(28, 0x0807060504030201, 0x1000, 7);
    const Bytes golden = FromHex("534c484c 01 1c 0000 0102030405060708 0010000000000000 07000000");
    EXPECT_EQ(Encode<HelloKind>(hello), golden);
    Hello back;
    ASSERT_EQ(ParseGuarded<HelloKind>(golden, &back), ParseResult::kOk);
    EXPECT_TRUE(HelloKind::Same(back, hello));
  }
}

TEST(VerbsWire, ReqRoundTripV4) {
  const Req req = SampleReqV4();
  ExpectRoundTrip<ReqKind>(req);
  Req back;
  ASSERT_EQ(ParseGuarded<ReqKind>(Encode<ReqKind>(req), &back), ParseResult::kOk);
  EXPECT_EQ(back.client.family, 4);
  EXPECT_EQ(back.server.family, 4);
  EXPECT_EQ(back.client.port, 40000);
  EXPECT_EQ(back.server.port, 443);
  EXPECT_EQ(back.client, V4({10, 0, 0, 1}, 40000));
  EXPECT_EQ(back.server, V4({10, 0, 0, 2}, 443));
}

TEST(VerbsWire, ReqRoundTripV6) {
  const Req req = SampleReqV6();
  ExpectRoundTrip<ReqKind>(req);
  Req back;
  ASSERT_EQ(ParseGuarded<ReqKind>(Encode<ReqKind>(req), &back), ParseResult::kOk);
  EXPECT_EQ(back.client.family, 6);
  EXPECT_EQ(back.server.family, 6);
  EXPECT_EQ(back.flags, kFlagSendNotify);
  EXPECT_EQ(back.client, V6(kV6a, 1));
  EXPECT_EQ(back.server, V6(kV6b, 65535));
}

TEST(VerbsWire, RoundTripsAllValid) {
  for (const Req& m : ValidReqs()) ExpectRoundTrip<ReqKind>(m);
  for (const Rep& m : ValidReps()) ExpectRoundTrip<RepKind>(m);
  for (const Hello& m : ValidHellos()) ExpectRoundTrip<HelloKind>(m);
}

TEST(VerbsWire, RepRoundTrip) {
  ExpectRoundTrip<RepKind>(SampleRep());
  Rep back;
  ASSERT_EQ(ParseGuarded<RepKind>(Encode<RepKind>(SampleRep()), &back), ParseResult::kOk);
  EXPECT_EQ(back.ring_addr, 0x00007f0012345000u);
  EXPECT_EQ(back.rkey, 0xdeadbeefu);
}

TEST(VerbsWire, HelloRoundTrip) {
  ExpectRoundTrip<HelloKind>(SampleHello());
  Hello back;
  ASSERT_EQ(ParseGuarded<HelloKind>(Encode<HelloKind>(SampleHello()), &back), ParseResult::kOk);
  EXPECT_EQ(back.nonce, 0x1122334455667788u);
  EXPECT_EQ(back.ring_log2, 16);
}

TEST(VerbsWire, EveryShorterLengthIsShort) {
  for (const Req& m : ValidReqs()) ExpectEveryPrefixShort<ReqKind>(m);
  for (const Rep& m : ValidReps()) ExpectEveryPrefixShort<RepKind>(m);
  for (const Hello& m : ValidHellos()) ExpectEveryPrefixShort<HelloKind>(m);
}

TEST(VerbsWire, NullDataIsRejected) {
  Req req = SampleReqV4();
  Rep rep = SampleRep();
  Hello hello = SampleHello();
  for (size_t len : {size_t(0), size_t(5), kReqSize, size_t(1000)}) {
    EXPECT_EQ(ParseReq(nullptr, len, &req), ParseResult::kShort) << len;
    EXPECT_EQ(ParseRep(nullptr, len, &rep), ParseResult::kShort) << len;
    EXPECT_EQ(ParseHello(nullptr, len, &hello), ParseResult::kShort) << len;
  }
  EXPECT_TRUE(ReqKind::Same(req, SampleReqV4()));
  EXPECT_TRUE(RepKind::Same(rep, SampleRep()));
  EXPECT_TRUE(HelloKind::Same(hello, SampleHello()));
}

TEST(VerbsWire, LongerBufferStillParses) {
  for (const Req& m : ValidReqs()) ExpectLongerBufferParses<ReqKind>(m);
  for (const Rep& m : ValidReps()) ExpectLongerBufferParses<RepKind>(m);
  for (const Hello& m : ValidHellos()) ExpectLongerBufferParses<HelloKind>(m);
}

TEST(VerbsWire, WrongMagicOrVersion) {
  ExpectHeaderChecked<ReqKind>(SampleReqV4(), kReqMagic);
  ExpectHeaderChecked<ReqKind>(SampleReqV6(), kReqMagic);
  ExpectHeaderChecked<RepKind>(SampleRep(), kRepMagic);
  ExpectHeaderChecked<HelloKind>(SampleHello(), kHelloMagic);
}

// Each kind's bytes are not accepted as another kind.
TEST(VerbsWire, KindsAreNotInterchangeable) {
  const Bytes req = Encode<ReqKind>(SampleReqV4());
  const Bytes rep = Encode<RepKind>(SampleRep());
  const Bytes hello = Encode<HelloKind>(SampleHello());
  EXPECT_EQ(ParseGuarded<RepKind>(req), ParseResult::kBadMagic);
  EXPECT_EQ(ParseGuarded<HelloKind>(req), ParseResult::kBadMagic);
  EXPECT_EQ(ParseGuarded<ReqKind>(rep), ParseResult::kBadMagic);
  EXPECT_EQ(ParseGuarded<HelloKind>(rep), ParseResult::kBadMagic);
  EXPECT_EQ(ParseGuarded<ReqKind>(hello), ParseResult::kBadMagic);
  EXPECT_EQ(ParseGuarded<RepKind>(hello), ParseResult::kBadMagic);
}

TEST(VerbsWire, UnknownFlagBits) {
  ExpectFlagsChecked<ReqKind>(SampleReqV4(), kReqFlagsAt, kFlagSendNotify);
  ExpectFlagsChecked<ReqKind>(SampleReqV6(), kReqFlagsAt, kFlagSendNotify);
  // (Only a listener says its port is shared.)
  ExpectFlagsChecked<RepKind>(SampleRep(), kRepFlagsAt, kFlagSendNotify | kFlagGroup);
}

TEST(VerbsWire, RingLog2Range) {
  ExpectRingLog2Checked<ReqKind>(SampleReqV4(), kReqRingAt);
  ExpectRingLog2Checked<ReqKind>(SampleReqV6(), kReqRingAt);
  ExpectRingLog2Checked<RepKind>(SampleRep(), kRepRingAt);
  ExpectRingLog2Checked<HelloKind>(SampleHello(), kHelloRingAt);
}

TEST(VerbsWire, ReqFamily) {
  // A V6 REQ whose addresses only use their first 4 bytes is valid as family 4 or 6 alike.
  const Req req = MakeReq(0, 16, 9, V6({192, 0, 2, 1}, 1000), V6({192, 0, 2, 2}, 2000));
  for (int f = 0; f <= 255; ++f) {
    const ParseResult want = f == 4 || f == 6 ? ParseResult::kOk : ParseResult::kBadField;
    EXPECT_EQ(ResultWith<ReqKind>(req, kReqFamilyAt, uint64_t(f), 1), want) << "family " << f;
  }
  // A full IPv6 address under family 4 is not a well-formed tuple.
  EXPECT_EQ(ResultWith<ReqKind>(SampleReqV6(), kReqFamilyAt, 4, 1), ParseResult::kBadField);
  // And family 6 with IPv4 addresses parses as IPv6 (the bytes are what they are).
  Bytes b = Encode<ReqKind>(SampleReqV4());
  PutLe(&b, kReqFamilyAt, 6, 1);
  Req back;
  ASSERT_EQ(ParseGuarded<ReqKind>(b, &back), ParseResult::kOk);
  EXPECT_EQ(back.client.family, 6);
  EXPECT_EQ(back.server.family, 6);
}

TEST(VerbsWire, ReqZeroPorts) {
  for (const Req& m : ValidReqs()) {
    EXPECT_EQ(ResultWith<ReqKind>(m, kReqClientPortAt, 0, 2), ParseResult::kBadField);
    EXPECT_EQ(ResultWith<ReqKind>(m, kReqServerPortAt, 0, 2), ParseResult::kBadField);
    EXPECT_EQ(ResultWith<ReqKind>(m, kReqClientPortAt, 0, 4), ParseResult::kBadField);
    // Only zero is refused: any other value (either byte) is a port.
    EXPECT_EQ(ResultWith<ReqKind>(m, kReqClientPortAt, 0x0100, 2), ParseResult::kOk);
    EXPECT_EQ(ResultWith<ReqKind>(m, kReqServerPortAt, 0x0001, 2), ParseResult::kOk);
  }
}

TEST(VerbsWire, ReqV4AddressBeyondFourBytes) {
  for (const Req& m : ValidReqs()) {
    if (m.client.family != 4) continue;
    for (size_t at : {kReqClientAddrAt, kReqServerAddrAt}) {
      // The first 4 bytes are the address: any value is fine.
      for (size_t i = 0; i < 4; ++i)
        EXPECT_EQ(ResultWith<ReqKind>(m, at + i, 0x5a, 1), ParseResult::kOk) << at << "+" << i;
      for (size_t i = 4; i < 16; ++i) {
        for (uint64_t v : {0x01, 0x80, 0xff})
          EXPECT_EQ(ResultWith<ReqKind>(m, at + i, v, 1), ParseResult::kBadField)
              << at << "+" << i << " = " << v;
      }
    }
  }
  // The same bytes are fine under family 6.
  for (size_t i = 0; i < 16; ++i) {
    EXPECT_EQ(ResultWith<ReqKind>(SampleReqV6(), kReqClientAddrAt + i, 0xff, 1), ParseResult::kOk);
    EXPECT_EQ(ResultWith<ReqKind>(SampleReqV6(), kReqServerAddrAt + i, 0xff, 1), ParseResult::kOk);
  }
}

TEST(VerbsWire, NonceIsOpaque) {
  for (uint64_t nonce : {uint64_t(0), uint64_t(1), ~uint64_t(0), uint64_t(0x8000000000000000)}) {
    EXPECT_EQ(ResultWith<ReqKind>(SampleReqV4(), kReqNonceAt, nonce, 8), ParseResult::kOk);
    EXPECT_EQ(ResultWith<RepKind>(SampleRep(), 8, nonce, 8), ParseResult::kOk);
    EXPECT_EQ(ResultWith<HelloKind>(SampleHello(), 8, nonce, 8), ParseResult::kOk);
  }
}

TEST(VerbsWire, NonZeroPad) {
  for (int bit = 0; bit < 8; ++bit)
    EXPECT_EQ(ResultWith<RepKind>(SampleRep(), kRepPadAt, 1u << bit, 1), ParseResult::kBadField)
        << bit;
  for (int bit = 0; bit < 16; ++bit)
    EXPECT_EQ(ResultWith<HelloKind>(SampleHello(), kHelloPadAt, 1u << bit, 2),
              ParseResult::kBadField)
        << bit;
}

TEST(VerbsWire, RejectedLeavesOutputUntouched) {
  ExpectRejectLeavesOutput<ReqKind>(SampleReqV4(), kReqFamilyAt, 5, 1);
  ExpectRejectLeavesOutput<ReqKind>(SampleReqV4(), kReqServerPortAt, 0, 2);
  ExpectRejectLeavesOutput<ReqKind>(SampleReqV4(), kReqClientAddrAt + 15, 1, 1);
  ExpectRejectLeavesOutput<ReqKind>(SampleReqV4(), kVersionAt, 2, 1);
  ExpectRejectLeavesOutput<RepKind>(SampleRep(), kRepPadAt, 1, 1);
  ExpectRejectLeavesOutput<RepKind>(SampleRep(), kMagicAt, 0, 4);
  ExpectRejectLeavesOutput<HelloKind>(SampleHello(), kHelloRingAt, 29, 1);
  ExpectRejectLeavesOutput<HelloKind>(SampleHello(), kHelloPadAt, 0x100, 2);
}

TEST(VerbsWire, EncodeReqRefusesMismatchedFamilies) {
  uint8_t buf[128];
  std::memset(buf, 0xcc, sizeof buf);
  Req req = MakeReq(0, 16, 1, V4({10, 0, 0, 1}, 1), V6(kV6a, 2));
  EXPECT_EQ(EncodeReq(req, buf, sizeof buf), 0u);
  req = MakeReq(0, 16, 1, V6(kV6a, 2), V4({10, 0, 0, 1}, 1));
  EXPECT_EQ(EncodeReq(req, buf, sizeof buf), 0u);
  // Nothing was written.
  for (uint8_t c : buf) EXPECT_EQ(c, 0xcc);
}

TEST(VerbsWire, EncodeRefusesSmallBuffer) {
  uint8_t buf[128];
  for (size_t cap = 0; cap < kReqSize; ++cap) {
    std::memset(buf, 0xcc, sizeof buf);
    EXPECT_EQ(EncodeReq(SampleReqV4(), buf, cap), 0u) << cap;
    for (uint8_t c : buf) ASSERT_EQ(c, 0xcc) << cap;
  }
  for (size_t cap = 0; cap < kRepSize; ++cap)
    EXPECT_EQ(EncodeRep(SampleRep(), buf, cap), 0u) << cap;
  for (size_t cap = 0; cap < kHelloSize; ++cap)
    EXPECT_EQ(EncodeHello(SampleHello(), buf, cap), 0u) << cap;
  EXPECT_EQ(EncodeReq(SampleReqV4(), buf, kReqSize), kReqSize);
  EXPECT_EQ(EncodeReq(SampleReqV6(), buf, kMaxReqPrivateData), kReqSize);
  EXPECT_EQ(EncodeRep(SampleRep(), buf, kRepSize), kRepSize);
  EXPECT_EQ(EncodeHello(SampleHello(), buf, kHelloSize), kHelloSize);
}

// Random bytes behind a valid header never make a parser read past the end or crash, and
// whatever is accepted re-encodes to the same bytes.
TEST(VerbsWire, RandomBodiesAreSafe) {
  std::mt19937_64 rng(12345);
  auto check = [&](auto kind, uint32_t magic) {
    using K = decltype(kind);
    for (int iter = 0; iter < 20000; ++iter) {
      Bytes b(K::kSize + rng() % 8);
      for (auto& c : b) c = uint8_t(rng());
      PutLe(&b, kMagicAt, magic, 4);
      PutLe(&b, kVersionAt, kVersion, 1);
      typename K::Msg m;
      if (ParseGuarded<K>(b, &m) != ParseResult::kOk) continue;
      uint8_t buf[128];
      ASSERT_EQ(K::Encode(m, buf, sizeof buf), K::kSize);
      ASSERT_EQ(std::memcmp(buf, b.data(), K::kSize), 0);
    }
  };
  check(ReqKind{}, kReqMagic);
  check(RepKind{}, kRepMagic);
  check(HelloKind{}, kHelloMagic);
}

// ---------------------------------------------------------------------------------------------

TEST(VerbsNote, KindForAllFour) {
  for (Note n : {Note::kData, Note::kCredit, Note::kEof, Note::kClosed}) {
    for (uint64_t cursor : {uint64_t(0), uint64_t(1), uint64_t(kNoteValueMask),
                            uint64_t(kNoteValueMask) + 1, ~uint64_t(0), uint64_t(0x123456789)}) {
      const uint32_t note = EncodeNote(n, cursor);
      EXPECT_EQ(NoteKind(note), n) << int(n) << " " << cursor;
      EXPECT_EQ(note & kNoteValueMask, uint32_t(cursor & kNoteValueMask));
    }
  }
  EXPECT_EQ(EncodeNote(Note::kData, 5), 5u);
  EXPECT_EQ(EncodeNote(Note::kCredit, 5), 0x40000005u);
  EXPECT_EQ(EncodeNote(Note::kEof, 5), 0x80000005u);
  EXPECT_EQ(EncodeNote(Note::kClosed, 5), 0xc0000005u);
  EXPECT_EQ(NoteKind(0x3fffffffu), Note::kData);
  EXPECT_EQ(NoteKind(0x40000000u), Note::kCredit);
  EXPECT_EQ(NoteKind(0xbfffffffu), Note::kEof);
  EXPECT_EQ(NoteKind(0xffffffffu), Note::kClosed);
}

TEST(VerbsNote, CursorSimpleCases) {
  EXPECT_EQ(NoteCursor(EncodeNote(Note::kData, 0), 0), 0u);
  EXPECT_EQ(NoteCursor(EncodeNote(Note::kData, 100), 0), 100u);
  EXPECT_EQ(NoteCursor(EncodeNote(Note::kCredit, 100), 100), 100u);
  // Across one 2^30 wrap.
  const uint64_t last = (uint64_t(1) << 30) - 10;
  EXPECT_EQ(NoteCursor(EncodeNote(Note::kData, last + 20), last), last + 20);
  EXPECT_EQ(NoteCursor(EncodeNote(Note::kClosed, last + 20), last), last + 20);
  // The largest step: 2^30 - 1.
  EXPECT_EQ(NoteCursor(EncodeNote(Note::kEof, last + kNoteValueMask), last), last + kNoteValueMask);
  // Near the top of 64 bits, and across the 32-bit wrap.
  const uint64_t high = ~uint64_t(0) - (uint64_t(1) << 31);
  EXPECT_EQ(NoteCursor(EncodeNote(Note::kData, high + 12345), high), high + 12345);
  const uint64_t w32 = (uint64_t(1) << 32) - 3;
  EXPECT_EQ(NoteCursor(EncodeNote(Note::kCredit, w32 + 7), w32), w32 + 7);
}

// Property: for any cursor and any step below 2^30, the note of the new cursor extends back to
// it from the old one, whatever the kind, however many 2^30 wraps lie behind.
TEST(VerbsNote, CursorExtendsAcrossWraps) {
  std::mt19937_64 rng(0x51495053);
  const Note kinds[] = {Note::kData, Note::kCredit, Note::kEof, Note::kClosed};
  for (int iter = 0; iter < 1000000; ++iter) {
    uint64_t last = rng();
    switch (iter % 4) {
      case 0:
        break;  // anywhere in 64 bits (wrapping at 2^64 is fine: cursors are modular)
      case 1:
        last &= (uint64_t(1) << 40) - 1;  // realistic sizes
        break;
      case 2:  // right below a 2^30 boundary
        last = (last & ~uint64_t(kNoteValueMask)) | (kNoteValueMask - rng() % 64);
        break;
      case 3:  // right at or after one
        last = (last & ~uint64_t(kNoteValueMask)) | (rng() % 64);
        break;
    }
    uint64_t delta = rng() & kNoteValueMask;
    if (iter % 7 == 0) delta = kNoteValueMask - rng() % 16;  // the largest steps
    const uint64_t cursor = last + delta;
    const Note kind = kinds[rng() % 4];
    const uint32_t note = EncodeNote(kind, cursor);
    ASSERT_EQ(NoteCursor(note, last), cursor) << "last " << last << " delta " << delta;
    ASSERT_EQ(NoteKind(note), kind);
  }
}

// A cursor that walks many times around 2^30 in random steps, as a connection's would.
TEST(VerbsNote, CursorWalk) {
  std::mt19937_64 rng(7);
  uint64_t sender = 0, receiver = 0;
  for (int i = 0; i < 100000; ++i) {
    sender += rng() % (uint64_t(1) << 30);
    receiver = NoteCursor(EncodeNote(Note::kData, sender), receiver);
    ASSERT_EQ(receiver, sender) << i;
  }
  EXPECT_GT(sender >> 30, 1000u);  // well over a thousand wraps
}

static_assert(NoteCursor(EncodeNote(Note::kData, (uint64_t(1) << 30) + 5),
                         (uint64_t(1) << 30) - 5) == (uint64_t(1) << 30) + 5);
static_assert(NoteKind(EncodeNote(Note::kClosed, ~uint64_t(0))) == Note::kClosed);

LinkMsg MakeLink(LinkKind kind, uint8_t ring_log2, bool accepted, uint64_t nonce,
                 uint16_t client_port, uint16_t server_port) {
  LinkMsg m;
  m.kind = kind;
  m.ring_log2 = ring_log2;
  m.accepted = accepted;
  m.nonce = nonce;
  m.client_port = client_port;
  m.server_port = server_port;
  return m;
}

std::vector<LinkMsg> ValidLinks() {
  return {
      MakeLink(LinkKind::kParked, 0, false, 0, 0, 0),
      MakeLink(LinkKind::kClaim, 20, false, 0x0102030405060708, 40000, 443),
      MakeLink(LinkKind::kClaim, kMinRingLog2, false, 0, 1, 65535),
      MakeLink(LinkKind::kClaim, kMaxRingLog2, false, ~uint64_t(0), 65535, 1),
      MakeLink(LinkKind::kAnswer, 0, true, 0x0102030405060708, 0, 0),
      MakeLink(LinkKind::kAnswer, 0, false, 7, 0, 0),
      MakeLink(LinkKind::kTaken, 0, false, 0x0102030405060708, 0, 0),
  };
}

TEST(VerbsLink, RoundTripsPrefixesAndLongerBuffers) {
  for (const LinkMsg& m : ValidLinks()) {
    ExpectRoundTrip<LinkKind_>(m);
    ExpectEveryPrefixShort<LinkKind_>(m);
    ExpectLongerBufferParses<LinkKind_>(m);
  }
}

TEST(VerbsLink, GoldenBytes) {
  const LinkMsg claim = MakeLink(LinkKind::kClaim, 20, false, 0x0102030405060708, 0x1234, 0xabcd);
  const Bytes golden = FromHex("534c4c4b 01 02 14 00 0807060504030201 3412 cdab");
  EXPECT_EQ(Encode<LinkKind_>(claim), golden);
  LinkMsg back;
  ASSERT_EQ(ParseGuarded<LinkKind_>(golden, &back), ParseResult::kOk);
  EXPECT_TRUE(LinkKind_::Same(back, claim));
}

// Each kind's unused fields must be zero, its used ones in range; unknown kinds refused.
TEST(VerbsLink, FieldsPerKind) {
  constexpr size_t kKindAt = 5, kRingAt = 6, kAcceptedAt = 7, kNonceAt = 8, kClientAt = 16,
                   kServerAt = 18;
  const LinkMsg parked = MakeLink(LinkKind::kParked, 0, false, 0, 0, 0);
  for (size_t at : {kRingAt, kAcceptedAt, kNonceAt, kClientAt, kServerAt})
    EXPECT_EQ(ResultWith<LinkKind_>(parked, at, 1, 1), ParseResult::kBadField) << at;
  for (uint64_t kind : {0, 5, 255})
    EXPECT_EQ(ResultWith<LinkKind_>(parked, kKindAt, kind, 1), ParseResult::kBadField) << kind;
  const LinkMsg claim = MakeLink(LinkKind::kClaim, 16, false, 9, 1000, 2000);
  EXPECT_EQ(ResultWith<LinkKind_>(claim, kAcceptedAt, 1, 1), ParseResult::kBadField);
  EXPECT_EQ(ResultWith<LinkKind_>(claim, kClientAt, 0, 2), ParseResult::kBadField);
  EXPECT_EQ(ResultWith<LinkKind_>(claim, kServerAt, 0, 2), ParseResult::kBadField);
  EXPECT_EQ(ResultWith<LinkKind_>(claim, kRingAt, kMinRingLog2 - 1, 1), ParseResult::kBadField);
  EXPECT_EQ(ResultWith<LinkKind_>(claim, kRingAt, kMaxRingLog2 + 1, 1), ParseResult::kBadField);
  const LinkMsg answer = MakeLink(LinkKind::kAnswer, 0, true, 9, 0, 0);
  EXPECT_EQ(ResultWith<LinkKind_>(answer, kAcceptedAt, 2, 1), ParseResult::kBadField);
  EXPECT_EQ(ResultWith<LinkKind_>(answer, kRingAt, 16, 1), ParseResult::kBadField);
  EXPECT_EQ(ResultWith<LinkKind_>(answer, kClientAt, 5, 2), ParseResult::kBadField);
  const LinkMsg taken = MakeLink(LinkKind::kTaken, 0, false, 9, 0, 0);
  for (size_t at : {kRingAt, kAcceptedAt, kClientAt, kServerAt})
    EXPECT_EQ(ResultWith<LinkKind_>(taken, at, 1, 1), ParseResult::kBadField) << at;
  // Another message's magic is not a link message, and a link message fits a receive buffer.
  EXPECT_EQ(ParseGuarded<LinkKind_>(Encode<HelloKind>(SampleHello())), ParseResult::kBadMagic);
  EXPECT_LE(kLinkSize, size_t(32));
}

struct RejKind {
  using Msg = Rej;
  static constexpr size_t kSize = kRejSize;
  static constexpr const char* kName = "Rej";
  static size_t Encode(const Msg& m, uint8_t* out, size_t cap) { return EncodeRej(m, out, cap); }
  static ParseResult Parse(const uint8_t* d, size_t n, Msg* m) { return ParseRej(d, n, m); }
  static bool Same(const Msg& a, const Msg& b) { return a.code == b.code && a.port == b.port; }
};

// A REJECT's private data arrives padded (IB CM: 148 bytes): the padding is not looked at.
TEST(VerbsRej, RoundTripGoldenAndPadding) {
  Rej rej;
  ExpectRoundTrip<RejKind>(rej);
  ExpectEveryPrefixShort<RejKind>(rej);
  ExpectLongerBufferParses<RejKind>(rej);
  const Bytes golden = FromHex("534c524a 01 01 0000");
  EXPECT_EQ(Encode<RejKind>(rej), golden);
  Bytes padded = golden;
  padded.resize(148, 0xab);
  Rej back;
  back.code = RejCode(0);
  ASSERT_EQ(ParseGuarded<RejKind>(padded, &back), ParseResult::kOk);
  EXPECT_EQ(back.code, RejCode::kMemberElsewhere);
  Rej redirect;
  redirect.code = RejCode::kRedirect;
  redirect.port = 0x1234;
  ExpectRoundTrip<RejKind>(redirect);
  EXPECT_EQ(Encode<RejKind>(redirect), FromHex("534c524a 01 02 3412"));
}

TEST(VerbsRej, UnknownCodesAndPaddingRefused) {
  const Rej rej;
  for (uint64_t code : {0, 3, 255})
    EXPECT_EQ(ResultWith<RejKind>(rej, 5, code, 1), ParseResult::kBadField) << code;
  // "Elsewhere" names no port; a redirect names one.
  EXPECT_EQ(ResultWith<RejKind>(rej, 6, 1, 2), ParseResult::kBadField);
  EXPECT_EQ(ResultWith<RejKind>(rej, 5, 2, 1), ParseResult::kBadField);
  ExpectRejectLeavesOutput<RejKind>(rej, 5, 9, 1);
  // A REP is not a REJECT's data (a peer cannot turn one into the other).
  EXPECT_EQ(ParseGuarded<RejKind>(Encode<RepKind>(SampleRep())), ParseResult::kBadMagic);
  EXPECT_EQ(ParseRej(nullptr, 8, nullptr), ParseResult::kShort);
}

TEST(VerbsNote, ClosedCarriesWhetherTheEndLingers) {
  EXPECT_EQ(NoteKind(EncodeNote(Note::kClosed, kClosedLingers)), Note::kClosed);
  EXPECT_EQ(EncodeNote(Note::kClosed, kClosedLingers) & kNoteValueMask, kClosedLingers);
  EXPECT_EQ(EncodeNote(Note::kClosed, 0) & kNoteValueMask, 0u);
}

}  // namespace
}  // namespace slip::verbs
