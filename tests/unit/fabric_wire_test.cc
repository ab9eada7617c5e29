// fabric's message wire (fabric/msg_wire.h): the handle, the REQ and REP of the exchange,
// and the tags, as a peer could write them.
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstring>

#include "fabric/msg_wire.h"

namespace slip::fabric::msgwire {
namespace {

Hello SampleHello(uint32_t magic) {
  Hello h;
  h.address_len = 16;
  for (size_t i = 0; i < 16; ++i) h.address[i] = uint8_t(0x30 + i);
  for (size_t i = 0; i < sizeof(h.proof); ++i) h.proof[i] = uint8_t(i * 11 + 5);
  h.tag_key = magic == kMagic.reply ? 0x1234567 : 0;
  return h;
}

TEST(FabricMsgWire, HelloRoundTrips) {
  for (uint32_t magic : {kMagic.request, kMagic.reply}) {
    uint8_t buf[kHelloBytes];
    ASSERT_TRUE(EncodeHello(magic, SampleHello(magic), buf));
    Hello out;
    ASSERT_TRUE(ParseHello(magic, buf, sizeof(buf), &out));
    EXPECT_EQ(out.address_len, 16);
    EXPECT_EQ(0, std::memcmp(out.address, SampleHello(magic).address, sizeof(out.address)));
    EXPECT_EQ(0, std::memcmp(out.proof, SampleHello(magic).proof, sizeof(out.proof)));
    EXPECT_EQ(out.tag_key, SampleHello(magic).tag_key);
    // The other kind's magic is not this one.
    EXPECT_FALSE(ParseHello(magic == kMagic.request ? kMagic.reply : kMagic.request, buf,
                            sizeof(buf), &out));
  }
}

TEST(FabricMsgWire, HelloRejectsWhatIsOutOfRange) {
  uint8_t good[kHelloBytes];
  ASSERT_TRUE(EncodeHello(kMagic.reply, SampleHello(kMagic.reply), good));
  Hello out;
  out.address_len = 0xee;
  auto rejected = [&](const uint8_t* b, size_t n) {
    return !ParseHello(kMagic.reply, b, n, &out) && out.address_len == 0xee;  // untouched
  };
  EXPECT_TRUE(rejected(good, kHelloBytes - 1));  // short
  uint8_t longer[kHelloBytes + 1] = {};
  std::memcpy(longer, good, kHelloBytes);
  EXPECT_TRUE(rejected(longer, sizeof(longer)));  // exactly kHelloBytes
  uint8_t bad[kHelloBytes];
  for (size_t at : {size_t(0), size_t(4), size_t(5), size_t(6), size_t(7), size_t(28 + 16)}) {
    std::memcpy(bad, good, sizeof(bad));
    bad[at] ^= at == 5 ? 0xff : 0x01;  // magic, version, address length, padding, past it
    EXPECT_TRUE(rejected(bad, sizeof(bad))) << at;
  }
  // A key of 0 or past 2^31 in a REP; any key in a REQ.
  for (uint32_t key : {0u, 0x80000000u}) {
    Hello h = SampleHello(kMagic.reply);
    h.tag_key = key;
    ASSERT_TRUE(EncodeHello(kMagic.reply, h, bad));
    EXPECT_TRUE(rejected(bad, sizeof(bad))) << key;
  }
  Hello req = SampleHello(kMagic.request);
  req.tag_key = 7;
  ASSERT_TRUE(EncodeHello(kMagic.request, req, bad));
  EXPECT_FALSE(ParseHello(kMagic.request, bad, sizeof(bad), &out));
  // An address that does not fit does not encode.
  Hello empty = SampleHello(kMagic.request);
  empty.address_len = 0;
  EXPECT_FALSE(EncodeHello(kMagic.request, empty, bad));
  empty.address_len = kMaxAddressBytes + 1;
  EXPECT_FALSE(EncodeHello(kMagic.request, empty, bad));
}

TEST(FabricMsgWire, HandleIsNotVerbs) {
  Handle h;
  auto* in = reinterpret_cast<sockaddr_in*>(&h.address);
  in->sin_family = AF_INET;
  in->sin_port = htons(5000);
  in->sin_addr.s_addr = htonl(0x7f000001);
  h.secret[0] = 9;
  uint8_t buf[msg::kHandleBytes] = {};
  EncodeHandle(h, buf);
  Handle out;
  ASSERT_TRUE(ParseHandle(buf, sizeof(buf), &out));
  EXPECT_EQ(reinterpret_cast<sockaddr_in*>(&out.address)->sin_port, htons(5000));
  EXPECT_EQ(out.secret[0], 9);
  // Another transport's handle with the same layout does not parse as ours.
  msg::EncodeAddressHandle(kMagic.handle + 1, kVersion, h, buf);
  EXPECT_FALSE(ParseHandle(buf, sizeof(buf), &out));
}

TEST(FabricMsgWire, TagsKeepDataAndControlApart) {
  EXPECT_EQ(DataTag(kMaxTagKey, -1) >> 63, 0u);  // no data tag has the control bit
  EXPECT_EQ(ControlTag(1) >> 63, 1u);
  EXPECT_NE(DataTag(1, 0), DataTag(2, 0));
  EXPECT_EQ(DataTag(3, 7) & 0xffffffffu, 7u);
}

}  // namespace
}  // namespace slip::fabric::msgwire
