// Tests for how an shm connection settles (ChannelControl::Settle, shm/channel.cc): the server's
// channel, installed held until its client's CONFIRM comes in band on the TCP anchor, and
// the client's, installed before the listener's answer to its registration came on the
// rendezvous socket. Either ends on the rings (kSettled), on TCP from byte 0 (kPlain), or
// in a reset; the claim word in the region decides, once, whether a CONFIRM comes.
//
// Both ends are built as the shim builds them (PrepareOffer, AcceptRegistration,
// MakeClientChannel) around a real TCP connection over loopback, whose two sockets are the
// anchors; a socketpair stands in for the client's rendezvous socket. The control thread's
// part (calling Settle, and OnAnchorReady once TCP carries the stream) is played by the
// tests, with the clock passed in: deadlines are reached without waiting for them.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/channel.h"
#include "core/stats.h"
#include "core/stream.h"
#include "core/sys.h"
#include "core/wire.h"
#include "shm/region.h"
#include "shm/shm.h"
#include "tests/unit/tcp_pair.h"

namespace slip::shm {
namespace {

using Settlement = ChannelControl::Settlement;

constexpr uint32_t kRing = 4096;
constexpr int kTimeoutMs = 60000;  // never reached by waiting: the tests pass the clock

void CloseIf(int* fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

std::vector<uint8_t> Bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& c : out) c = uint8_t(rng());
  return out;
}

std::vector<uint8_t> Encode(const wire::Message& msg) {
  std::vector<uint8_t> buf(wire::kMaxMessageSize);
  buf.resize(wire::EncodeMessage(msg, buf.data(), buf.size()));
  EXPECT_FALSE(buf.empty());
  return buf;
}
std::vector<uint8_t> ConfirmBytes(uint64_t nonce, uint32_t ring_size) {
  wire::Message msg;
  msg.type = wire::Type::kConfirm;
  msg.confirm = wire::Confirm{nonce, ring_size};
  return Encode(msg);
}
std::vector<uint8_t> AcceptBytes(uint64_t nonce) {
  wire::Message msg;
  msg.type = wire::Type::kAccept;
  msg.accept = wire::Accept{nonce};
  return Encode(msg);
}
std::vector<uint8_t> DeclineBytes(uint64_t nonce, wire::DeclineReason reason) {
  wire::Message msg;
  msg.type = wire::Type::kDecline;
  msg.decline = wire::Decline{nonce, reason};
  return Encode(msg);
}

void SendAll(int fd, const std::vector<uint8_t>& bytes) {
  ASSERT_EQ(send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()))
      << std::strerror(errno);
}

// What `fd` holds: waits up to `timeout_ms` for `at_least` bytes, then takes what is there.
std::vector<uint8_t> ReadSome(int fd, size_t at_least, int timeout_ms = 2000) {
  std::vector<uint8_t> out;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  uint8_t buf[65536];
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      out.insert(out.end(), buf, buf + n);
      continue;
    }
    if (n == 0 || out.size() >= at_least || std::chrono::steady_clock::now() > deadline) break;
    pollfd pfd{fd, POLLIN, 0};
    poll(&pfd, 1, 10);
  }
  return out;
}

// True when nothing waits on `fd` to be read (and it is not at EOF), after a short grace.
bool NothingToRead(int fd) {
  pollfd pfd{fd, POLLIN, 0};
  if (poll(&pfd, 1, 50) != 0) return false;
  char c;
  return recv(fd, &c, 1, MSG_DONTWAIT | MSG_PEEK) == -1 && errno == EAGAIN;
}

// ---------------------------------------------------------------------------- the ends

// One side of a byte stream, driven without blocking.
class End {
 public:
  virtual ~End() = default;
  virtual size_t Send(const uint8_t* data, size_t len) = 0;
  virtual size_t Recv(uint8_t* out, size_t cap) = 0;
  virtual std::string Trouble() const { return ""; }
};

// A socket (the peer of a connection that went plain).
class SocketEnd : public End {
 public:
  explicit SocketEnd(int fd) : fd_(fd) {}
  size_t Send(const uint8_t* data, size_t len) override {
    ssize_t n = send(fd_, data, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    return n > 0 ? size_t(n) : 0;
  }
  size_t Recv(uint8_t* out, size_t cap) override {
    ssize_t n = recv(fd_, out, cap, MSG_DONTWAIT);
    return n > 0 ? size_t(n) : 0;
  }

 private:
  int fd_;
};

// A channel used as Stream uses it (its own cursors, copies split at the ring's end), with
// the control thread's part: the anchor's readiness, once TCP carries the stream.
class ChannelEnd : public End {
 public:
  explicit ChannelEnd(Channel* ch, uint64_t published = 0, uint64_t consumed = 0)
      : ch_(ch), ring_(ch->ring_size()), published_(published), consumed_(consumed) {}

  size_t Send(const uint8_t* data, size_t len) override {
    Poke();
    const uint64_t used = published_ - ch_->TxConsumed();
    if (used > ring_) {
      trouble_ = "credit out of range";
      return 0;
    }
    const size_t n = std::min<uint64_t>(len, ring_ - used);
    for (size_t done = 0; done < n;) {
      const uint32_t offset = uint32_t((published_ + done) & (ring_ - 1));
      const size_t piece = std::min<size_t>(n - done, ring_ - offset);
      ch_->TxCopy(offset, data + done, piece);
      done += piece;
    }
    if (n > 0) {
      published_ += n;
      ch_->TxPublish(published_);
    }
    return n;
  }
  size_t Recv(uint8_t* out, size_t cap) override {
    Poke();
    const uint64_t avail = ch_->RxProduced() - consumed_;
    if (avail > ring_) {
      trouble_ = "received out of range";
      return 0;
    }
    const size_t n = std::min<uint64_t>(avail, cap);
    for (size_t done = 0; done < n;) {
      const uint32_t offset = uint32_t((consumed_ + done) & (ring_ - 1));
      const size_t piece = std::min<size_t>(n - done, ring_ - offset);
      std::memcpy(out + done, ch_->RxData() + offset, piece);
      done += piece;
    }
    if (n > 0) {
      consumed_ += n;
      ch_->RxConsumed(consumed_);
    }
    return n;
  }
  std::string Trouble() const override { return trouble_; }
  uint64_t published() const { return published_; }

 private:
  void Poke() {
    if (ch_->control()->AnchorCarriesStream()) ch_->control()->OnAnchorReady(EPOLLIN | EPOLLOUT);
  }
  Channel* ch_;
  uint32_t ring_;
  uint64_t published_, consumed_;
  std::string trouble_;
};

size_t FirstDifference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

// Sends `ab` random bytes from a to b and `ba` from b to a, interleaved in random pieces;
// each side must receive exactly what the other sent, after what it had sent before
// (`ab_before`, `ba_before`), and nothing more.
::testing::AssertionResult Exchange(End* a, End* b, size_t ab, size_t ba, uint32_t seed,
                                    const std::vector<uint8_t>& ab_before = {},
                                    const std::vector<uint8_t>& ba_before = {}) {
  std::vector<uint8_t> want_ab = ab_before, want_ba = ba_before;
  const std::vector<uint8_t> out_ab = RandomBytes(ab, seed), out_ba = RandomBytes(ba, seed + 1);
  want_ab.insert(want_ab.end(), out_ab.begin(), out_ab.end());
  want_ba.insert(want_ba.end(), out_ba.begin(), out_ba.end());
  std::vector<uint8_t> got_ab, got_ba;
  size_t sent_ab = 0, sent_ba = 0;
  std::mt19937 rng(seed + 2);
  std::vector<uint8_t> buf(20000);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got_ab.size() < want_ab.size() || got_ba.size() < want_ba.size()) {
    if (std::chrono::steady_clock::now() > deadline || !a->Trouble().empty() ||
        !b->Trouble().empty())
      return ::testing::AssertionFailure()
             << "stuck: a->b " << got_ab.size() << "/" << want_ab.size() << ", b->a "
             << got_ba.size() << "/" << want_ba.size() << " " << a->Trouble() << b->Trouble();
    size_t progress = 0;
    if (sent_ab < ab) {
      size_t n = a->Send(out_ab.data() + sent_ab, std::min<size_t>(ab - sent_ab, 1 + rng() % 9000));
      sent_ab += n;
      progress += n;
    }
    if (sent_ba < ba) {
      size_t n = b->Send(out_ba.data() + sent_ba, std::min<size_t>(ba - sent_ba, 1 + rng() % 9000));
      sent_ba += n;
      progress += n;
    }
    size_t n = b->Recv(buf.data(), 1 + rng() % buf.size());
    got_ab.insert(got_ab.end(), buf.begin(), buf.begin() + n);
    progress += n;
    n = a->Recv(buf.data(), 1 + rng() % buf.size());
    got_ba.insert(got_ba.end(), buf.begin(), buf.begin() + n);
    progress += n;
    if (got_ab.size() > want_ab.size() || got_ba.size() > want_ba.size()) break;
    if (progress == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // Nothing more comes.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  uint8_t extra[64];
  if (a->Recv(extra, sizeof(extra)) != 0 || b->Recv(extra, sizeof(extra)) != 0 ||
      got_ab.size() > want_ab.size() || got_ba.size() > want_ba.size())
    return ::testing::AssertionFailure() << "more bytes than were sent";
  if (got_ab != want_ab)
    return ::testing::AssertionFailure()
           << "a->b differs from byte " << FirstDifference(got_ab, want_ab) << " of "
           << want_ab.size();
  if (got_ba != want_ba)
    return ::testing::AssertionFailure()
           << "b->a differs from byte " << FirstDifference(got_ba, want_ba) << " of "
           << want_ba.size();
  return ::testing::AssertionSuccess();
}

// ---------------------------------------------------------------------------- a connection

// Both ends of one registered connection over a real TCP connection: the server's channel
// as AcceptRegistration builds it (anchored on the accepted socket), the client's as
// MakeClientChannel does (anchored on the connecting socket, put in the offer's slot).
struct Connection {
  int tcp_client = -1, tcp_server = -1;
  Offer offer;
  RegionControl* control = nullptr;  // the client's mapping (while the client channel lives)
  wire::Register msg;
  std::unique_ptr<Channel> server;
  int server_a = -1, server_b = -1;
  std::atomic<uint32_t>* claim = nullptr;  // the server's view of the claim
  std::unique_ptr<Channel> client;
  int client_a = -1, client_b = -1;
  int rendezvous = -1;         // the listener's end of the client's rendezvous (a stand-in)
  int rendezvous_client = -1;  // the client's end, as given to the channel

  ~Connection() {
    client.reset();
    server.reset();
    for (int* fd :
         {&server_a, &server_b, &client_a, &client_b, &rendezvous, &tcp_client, &tcp_server})
      CloseIf(fd);
  }

  // `held`: the server's channel waits for the CONFIRM; `awaiting`: the client's waits for
  // the listener's answer (else it is settled from the start).
  void Init(bool held, bool awaiting) {
    ASSERT_NO_FATAL_FAILURE(ConnectTcp());
    ASSERT_EQ(PrepareOffer(kRing, &offer), 0);
    control = static_cast<RegionControl*>(offer.region);
    msg.nonce = offer.nonce;
    msg.ring_size = offer.ring_size;
    msg.fd_count = 4;
    msg.region_size = offer.region_size;
    int fds[4];
    const int carried[4] = {offer.memfd, offer.server_a, offer.server_b, offer.client_b};
    for (int i = 0; i < 4; ++i) {
      fds[i] = fcntl(carried[i], F_DUPFD_CLOEXEC, 0);
      ASSERT_GE(fds[i], 0);
    }
    wire::DeclineReason reason = wire::DeclineReason::kUnspecified;
    server = AcceptRegistration(msg, fds, tcp_server, held, kTimeoutMs, &server_a, &server_b,
                                &claim, &reason);
    ASSERT_TRUE(server) << "reason " << int(reason);
    ASSERT_NE(claim, nullptr);

    ASSERT_EQ(dup3(tcp_client, offer.anchor_slot, O_CLOEXEC), offer.anchor_slot);
    if (awaiting) {
      int pair[2];
      ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, pair), 0);
      rendezvous_client = pair[0];
      rendezvous = pair[1];
    }
    client = MakeClientChannel(&offer, rendezvous_client, kTimeoutMs, &client_a, &client_b);
    ASSERT_TRUE(client);
    EXPECT_EQ(offer.region, nullptr);  // the channel's now
  }

  void ConnectTcp() {
    int fds[2];
    testing::TcpPair(fds);
    tcp_client = fds[0];
    tcp_server = fds[1];
    int one = 1;
    setsockopt(tcp_client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(tcp_server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }

  Claim ClaimNow() const { return Claim(claim->load()); }
  // The client's own view of the claim, through its mapping.
  uint32_t ClientClaim() const { return control->header.claim.load(); }

  // The client publishes `bytes` into its ring (as its application's first send would).
  void ClientPublishes(const std::vector<uint8_t>& bytes) {
    ASSERT_LE(bytes.size(), kRing);
    client->TxCopy(0, bytes.data(), bytes.size());
    client->TxPublish(bytes.size());
  }
};

Settlement SettleNow(Channel* ch, Reason* why) {
  return ch->control()->Settle(sys::MonotonicMs(), why);
}

// ---------------------------------------------------------------------------- server, held

TEST(ShmSettleServerTest, HeldShowsNoBytesAndNoSpaceUntilTheConfirm) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*held=*/true, /*awaiting=*/false));
  const uint64_t now = sys::MonotonicMs();
  const uint64_t deadline = c.server->control()->SettleDeadline();
  EXPECT_GE(deadline, now + kTimeoutMs - 5000);
  EXPECT_LE(deadline, now + kTimeoutMs);
  EXPECT_EQ(c.server->control()->SettleFd(), -1);
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(Bytes("hello")));
  EXPECT_EQ(c.server->RxProduced(), 0u);
  EXPECT_FALSE(c.server->RxEof());
  EXPECT_EQ(c.server->TxConsumed(), uint64_t(0) - kRing);  // a full ring: nothing to send
  EXPECT_FALSE(c.server->TxPeerClosed());
  EXPECT_TRUE(c.server->control()->AnchorCarriesStream());  // (its bytes are for settling alone)
  EXPECT_EQ(c.server->Error(), 0);
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kPending);
  EXPECT_EQ(c.server->control()->SettleDeadline(), deadline);
  EXPECT_EQ(c.ClaimNow(), Claim::kOpen);

  // Through a Stream, as the application sees it: nothing to read, no room to write.
  Channel* ch = c.server.get();
  Stream stream(std::move(c.server), c.server_a, c.server_b, StreamOptions{});
  c.server_a = c.server_b = -1;
  uint8_t buf[16];
  iovec iov{buf, sizeof(buf)};
  EXPECT_EQ(stream.Recv(&iov, 1, 0, true), -EAGAIN);
  EXPECT_EQ(stream.Send(&iov, 1, MSG_NOSIGNAL, true), -EAGAIN);
  EXPECT_EQ(stream.ReadableBytes(), 0u);
  // Once settled, what the client had published is there, and there is room.
  SendAll(c.tcp_client, ConfirmBytes(c.offer.nonce, kRing));
  EXPECT_EQ(ch->control()->Settle(sys::MonotonicMs(), &why), Settlement::kSettled);
  EXPECT_EQ(stream.Recv(&iov, 1, 0, true), 5);
  EXPECT_EQ(std::memcmp(buf, "hello", 5), 0);
  EXPECT_EQ(stream.Send(&iov, 1, MSG_NOSIGNAL, true), ssize_t(sizeof(buf)));
  EXPECT_EQ(c.client->RxProduced(), sizeof(buf));
}

TEST(ShmSettleServerTest, ConfirmSettlesAndLeavesWhatFollowsIt) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, false));
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(Bytes("hello")));
  std::vector<uint8_t> wire_bytes = ConfirmBytes(c.offer.nonce, kRing);
  const std::vector<uint8_t> after = Bytes("after the confirm");
  wire_bytes.insert(wire_bytes.end(), after.begin(), after.end());
  SendAll(c.tcp_client, wire_bytes);

  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kSettled);
  EXPECT_EQ(why, Reason::kNone);
  EXPECT_EQ(c.server->control()->SettleDeadline(), 0u);
  EXPECT_FALSE(c.server->control()->AnchorCarriesStream());
  EXPECT_EQ(ReadSome(c.tcp_server, after.size()), after);  // exactly the CONFIRM was taken
  EXPECT_EQ(c.server->RxProduced(), 5u);
  EXPECT_EQ(std::memcmp(c.server->RxData(), "hello", 5), 0);
  EXPECT_EQ(c.server->TxConsumed(), 0u);
  EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kSettled);  // once settled, settled
  EXPECT_EQ(c.ClaimNow(), Claim::kOpen);

  // The rings carry the stream both ways, many times round.
  ChannelEnd server(c.server.get(), 0, 0), client(c.client.get(), 5, 0);
  std::vector<uint8_t> hello = Bytes("hello");
  EXPECT_TRUE(Exchange(&client, &server, 10 * kRing + 17, 7 * kRing + 3, 1, hello));
  EXPECT_TRUE(NothingToRead(c.tcp_server));
  EXPECT_TRUE(NothingToRead(c.tcp_client));
}

TEST(ShmSettleServerTest, APartialConfirmIsPending) {
  const std::vector<uint8_t> probe = ConfirmBytes(1, kRing);
  for (size_t split : {size_t(1), size_t(wire::kHeaderSize), probe.size() - 1}) {
    SCOPED_TRACE(split);
    Connection c;
    ASSERT_NO_FATAL_FAILURE(c.Init(true, false));
    const std::vector<uint8_t> confirm = ConfirmBytes(c.offer.nonce, kRing);
    SendAll(c.tcp_client, std::vector<uint8_t>(confirm.begin(), confirm.begin() + split));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    Reason why = Reason::kNone;
    EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kPending);
    EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kPending);
    EXPECT_NE(c.server->control()->SettleDeadline(), 0u);
    SendAll(c.tcp_client, std::vector<uint8_t>(confirm.begin() + split, confirm.end()));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kSettled);
    EXPECT_TRUE(NothingToRead(c.tcp_server));
  }
}

TEST(ShmSettleServerTest, AConfirmForAnotherRegistrationResets) {
  struct Case {
    const char* what;
    uint64_t nonce_xor;
    uint32_t ring;
  } cases[] = {{"another nonce", 0x10, kRing}, {"another ring size", 0, 2 * kRing}};
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    Connection c;
    ASSERT_NO_FATAL_FAILURE(c.Init(true, false));
    ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(Bytes("hello")));
    SendAll(c.tcp_client, ConfirmBytes(c.offer.nonce ^ k.nonce_xor, k.ring));
    Reason why = Reason::kNone;
    EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kReset);
    EXPECT_EQ(c.server->control()->SettleDeadline(), 0u);
    EXPECT_EQ(c.server->RxProduced(), 0u);  // nothing of the region's
  }
}

TEST(ShmSettleServerTest, PlainBytesFirstMakeItPlainWithEveryByteDelivered) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, false));
  // Whoever registered this 4-tuple also put bytes in the region: they are not this
  // connection's, and must not appear.
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(Bytes("region bytes")));
  const std::vector<uint8_t> first = Bytes("GET / HTTP/1.1\r\n");
  SendAll(c.tcp_client, first);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kPeerNotSlipstream);
  EXPECT_EQ(c.server->control()->SettleDeadline(), 0u);
  EXPECT_TRUE(c.server->control()->AnchorCarriesStream());
  // The control thread hands the anchor's readiness to the channel from now on.
  c.server->control()->OnAnchorReady(EPOLLIN | EPOLLOUT);
  ASSERT_EQ(c.server->RxProduced(), first.size());
  EXPECT_EQ(std::memcmp(c.server->RxData(), first.data(), first.size()), 0);

  // Byte-exact both ways over TCP, in random pieces, far more than a ring.
  ChannelEnd server(c.server.get());
  SocketEnd peer(c.tcp_client);
  EXPECT_TRUE(Exchange(&peer, &server, 300000, 250000, 7, first));
  // The server's end of the stream goes to TCP as a FIN.
  c.server->CloseTx();
  EXPECT_TRUE(ReadSome(c.tcp_client, 1).empty());
  char ch;
  EXPECT_EQ(recv(c.tcp_client, &ch, 1, MSG_DONTWAIT), 0);
  // And the client's.
  shutdown(c.tcp_client, SHUT_WR);
  for (int i = 0; i < 100 && !c.server->RxEof(); ++i) {
    c.server->control()->OnAnchorReady(EPOLLIN);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(c.server->RxEof());
}

TEST(ShmSettleServerTest, EofFirstMakesItPlain) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, false));
  shutdown(c.tcp_client, SHUT_WR);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kPeerNotSlipstream);
  c.server->control()->OnAnchorReady(EPOLLIN | EPOLLOUT);
  EXPECT_EQ(c.server->RxProduced(), 0u);
  EXPECT_TRUE(c.server->RxEof());
  // The other way still works.
  ChannelEnd server(c.server.get());
  SocketEnd peer(c.tcp_client);
  EXPECT_TRUE(Exchange(&server, &peer, 20000, 0, 3));
}

TEST(ShmSettleServerTest, AClaimTheClientGaveUpMakesItPlain) {
  for (Claim given_up : {Claim::kWithdrawn, Claim::kAbandoned}) {
    SCOPED_TRACE(int(given_up));
    Connection c;
    ASSERT_NO_FATAL_FAILURE(c.Init(true, false));
    c.control->header.claim.store(uint32_t(given_up));
    Reason why = Reason::kNone;
    EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kPlain);
    EXPECT_EQ(why, Reason::kConnectSlow);
    EXPECT_EQ(c.ClientClaim(), uint32_t(given_up));
    ChannelEnd server(c.server.get());
    SocketEnd peer(c.tcp_client);
    EXPECT_TRUE(Exchange(&peer, &server, 50000, 50000, 11));
  }
}

TEST(ShmSettleServerTest, DeadlineWithTheClaimOpenAbandons) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, false));
  const uint64_t deadline = c.server->control()->SettleDeadline();
  Reason why = Reason::kNone;
  EXPECT_EQ(c.server->control()->Settle(deadline - 1, &why), Settlement::kPending);
  EXPECT_EQ(c.ClaimNow(), Claim::kOpen);
  EXPECT_EQ(c.server->control()->Settle(deadline, &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kHandshakeTimeout);
  EXPECT_EQ(c.ClientClaim(), uint32_t(Claim::kAbandoned));  // the client sees it so
  EXPECT_EQ(c.server->control()->SettleDeadline(), 0u);
  // A CONFIRM after that is the application's problem no more: it never comes (the client
  // finds the claim abandoned); plain bytes flow.
  ChannelEnd server(c.server.get());
  SocketEnd peer(c.tcp_client);
  EXPECT_TRUE(Exchange(&peer, &server, 10000, 10000, 5));
}

TEST(ShmSettleServerTest, GarbageInTheClaimCountsAsOpen) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, false));
  c.control->header.claim.store(77);
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kPending);
  EXPECT_EQ(c.server->control()->Settle(c.server->control()->SettleDeadline(), &why),
            Settlement::kPlain);
  EXPECT_EQ(why, Reason::kHandshakeTimeout);
}

TEST(ShmSettleServerTest, DeadlineWithTheClaimConfirmedWaitsOnceThenResets) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, false));
  c.control->header.claim.store(uint32_t(Claim::kConfirmed));
  const uint64_t deadline = c.server->control()->SettleDeadline();
  Reason why = Reason::kNone;
  EXPECT_EQ(c.server->control()->Settle(deadline, &why), Settlement::kPending);  // extended
  const uint64_t extended = c.server->control()->SettleDeadline();
  EXPECT_GE(extended, deadline + 1000);
  EXPECT_EQ(c.ClaimNow(), Claim::kConfirmed);
  EXPECT_EQ(c.server->control()->Settle(extended - 1, &why), Settlement::kPending);
  EXPECT_EQ(c.server->control()->Settle(extended, &why), Settlement::kReset);
  EXPECT_EQ(c.server->control()->SettleDeadline(), 0u);
  EXPECT_EQ(c.ClaimNow(), Claim::kConfirmed);
}

TEST(ShmSettleServerTest, AConfirmWithinTheExtensionSettles) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, false));
  c.control->header.claim.store(uint32_t(Claim::kConfirmed));
  Reason why = Reason::kNone;
  EXPECT_EQ(c.server->control()->Settle(c.server->control()->SettleDeadline(), &why),
            Settlement::kPending);
  const uint64_t extended = c.server->control()->SettleDeadline();
  SendAll(c.tcp_client, ConfirmBytes(c.offer.nonce, kRing));
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(c.server->control()->Settle(extended - 1, &why), Settlement::kSettled);
  EXPECT_EQ(c.server->control()->SettleDeadline(), 0u);
}

TEST(ShmSettleServerTest, ASendingSideClosedWhileHeldEndsAfterSettling) {
  {
    // Settled on the rings: the client sees EOF there.
    Connection c;
    ASSERT_NO_FATAL_FAILURE(c.Init(true, false));
    c.server->CloseTx();
    EXPECT_FALSE(c.client->RxEof());
    SendAll(c.tcp_client, ConfirmBytes(c.offer.nonce, kRing));
    Reason why = Reason::kNone;
    EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kSettled);
    EXPECT_TRUE(c.client->RxEof());
    EXPECT_EQ(c.client->RxProduced(), 0u);
  }
  {
    // Plain: a FIN on TCP.
    Connection c;
    ASSERT_NO_FATAL_FAILURE(c.Init(true, false));
    c.server->CloseTx();
    Reason why = Reason::kNone;
    EXPECT_EQ(c.server->control()->Settle(c.server->control()->SettleDeadline(), &why),
              Settlement::kPlain);
    EXPECT_TRUE(ReadSome(c.tcp_client, 1).empty());
    char ch;
    EXPECT_EQ(recv(c.tcp_client, &ch, 1, MSG_DONTWAIT), 0);
  }
}

// ---------------------------------------------------------------------------- client, awaiting

TEST(ShmSettleClientTest, WithoutAnAnswerItIsPendingOnTheRings) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, /*awaiting=*/true));
  EXPECT_EQ(c.client->control()->SettleFd(), c.rendezvous_client);
  const uint64_t now = sys::MonotonicMs();
  EXPECT_GE(c.client->control()->SettleDeadline(), now + kTimeoutMs - 5000);
  EXPECT_LE(c.client->control()->SettleDeadline(), now + kTimeoutMs);
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPending);
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPending);
  EXPECT_EQ(c.ClaimNow(), Claim::kOpen);
  // The client may send at once, into its ring; nothing goes on TCP yet.
  EXPECT_FALSE(c.client->control()->AnchorCarriesStream());
  EXPECT_EQ(c.client->TxConsumed(), 0u);
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(Bytes("early")));
  EXPECT_TRUE(NothingToRead(c.tcp_server));
}

TEST(ShmSettleClientTest, AcceptConfirmsExactlyOnce) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, true));
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(Bytes("early")));
  SendAll(c.rendezvous, AcceptBytes(c.offer.nonce));
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kSettled);
  EXPECT_EQ(why, Reason::kNone);
  EXPECT_EQ(c.ClaimNow(), Claim::kConfirmed);
  EXPECT_EQ(c.client->control()->SettleDeadline(), 0u);
  EXPECT_EQ(c.client->control()->SettleFd(), -1);
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kSettled);
  // The rendezvous socket is closed.
  char ch;
  EXPECT_EQ(recv(c.rendezvous, &ch, 1, MSG_DONTWAIT), 0);
  // Exactly one CONFIRM on TCP, for this registration.
  const std::vector<uint8_t> got = ReadSome(c.tcp_server, ConfirmBytes(1, kRing).size());
  wire::Message msg;
  size_t used = 0;
  ASSERT_EQ(wire::ParseMessage(got.data(), got.size(), &msg, &used), wire::ParseStatus::kOk);
  EXPECT_EQ(msg.type, wire::Type::kConfirm);
  EXPECT_EQ(msg.confirm.nonce, c.offer.nonce);
  EXPECT_EQ(msg.confirm.ring_size, kRing);
  EXPECT_EQ(used, got.size());
  EXPECT_TRUE(NothingToRead(c.tcp_server));

  // The server settles on it (the CONFIRM is consumed above: give it one again).
  SendAll(c.tcp_client, got);
  EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kSettled);
  ChannelEnd client(c.client.get(), 5, 0), server(c.server.get());
  EXPECT_TRUE(Exchange(&client, &server, 9 * kRing, 9 * kRing, 21, Bytes("early")));
  EXPECT_TRUE(NothingToRead(c.tcp_server));
  EXPECT_TRUE(NothingToRead(c.tcp_client));
}

TEST(ShmSettleClientTest, DeclineMakesItPlainFromByteZero) {
  struct Case {
    wire::DeclineReason decline;
    Reason why;
  } cases[] = {
      {wire::DeclineReason::kDescriptors, Reason::kFdLimit},
      {wire::DeclineReason::kBusy, Reason::kRendezvousBusy},
      {wire::DeclineReason::kResources, Reason::kResources},
      {wire::DeclineReason::kBadRegion, Reason::kDeclined},
  };
  uint32_t seed = 100;
  for (const Case& k : cases) {
    SCOPED_TRACE(int(k.decline));
    Connection c;
    ASSERT_NO_FATAL_FAILURE(c.Init(true, true));
    const std::vector<uint8_t> early = RandomBytes(3000, ++seed);
    ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(early));
    SendAll(c.rendezvous, DeclineBytes(c.offer.nonce, k.decline));
    Reason why = Reason::kNone;
    EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPlain);
    EXPECT_EQ(why, k.why);
    EXPECT_EQ(c.ClaimNow(), Claim::kWithdrawn);
    EXPECT_EQ(c.client->control()->SettleDeadline(), 0u);
    EXPECT_EQ(c.client->control()->SettleFd(), -1);
    EXPECT_TRUE(c.client->control()->AnchorCarriesStream());
    // What the client had published arrives on TCP from byte 0, and nothing before it.
    EXPECT_EQ(ReadSome(c.tcp_server, early.size()), early);
    // Then the stream goes on over TCP, both ways.
    ChannelEnd client(c.client.get(), early.size(), 0);
    SocketEnd peer(c.tcp_server);
    EXPECT_TRUE(Exchange(&client, &peer, 200000, 150000, ++seed));
  }
}

TEST(ShmSettleClientTest, DeclinedConnectionIsPlainAtBothEnds) {
  // The client was declined before it sent anything; its server, held, sees the claim
  // withdrawn: both carry the stream on TCP, byte-exact, each from its own rings.
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, true));
  SendAll(c.rendezvous, DeclineBytes(c.offer.nonce, wire::DeclineReason::kDescriptors));
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPlain);
  EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kConnectSlow);
  ChannelEnd client(c.client.get()), server(c.server.get());
  EXPECT_TRUE(Exchange(&client, &server, 123457, 98765, 31));
}

// Its listener accepted the registration and the client confirmed, but the process that
// accepted the TCP connection had nothing registered for it (another process sharing the
// listener holds the registration) and declined it there. Nobody read or wrote the rings,
// so the client's stream goes on TCP from byte 0, everything it had published first.
TEST(ShmSettleClientTest, ADeclineAfterItsConfirmContinuesOnTcpFromByteZero) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, true));
  const std::vector<uint8_t> early = RandomBytes(4000, 41);  // (nearly a ring)
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(early));
  SendAll(c.rendezvous, AcceptBytes(c.offer.nonce));
  Reason why = Reason::kNone;
  ASSERT_EQ(SettleNow(c.client.get(), &why), Settlement::kSettled);
  // The accepting process's shim takes the CONFIRM off the connection (and declines: the
  // control thread consumes that message before it asks the channel).
  const std::vector<uint8_t> confirm = ReadSome(c.tcp_server, ConfirmBytes(1, kRing).size());
  wire::Message msg;
  size_t used = 0;
  ASSERT_EQ(wire::ParseMessage(confirm.data(), confirm.size(), &msg, &used),
            wire::ParseStatus::kOk);
  ASSERT_EQ(msg.type, wire::Type::kConfirm);
  EXPECT_FALSE(c.client->control()->AnchorCarriesStream());
  ASSERT_TRUE(c.client->control()->OnPeerDecline());
  EXPECT_TRUE(c.client->control()->AnchorCarriesStream());
  EXPECT_FALSE(c.client->control()->OnPeerDecline());  // (once)
  EXPECT_EQ(ReadSome(c.tcp_server, early.size()), early);
  ChannelEnd client(c.client.get(), early.size(), 0);
  SocketEnd peer(c.tcp_server);
  EXPECT_TRUE(Exchange(&client, &peer, 300000, 200000, 43));
}

// A decline once bytes moved over the rings cannot be continued from byte 0: refused (the
// control thread then resets the connection).
TEST(ShmSettleClientTest, ADeclineAfterBytesMovedOnTheRingsIsRefused) {
  for (const bool server_wrote : {true, false}) {
    SCOPED_TRACE(server_wrote ? "bytes came in" : "bytes were read");
    Connection c;
    ASSERT_NO_FATAL_FAILURE(c.Init(true, true));
    SendAll(c.rendezvous, AcceptBytes(c.offer.nonce));
    Reason why = Reason::kNone;
    ASSERT_EQ(SettleNow(c.client.get(), &why), Settlement::kSettled);
    SendAll(c.tcp_client, ReadSome(c.tcp_server, ConfirmBytes(1, kRing).size()));
    ASSERT_EQ(SettleNow(c.server.get(), &why), Settlement::kSettled);
    ChannelEnd client(c.client.get()), server(c.server.get());
    const std::vector<uint8_t> bytes = Bytes("x");
    if (server_wrote) {
      ASSERT_EQ(server.Send(bytes.data(), bytes.size()), bytes.size());
    } else {
      ASSERT_EQ(client.Send(bytes.data(), bytes.size()), bytes.size());
      uint8_t got;
      ASSERT_EQ(server.Recv(&got, 1), 1u);
    }
    EXPECT_FALSE(c.client->control()->OnPeerDecline());
    EXPECT_FALSE(c.client->control()->AnchorCarriesStream());
  }
}

TEST(ShmSettleClientTest, EofOnTheRendezvousMakesItPlain) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, true));
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(Bytes("early")));
  CloseIf(&c.rendezvous);
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kDeclined);
  EXPECT_EQ(c.ClaimNow(), Claim::kWithdrawn);
  EXPECT_EQ(ReadSome(c.tcp_server, 5), Bytes("early"));
}

TEST(ShmSettleClientTest, DeadlineMakesItPlain) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, true));
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(Bytes("early")));
  const uint64_t deadline = c.client->control()->SettleDeadline();
  Reason why = Reason::kNone;
  EXPECT_EQ(c.client->control()->Settle(deadline - 1, &why), Settlement::kPending);
  EXPECT_EQ(c.client->control()->Settle(deadline, &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kHandshakeTimeout);
  EXPECT_EQ(c.ClaimNow(), Claim::kWithdrawn);
  EXPECT_EQ(ReadSome(c.tcp_server, 5), Bytes("early"));
  EXPECT_EQ(c.client->control()->SettleDeadline(), 0u);
  EXPECT_EQ(c.client->control()->SettleFd(), -1);
  char ch;
  EXPECT_EQ(recv(c.rendezvous, &ch, 1, MSG_DONTWAIT), 0);  // its rendezvous socket closed
}

TEST(ShmSettleClientTest, AcceptAfterTheServerAbandonedStaysPlain) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, true));
  // The server gave up waiting first (its deadline).
  Reason why = Reason::kNone;
  EXPECT_EQ(c.server->control()->Settle(c.server->control()->SettleDeadline(), &why),
            Settlement::kPlain);
  EXPECT_EQ(c.ClaimNow(), Claim::kAbandoned);
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(Bytes("early")));
  SendAll(c.rendezvous, AcceptBytes(c.offer.nonce));
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kHandshakeTimeout);
  EXPECT_EQ(c.ClaimNow(), Claim::kAbandoned);
  // No CONFIRM: the first bytes on TCP are the application's.
  ChannelEnd client(c.client.get(), 5, 0), server(c.server.get());
  EXPECT_TRUE(Exchange(&client, &server, 40000, 40000, 41, Bytes("early")));
}

TEST(ShmSettleClientTest, AnAnswerThatIsNotForItMakesItPlain) {
  struct Case {
    const char* what;
    int kind;
  } cases[] = {{"ACCEPT for another nonce", 0},
               {"garbage", 1},
               {"ACCEPT and a trailing byte", 2},
               {"a CONFIRM", 3}};
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    Connection c;
    ASSERT_NO_FATAL_FAILURE(c.Init(true, true));
    std::vector<uint8_t> answer;
    if (k.kind == 0) answer = AcceptBytes(c.offer.nonce ^ 1);
    if (k.kind == 1) answer = Bytes("HTTP/1.1 200 OK\r\n");
    if (k.kind == 2) {
      answer = AcceptBytes(c.offer.nonce);
      answer.push_back(0);
    }
    if (k.kind == 3) answer = ConfirmBytes(c.offer.nonce, kRing);
    SendAll(c.rendezvous, answer);
    Reason why = Reason::kNone;
    EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPlain);
    EXPECT_EQ(why, Reason::kDeclined);
    EXPECT_EQ(c.ClaimNow(), Claim::kWithdrawn);
    EXPECT_TRUE(NothingToRead(c.tcp_server)) << "something was sent";
  }
}

TEST(ShmSettleClientTest, DestroyingAnUnsettledClientWithdraws) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, true));
  c.client.reset();
  EXPECT_EQ(c.ClaimNow(), Claim::kWithdrawn);
  char ch;
  EXPECT_EQ(recv(c.rendezvous, &ch, 1, MSG_DONTWAIT), 0);  // its rendezvous socket closed
  // Its server then stays plain.
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.server.get(), &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kConnectSlow);
}

TEST(ShmSettleClientTest, DestroyingASettledClientLeavesTheClaim) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, true));
  SendAll(c.rendezvous, AcceptBytes(c.offer.nonce));
  Reason why = Reason::kNone;
  ASSERT_EQ(SettleNow(c.client.get(), &why), Settlement::kSettled);
  c.client.reset();
  EXPECT_EQ(c.ClaimNow(), Claim::kConfirmed);
}

TEST(ShmSettleClientTest, AConfirmAlreadyThereAtTheServersDeadlineSettles) {
  // The client confirmed just before the server's deadline: the CONFIRM is what counts.
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(true, true));
  SendAll(c.rendezvous, AcceptBytes(c.offer.nonce));
  Reason why = Reason::kNone;
  ASSERT_EQ(SettleNow(c.client.get(), &why), Settlement::kSettled);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(c.server->control()->Settle(c.server->control()->SettleDeadline(), &why),
            Settlement::kSettled);
  EXPECT_EQ(c.ClaimNow(), Claim::kConfirmed);
}

}  // namespace
}  // namespace slip::shm
