// The shim's fabric rendezvous datagrams (fabric/stream_wire.h) as anybody who can reach a
// listener's UDP port could write them, and the notes that ride on its writes'
// remote CQ data (fabric/stream_note.h).
#include <gtest/gtest.h>

#include <cstring>

#include "fabric/stream_note.h"
#include "fabric/stream_wire.h"

namespace slip::fabric {
namespace {

using streamwire::Message;
using streamwire::Type;

Message SampleReq() {
  Message m;
  m.type = Type::kReq;
  m.ring_log2 = 20;
  m.nonce = 0x1122334455667788ull;
  m.client.family = 4;
  m.client.port = 40001;
  m.client.addr[0] = 10, m.client.addr[3] = 7;
  m.server.family = 4;
  m.server.port = 5201;
  m.server.addr[0] = 10, m.server.addr[3] = 9;
  m.ring_key = 0xdeadbeef12345678ull;
  m.ring_addr = 0x7f1234560000ull;
  m.note_tag = 0x123456;
  m.address_len = 24;
  for (size_t i = 0; i < m.address_len; ++i) m.address[i] = uint8_t(i + 1);
  return m;
}

TEST(FabricStreamWire, RoundTripsEveryType) {
  for (Type type : {Type::kReq, Type::kRep, Type::kRefuse}) {
    Message m = SampleReq();
    m.type = type;
    if (type == Type::kRefuse) {
      Message refuse;
      refuse.type = Type::kRefuse;
      refuse.ring_log2 = 0;
      refuse.nonce = m.nonce;
      refuse.client = m.client;
      refuse.server = m.server;
      m = refuse;
    }
    uint8_t buf[streamwire::kBytes];
    ASSERT_TRUE(streamwire::Encode(m, buf));
    Message out;
    ASSERT_TRUE(streamwire::Parse(buf, sizeof(buf), &out));
    EXPECT_EQ(out.type, type);
    EXPECT_EQ(out.nonce, m.nonce);
    EXPECT_TRUE(out.client == m.client && out.server == m.server);
    EXPECT_EQ(out.ring_log2, m.ring_log2);
    EXPECT_EQ(out.ring_key, m.ring_key);
    EXPECT_EQ(out.ring_addr, m.ring_addr);
    EXPECT_EQ(out.note_tag, m.note_tag);
    EXPECT_EQ(out.note_bytes, type == Type::kRefuse ? 0 : 8);
    EXPECT_EQ(out.address_len, m.address_len);
    EXPECT_EQ(0, std::memcmp(out.address, m.address, sizeof(out.address)));
  }
}

TEST(FabricStreamWire, SaysTheNotesForm) {
  Message m = SampleReq();
  m.note_bytes = 4;
  uint8_t buf[streamwire::kBytes];
  ASSERT_TRUE(streamwire::Encode(m, buf));
  Message out;
  ASSERT_TRUE(streamwire::Parse(buf, sizeof(buf), &out));
  EXPECT_EQ(out.note_bytes, 4);
  m.note_bytes = 2;  // neither form
  EXPECT_FALSE(streamwire::Encode(m, buf));
  EXPECT_EQ(streamwire::RingLog2(4096), 12);
  EXPECT_EQ(streamwire::RingLog2(1u << 30), 30);
}

// Puts the notes' form `form` where `encoded` has `had` (found against `model`: the same
// message encoded in `form`): the parser must refuse the bytes and leave its output as it
// was.
void ExpectRefusedAsForm(uint8_t* encoded, uint8_t had, const uint8_t* model, uint8_t form) {
  size_t form_at = 0;
  for (size_t i = 0; i < streamwire::kBytes; ++i)
    if (encoded[i] == had && model[i] == form) form_at = i;
  ASSERT_NE(form_at, 0u);
  encoded[form_at] = form;
  const Message untouched = SampleReq();
  Message out = untouched;
  EXPECT_FALSE(streamwire::Parse(encoded, streamwire::kBytes, &out));
  EXPECT_EQ(out.nonce, untouched.nonce);
}

TEST(FabricStreamWire, CursorNotesOnlyBetweenConnectedEndpoints) {
  Message m = SampleReq();
  m.note_bytes = streamwire::kNoteLinkCursor;
  uint8_t buf[streamwire::kBytes];
  // Over reliable datagrams anybody who reaches the endpoint could move a tagless cursor.
  EXPECT_FALSE(streamwire::Encode(m, buf));
  m.endpoints = streamwire::Endpoints::kConnected;
  m.address_len = 0;  // (a connected client's REQ has no address)
  std::memset(m.address, 0, sizeof(m.address));
  ASSERT_TRUE(streamwire::Encode(m, buf));
  Message out;
  ASSERT_TRUE(streamwire::Parse(buf, sizeof(buf), &out));
  EXPECT_EQ(out.note_bytes, streamwire::kNoteLinkCursor);
  // The same bytes naming reliable datagrams: refused by the parser too.
  m.endpoints = streamwire::Endpoints::kReliableDatagram;
  m.note_bytes = streamwire::kNoteWords;
  m.address_len = 8;
  uint8_t rdm[streamwire::kBytes];
  ASSERT_TRUE(streamwire::Encode(m, rdm));
  ExpectRefusedAsForm(rdm, streamwire::kNoteWords, buf, streamwire::kNoteLinkCursor);
}

// Sends (no RMA): connected endpoints only, no ring in the sender's memory to name, rings
// whose cursors fit the notes' 30 bits.
TEST(FabricStreamWire, SendsNameNoRingAndFitTheirCursors) {
  Message m = SampleReq();
  m.note_bytes = streamwire::kNoteSends;
  m.endpoints = streamwire::Endpoints::kConnected;
  m.address_len = 0;
  std::memset(m.address, 0, sizeof(m.address));
  uint8_t buf[streamwire::kBytes];
  EXPECT_FALSE(streamwire::Encode(m, buf));  // (SampleReq names a key and an address)
  m.ring_key = 0;
  m.ring_addr = 0;
  ASSERT_TRUE(streamwire::Encode(m, buf));
  Message out;
  ASSERT_TRUE(streamwire::Parse(buf, sizeof(buf), &out));
  EXPECT_EQ(out.note_bytes, streamwire::kNoteSends);
  m.ring_log2 = streamwire::kSendsMaxRingLog2 + 1;
  EXPECT_FALSE(streamwire::Encode(m, buf));
  m.ring_log2 = streamwire::kSendsMaxRingLog2;
  m.endpoints = streamwire::Endpoints::kReliableDatagram;
  m.address_len = 8;
  EXPECT_FALSE(streamwire::Encode(m, buf));
  // A parser sees the same: the form with a key, or over reliable datagrams, is refused.
  m.endpoints = streamwire::Endpoints::kConnected;
  m.address_len = 0;
  ASSERT_TRUE(streamwire::Encode(m, buf));
  Message keyed = m;
  keyed.note_bytes = streamwire::kNoteLinkCursor;
  keyed.ring_key = 0x0102030405060708;
  uint8_t with_key[streamwire::kBytes];
  ASSERT_TRUE(streamwire::Encode(keyed, with_key));
  ExpectRefusedAsForm(with_key, streamwire::kNoteLinkCursor, buf, streamwire::kNoteSends);
}

TEST(FabricStreamNote, CursorNotesExtendFromTheReceiversCopy) {
  using note::Kind;
  for (Kind kind : {Kind::kData, Kind::kCredit, Kind::kEof, Kind::kClosed})
    EXPECT_EQ(note::LinkKindOf(note::EncodeLink(kind, 12345)), kind);
  // Ahead by up to a 256 MiB ring, across the 30-bit wrap: the whole cursor.
  const uint64_t known = (uint64_t(7) << 30) - 100;
  const uint64_t ahead = known + (uint64_t(1) << note::kLinkMaxRingLog2);
  EXPECT_EQ(note::LinkCursor(note::EncodeLink(Kind::kData, ahead), known), ahead);
  EXPECT_EQ(note::LinkCursor(note::EncodeLink(Kind::kData, known), known), known);
  // Behind (taken out of order): behind, never a cursor a whole space ahead.
  const uint64_t behind = known - 5000;
  EXPECT_EQ(note::LinkCursor(note::EncodeLink(Kind::kCredit, behind), known), behind);
  // The same cursor from a copy that moved on meanwhile.
  EXPECT_EQ(note::LinkCursor(note::EncodeLink(Kind::kData, ahead), ahead + 10), ahead);
}

TEST(FabricStreamWire, RejectsWhatNoSenderWrites) {
  uint8_t good[streamwire::kBytes];
  ASSERT_TRUE(streamwire::Encode(SampleReq(), good));
  const Message untouched = SampleReq();
  auto rejected = [&](const uint8_t* buf, size_t len) {
    Message out = untouched;
    const bool ok = streamwire::Parse(buf, len, &out);
    // A rejection leaves the output as it was.
    EXPECT_EQ(0, std::memcmp(&out, &untouched, sizeof(out)));
    return !ok;
  };
  EXPECT_TRUE(rejected(good, sizeof(good) - 1));  // short
  EXPECT_TRUE(rejected(nullptr, 0));
  struct Flip {
    size_t offset;
    uint8_t value;
    const char* what;
  };
  const Flip flips[] = {
      {0, 0x00, "magic"},
      {4, 2, "version"},
      {5, 0, "type 0"},
      {5, 4, "unknown type"},
      {6, 11, "ring below 4 KiB"},
      {6, 31, "ring above 1 GiB"},
      {7, 0, "no address"},
      {7, 65, "address longer than the field"},
      {17, 1, "endpoint padding"},
      {16, 5, "endpoint family"},
      {16 + 2 * 20 + 16 + 3, 1, "tag beyond 24 bits"},
      {16 + 2 * 20 + 16 + 4, 1, "notes of neither form"},
      {16 + 2 * 20 + 16 + 4, 0, "no notes form"},
      {16 + 2 * 20 + 16 + 5, 0, "no endpoints type"},
      {16 + 2 * 20 + 16 + 5, 3, "unknown endpoints type"},
      {16 + 2 * 20 + 16 + 6, 1, "padding after the endpoints type"},
      {16 + 2 * 20 + 16 + 7, 1, "padding before the address"},
      {streamwire::kBytes - 1, 1, "bytes past the address"},
  };
  for (const Flip& f : flips) {
    uint8_t bad[streamwire::kBytes];
    std::memcpy(bad, good, sizeof(bad));
    bad[f.offset] = f.value;
    EXPECT_TRUE(rejected(bad, sizeof(bad))) << f.what;
  }
  // A tag of zero names no connection.
  Message zero_tag = SampleReq();
  zero_tag.note_tag = 0;
  uint8_t buf[streamwire::kBytes];
  EXPECT_FALSE(streamwire::Encode(zero_tag, buf));
  // A REFUSE carries no ring and no address.
  Message refuse;
  refuse.type = Type::kRefuse;
  ASSERT_TRUE(streamwire::Encode(refuse, buf));
  buf[16 + 2 * 20] = 1;  // a ring key
  EXPECT_TRUE(rejected(buf, sizeof(buf)));
}

// Connected endpoints: the client has no address before it connects (its REQ carries
// none), the listener's REP says where its connection listener is.
TEST(FabricStreamWire, SaysTheEndpointsType) {
  Message req = SampleReq();
  req.endpoints = streamwire::Endpoints::kConnected;
  uint8_t buf[streamwire::kBytes];
  EXPECT_FALSE(streamwire::Encode(req, buf));  // a connected REQ with an address
  req.address_len = 0;
  std::memset(req.address, 0, sizeof(req.address));
  ASSERT_TRUE(streamwire::Encode(req, buf));
  Message out;
  ASSERT_TRUE(streamwire::Parse(buf, sizeof(buf), &out));
  EXPECT_EQ(out.endpoints, streamwire::Endpoints::kConnected);
  EXPECT_EQ(out.address_len, 0);
  // A REP without the listener's address, or a datagram REQ without its endpoint's.
  Message rep = req;
  rep.type = Type::kRep;
  EXPECT_FALSE(streamwire::Encode(rep, buf));
  Message rdm = req;
  rdm.endpoints = streamwire::Endpoints::kReliableDatagram;
  EXPECT_FALSE(streamwire::Encode(rdm, buf));
  // On the wire too: the connected REQ turned into a REP is rejected.
  ASSERT_TRUE(streamwire::Encode(req, buf));
  buf[5] = uint8_t(Type::kRep);
  EXPECT_FALSE(streamwire::Parse(buf, sizeof(buf), &out));
}

// What a client's fi_connect carries: the listener's connection and the REQ's nonce.
TEST(FabricStreamWire, LinkParamRoundTripsAndRejects) {
  streamwire::LinkParam p;
  p.server_tag = 0x00abcd;
  p.nonce = 0x0102030405060708ull;
  uint8_t buf[streamwire::kLinkBytes];
  streamwire::EncodeLink(p, buf);
  streamwire::LinkParam out;
  ASSERT_TRUE(streamwire::ParseLink(buf, sizeof(buf), &out));
  EXPECT_EQ(out.server_tag, p.server_tag);
  EXPECT_EQ(out.nonce, p.nonce);
  const streamwire::LinkParam sentinel{7, 7};
  auto rejected = [&](const uint8_t* in, size_t len) {
    streamwire::LinkParam o = sentinel;
    const bool ok = streamwire::ParseLink(in, len, &o);
    EXPECT_TRUE(o.server_tag == 7 && o.nonce == 7);
    return !ok;
  };
  EXPECT_TRUE(rejected(buf, sizeof(buf) - 1));
  EXPECT_TRUE(rejected(nullptr, 0));
  uint8_t bad[streamwire::kLinkBytes];
  std::memcpy(bad, buf, sizeof(bad));
  bad[0] ^= 1;  // magic
  EXPECT_TRUE(rejected(bad, sizeof(bad)));
  std::memcpy(bad, buf, sizeof(bad));
  bad[4] = bad[5] = bad[6] = 0;  // tag 0
  EXPECT_TRUE(rejected(bad, sizeof(bad)));
  std::memcpy(bad, buf, sizeof(bad));
  bad[7] = 1;  // a tag beyond 24 bits
  EXPECT_TRUE(rejected(bad, sizeof(bad)));
}

TEST(FabricStreamNote, CarriesTagKindAndCursor) {
  const uint64_t n = note::Encode(0xabcdef, note::Kind::kData, (uint64_t(5) << 36) + 12345);
  EXPECT_EQ(note::TagOf(n), 0xabcdefu);
  EXPECT_EQ(note::KindOf(n), note::Kind::kData);
  // The receiver extends the low 36 bits from what it knows.
  const uint64_t known = (uint64_t(5) << 36) + 100;
  EXPECT_EQ(known + note::Ahead(n, known), (uint64_t(5) << 36) + 12345);
  // Across the 36-bit wrap.
  const uint64_t before_wrap = (uint64_t(6) << 36) - 10;
  const uint64_t after = note::Encode(1, note::Kind::kCredit, (uint64_t(6) << 36) + 20);
  EXPECT_EQ(note::Ahead(after, before_wrap), 30u);
  EXPECT_FALSE(note::Stale(note::Ahead(after, before_wrap)));
  // A note behind what is known (taken out of order by another poller) is stale.
  const uint64_t old = note::Encode(1, note::Kind::kData, known - 50);
  EXPECT_TRUE(note::Stale(note::Ahead(old, known)));
  // The whole cursor: extended, across the wrap, and `known` itself for a stale note.
  EXPECT_EQ(note::Cursor(n, known), (uint64_t(5) << 36) + 12345);
  EXPECT_EQ(note::Cursor(after, before_wrap), (uint64_t(6) << 36) + 20);
  EXPECT_EQ(note::Cursor(old, known), known);
  EXPECT_EQ(note::Cursor(note::Encode(1, note::Kind::kData, known), known), known);
}

TEST(FabricStreamNote, ShortNotesNameTagAndKindOnly) {
  const uint64_t n = note::EncodeShort(0xabcdef, note::Kind::kClosed);
  EXPECT_LE(n, 0xffffffffu);  // 4 bytes of CQ data
  EXPECT_EQ(note::ShortTagOf(n), 0xabcdefu);
  EXPECT_EQ(note::ShortKindOf(n), note::Kind::kClosed);
  EXPECT_TRUE(note::ShortWellFormed(n));
  EXPECT_FALSE(note::ShortWellFormed(n | 1));                  // the low bits
  EXPECT_FALSE(note::ShortWellFormed(n | uint64_t(1) << 40));  // past 4 bytes
  // Data and the end of the stream move `produced`; credit and CLOSED `consumed`.
  EXPECT_EQ(note::WordOffset(note::Kind::kData), note::WordOffset(note::Kind::kEof));
  EXPECT_EQ(note::WordOffset(note::Kind::kCredit), note::WordOffset(note::Kind::kClosed));
  EXPECT_NE(note::WordOffset(note::Kind::kData), note::WordOffset(note::Kind::kCredit));
  EXPECT_LE(note::kConsumedWord + 8, note::kWordBytes);
}

}  // namespace
}  // namespace slip::fabric
