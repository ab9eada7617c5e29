// The wire the NCCL face adds (shm/msg_wire.h, verbs/msg_wire.h) and the ABI layouts it
// declares (ncclnet-plugin/nccl_abi.h).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstddef>
#include <cstring>
#include <tuple>
#include <utility>

#include "ncclnet-plugin/nccl_abi.h"
#include "shm/msg_wire.h"
#include "verbs/msg_wire.h"

namespace {

using namespace slip::shm::msgwire;

Handle SampleHandle() {
  Handle h;
  for (size_t i = 0; i < kHostIdBytes; ++i) h.host.bytes[i] = uint8_t(i * 3 + 1);
  h.uid = 1000;
  h.pid = 4242;
  h.name_token = 0x1122334455667788ull;
  h.secret = 0x99aabbccddeeff00ull;
  return h;
}

TEST(NcclWire, HandleRoundTripsWithinNcclsHandleSize) {
  uint8_t buf[slip::msg::kHandleBytes];
  std::memset(buf, 0xff, sizeof(buf));
  EncodeHandle(SampleHandle(), buf);
  for (size_t i = kHandleWireBytes; i < sizeof(buf); ++i) EXPECT_EQ(buf[i], 0) << i;
  Handle out;
  ASSERT_TRUE(ParseHandle(buf, sizeof(buf), &out));
  const Handle in = SampleHandle();
  EXPECT_TRUE(out.host == in.host);
  EXPECT_EQ(out.uid, in.uid);
  EXPECT_EQ(out.pid, in.pid);
  EXPECT_EQ(out.name_token, in.name_token);
  EXPECT_EQ(out.secret, in.secret);
}

TEST(NcclWire, HandleRejectsWhatIsNotOurs) {
  uint8_t buf[slip::msg::kHandleBytes];
  EncodeHandle(SampleHandle(), buf);
  Handle out;
  EXPECT_FALSE(ParseHandle(buf, kHandleWireBytes - 1, &out));  // short
  for (size_t byte : {0, 4, 6}) {                              // magic, version, flags
    uint8_t bad[sizeof(buf)];
    std::memcpy(bad, buf, sizeof(buf));
    bad[byte] ^= byte == 6 ? 2 : 1;  // (flags: bit 0 is kHandleInDir, bit 1 unknown)
    EXPECT_FALSE(ParseHandle(bad, sizeof(bad), &out)) << byte;
  }
  Handle zero_secret = SampleHandle();
  zero_secret.secret = 0;
  EncodeHandle(zero_secret, buf);
  EXPECT_FALSE(ParseHandle(buf, sizeof(buf), &out));
  Handle zero_pid = SampleHandle();
  zero_pid.pid = 0;
  EncodeHandle(zero_pid, buf);
  EXPECT_FALSE(ParseHandle(buf, sizeof(buf), &out));
}

TEST(NcclWire, HandleSaysWhetherItListensInTheDirectory) {
  uint8_t buf[slip::msg::kHandleBytes];
  Handle h = SampleHandle();
  h.flags = kHandleInDir;
  EncodeHandle(h, buf);
  Handle out;
  ASSERT_TRUE(ParseHandle(buf, sizeof(buf), &out));
  EXPECT_EQ(out.flags, kHandleInDir);
  HostId other = h.host;
  other.bytes[20] ^= 1;  // another network namespace of the same boot
  EXPECT_TRUE(other.SameBoot(h.host));
  EXPECT_FALSE(other == h.host);
  other.bytes[3] ^= 1;
  EXPECT_FALSE(other.SameBoot(h.host));
}

TEST(NcclWire, HelloIsExact) {
  uint8_t buf[kHelloBytes];
  EncodeHello({7, 8, 1 << 20}, buf);
  Hello out;
  ASSERT_TRUE(ParseHello(buf, sizeof(buf), &out));
  EXPECT_EQ(out.secret, 7u);
  EXPECT_EQ(out.region_nonce, 8u);
  EXPECT_EQ(out.ring_size, 1u << 20);
  EXPECT_FALSE(ParseHello(buf, sizeof(buf) - 1, &out));
  uint8_t longer[kHelloBytes + 1] = {};
  std::memcpy(longer, buf, sizeof(buf));
  EXPECT_FALSE(ParseHello(longer, sizeof(longer), &out));
  for (size_t byte = 0; byte < 8; ++byte) {
    uint8_t bad[kHelloBytes];
    std::memcpy(bad, buf, sizeof(buf));
    bad[byte] ^= 0x40;
    EXPECT_FALSE(ParseHello(bad, sizeof(bad), &out)) << byte;
  }
  uint8_t pad[kHelloBytes];
  std::memcpy(pad, buf, sizeof(buf));
  pad[kHelloBytes - 1] = 1;  // the reserved word
  EXPECT_FALSE(ParseHello(pad, sizeof(pad), &out));
  EncodeHello({0, 8, 1 << 20}, buf);
  EXPECT_FALSE(ParseHello(buf, sizeof(buf), &out));
}

TEST(NcclWire, CtsRecordsAreChecked) {
  CtsRecord r{};
  r.seq = 5;
  r.count = 2;
  r.entries[0] = {1, 0, 100};
  r.entries[1] = {2, 0, 200};
  EXPECT_TRUE(ValidCts(r, 5, 1000));
  EXPECT_FALSE(ValidCts(r, 6, 1000));  // out of order
  EXPECT_FALSE(ValidCts(r, 5, 150));   // a capacity beyond the limit
  r.count = 0;
  EXPECT_FALSE(ValidCts(r, 5, 1000));
  r.count = slip::msg::kMaxGroup + 1;
  EXPECT_FALSE(ValidCts(r, 5, 1000));
  // Records and frame headers never cross the ring's end.
  EXPECT_EQ(4096 % kCtsBytes, 0u);
  EXPECT_EQ(FrameBytes(0), sizeof(FrameHeader));
  EXPECT_EQ(FrameBytes(1), sizeof(FrameHeader) + kFrameAlign);
  EXPECT_EQ(FrameBytes(16), sizeof(FrameHeader) + 16);
  EXPECT_EQ(FrameBytes(17) % kFrameAlign, 0u);
}

TEST(NcclWire, ThisHostIsStable) {
  const HostId a = ThisHost(), b = ThisHost();
  EXPECT_TRUE(a == b);
  HostId zero;
  EXPECT_FALSE(a == zero);  // the boot id was read
}

// The layouts NCCL reads: where they differ between versions (NCCL's ext-net headers).
TEST(NcclAbi, LayoutsMatchNcclsHeaders) {
  EXPECT_EQ(sizeof(ncclNetProperties_v8_t), 64u);
  EXPECT_EQ(offsetof(ncclNetProperties_v8_t, speed), 32u);
  EXPECT_EQ(offsetof(ncclNetProperties_v9_t, forceFlush), 32u);
  EXPECT_EQ(offsetof(ncclNetProperties_v9_t, vProps), 64u);
  EXPECT_EQ(offsetof(ncclNetProperties_v9_t, maxP2pBytes), 88u);
  EXPECT_EQ(sizeof(ncclNetProperties_v9_t), 104u);
  EXPECT_EQ(offsetof(ncclNetProperties_v11_t, maxMultiRequestSize), 104u);
  EXPECT_EQ(sizeof(ncclNetProperties_v11_t), 112u);
  EXPECT_EQ(sizeof(ncclNetVDeviceProps_v9_t), 20u);
  EXPECT_EQ(sizeof(ncclNetAttr_v11_t), 44u);
  // name + one pointer per entry point.
  EXPECT_EQ(sizeof(ncclNet_v8_t), 19 * sizeof(void*));
  EXPECT_EQ(sizeof(ncclNet_v9_t), 20 * sizeof(void*));
  EXPECT_EQ(sizeof(ncclNet_v10_t), 20 * sizeof(void*));
  EXPECT_EQ(sizeof(ncclNet_v11_t), 22 * sizeof(void*));
  EXPECT_EQ(offsetof(ncclNet_v11_t, makeVDevice), 19 * sizeof(void*));
  EXPECT_EQ(offsetof(ncclNet_v11_t, setNetAttr), 21 * sizeof(void*));
}

}  // namespace

// verbs' message comms (verbs/msg_wire.h).
namespace vw = slip::verbs::msgwire;

TEST(VerbsMsgWire, HandleRoundTripsBothFamilies) {
  for (int family : {AF_INET, AF_INET6}) {
    SCOPED_TRACE(family);
    vw::Handle h;
    h.address.ss_family = sa_family_t(family);
    if (family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&h.address);
      in->sin_port = htons(40001);
      in->sin_addr.s_addr = htonl(0x0a4d0001);
    } else {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&h.address);
      in6->sin6_port = htons(40002);
      for (int i = 0; i < 16; ++i) in6->sin6_addr.s6_addr[i] = uint8_t(0xf0 + i);
    }
    for (size_t i = 0; i < sizeof(h.secret); ++i) h.secret[i] = uint8_t(i * 13);
    uint8_t wire[slip::msg::kHandleBytes] = {};
    vw::EncodeHandle(h, wire);
    vw::Handle back;
    ASSERT_TRUE(vw::ParseHandle(wire, sizeof(wire), &back));
    EXPECT_EQ(std::memcmp(&back.address, &h.address, sizeof(h.address)), 0);
    EXPECT_EQ(std::memcmp(back.secret, h.secret, sizeof(h.secret)), 0);
    // Short, or another magic, version or family: not a handle.
    EXPECT_FALSE(vw::ParseHandle(wire, vw::kHandleWireBytes - 1, &back));
    for (size_t at : {size_t(0), size_t(4), size_t(5)}) {
      uint8_t bad[sizeof(wire)];
      std::memcpy(bad, wire, sizeof(wire));
      bad[at] ^= 0x40;
      EXPECT_FALSE(vw::ParseHandle(bad, sizeof(bad), &back)) << at;
    }
  }
}

TEST(VerbsMsgWire, HandleRefusesPortZeroAndIpv4Tails) {
  vw::Handle h;
  auto* in = reinterpret_cast<sockaddr_in*>(&h.address);
  in->sin_family = AF_INET;
  in->sin_port = htons(1);
  uint8_t wire[slip::msg::kHandleBytes] = {};
  vw::EncodeHandle(h, wire);
  vw::Handle back;
  ASSERT_TRUE(vw::ParseHandle(wire, sizeof(wire), &back));
  wire[8 + 5] = 1;  // an IPv4 handle's address byte past the fourth
  EXPECT_FALSE(vw::ParseHandle(wire, sizeof(wire), &back));
  in->sin_port = 0;
  vw::EncodeHandle(h, wire);
  EXPECT_FALSE(vw::ParseHandle(wire, sizeof(wire), &back));
}

TEST(VerbsMsgWire, ConnectDataIsExactAndKindChecked) {
  vw::ConnectData d;
  for (size_t i = 0; i < sizeof(d.proof); ++i) d.proof[i] = uint8_t(i + 1);
  d.area = {0x00007f0012340000ull, 0xabcd};
  d.extra = 2;
  d.extra_qpn[0] = 0x12;
  d.extra_qpn[1] = 0xffffff;
  uint8_t wire[56] = {};  // rdma_cm pads private data with zeros
  ASSERT_EQ(vw::EncodeConnectData(vw::kMagic.request, d, wire, sizeof(wire)),
            vw::kConnectDataBytes);
  vw::ConnectData back;
  ASSERT_TRUE(vw::ParseConnectData(vw::kMagic.request, wire, sizeof(wire), &back));
  EXPECT_EQ(std::memcmp(back.proof, d.proof, sizeof(d.proof)), 0);
  EXPECT_EQ(back.area.addr, d.area.addr);
  EXPECT_EQ(back.area.rkey, d.area.rkey);
  EXPECT_EQ(back.extra, 2);
  EXPECT_EQ(back.extra_qpn[1], 0xffffffu);
  EXPECT_EQ(back.extra_qpn[2], 0u);
  // More queue pairs than a comm has, a number where none is said, one missing, or wider
  // than 24 bits: refused.
  for (auto [extra, qpn1, qpn2] : {std::tuple<uint8_t, uint32_t, uint32_t>{4, 1, 1},
                                   {2, 0x12, 0},
                                   {1, 0x12, 5},
                                   {2, 0x1000000, 1}}) {
    vw::ConnectData bad = d;
    bad.extra = extra;
    bad.extra_qpn[0] = qpn1;
    bad.extra_qpn[1] = qpn2;
    uint8_t w[56] = {};
    ASSERT_EQ(vw::EncodeConnectData(vw::kMagic.request, bad, w, sizeof(w)), vw::kConnectDataBytes);
    EXPECT_FALSE(vw::ParseConnectData(vw::kMagic.request, w, sizeof(w), &back)) << int(extra);
  }
  EXPECT_FALSE(vw::ParseConnectData(vw::kMagic.reply, wire, sizeof(wire), &back));  // a REQ
  EXPECT_FALSE(vw::ParseConnectData(vw::kMagic.request, wire, vw::kConnectDataBytes - 1, &back));
  EXPECT_FALSE(vw::ParseConnectData(vw::kMagic.request, nullptr, 0, &back));
  wire[6] = 1;  // padding
  EXPECT_FALSE(vw::ParseConnectData(vw::kMagic.request, wire, sizeof(wire), &back));
  EXPECT_EQ(vw::EncodeConnectData(vw::kMagic.request, d, wire, vw::kConnectDataBytes - 1), 0u);
}

TEST(VerbsMsgWire, CtsEntriesCarryTheirReceivesStamp) {
  vw::CtsEntry e;
  e.addr = 0x1000;
  e.rkey = 7;
  e.capacity = 4096;
  e.tag = -3;
  e.group = 8;
  e.stamp = vw::StampFor(41);
  uint8_t wire[vw::kCtsEntryBytes];
  vw::EncodeCts(e, wire);
  EXPECT_EQ(vw::CtsStamp(wire), e.stamp);
  vw::CtsEntry back;
  ASSERT_TRUE(vw::ParseCts(wire, vw::StampFor(41), &back));
  EXPECT_EQ(back.tag, -3);
  EXPECT_EQ(back.group, 8);
  EXPECT_FALSE(vw::ParseCts(wire, vw::StampFor(40), &back));  // the receive before's slot
  const uint8_t fresh[vw::kCtsEntryBytes] = {};
  EXPECT_FALSE(vw::ParseCts(fresh, vw::CtsStamp(fresh), &back));  // never written
  for (auto [group, capacity] : {std::pair<int, uint32_t>{0, 1}, {9, 1}, {1, 0x80000000u}}) {
    e.group = uint8_t(group);
    e.capacity = capacity;
    vw::EncodeCts(e, wire);
    EXPECT_FALSE(vw::ParseCts(wire, e.stamp, &back)) << group << " " << capacity;
  }
  EXPECT_NE(vw::StampFor(0xffffffffu), 0u);  // wrapped: still never a fresh slot's
}

TEST(VerbsMsgWire, ImmediateNamesReceiveAndBuffer) {
  for (uint32_t seq : {0u, 31u, vw::kImmSeqMask}) {
    for (uint32_t index : {0u, 7u}) {
      const uint32_t imm = vw::EncodeImm(seq, index);
      EXPECT_EQ(vw::ImmSeq(imm), seq);
      EXPECT_EQ(vw::ImmIndex(imm), index);
    }
  }
  // A grouped receive's immediate is never a single's, and its seq wraps within its field.
  EXPECT_EQ(vw::EncodeImm(0xffffffffu, 7) & vw::kImmSingle, 0u);
  EXPECT_EQ(vw::ImmSeq(vw::EncodeImm(vw::kImmSeqMask + 1, 0)), 0u);
}
