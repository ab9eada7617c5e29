// The wire the NCCL face adds (shm/msg_wire.h) and the ABI layouts it declares
// (ncclnet-plugin/nccl_abi.h).
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>

#include "ncclnet-plugin/nccl_abi.h"
#include "shm/msg_wire.h"

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
