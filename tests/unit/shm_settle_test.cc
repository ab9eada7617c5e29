// Tests for how an shm connection settles (ChannelControl::Settle, shm/channel.cc). The
// server's channel carries the stream from the start: its process claimed the region when
// it accepted. The client's is installed before anybody took its registration; it writes
// into its ring at once, and settles when the claim word is decided: on the rings when the
// accepting process took it (its ACCEPT only wakes the client), on TCP from byte 0 when the
// connection turned out to be another process's (plain bytes or the end from it, accepted
// and not taken in time, a DECLINE, the listener gone). Nothing of ours ever goes in band.
//
// Both ends are built as the shim builds them (PrepareOffer, AcceptRegistration,
// MakeClientChannel, Registration::Commit/Abandon) around a real TCP connection over
// loopback, whose two sockets are the anchors; a socketpair stands in for the client's
// rendezvous socket. The control thread's part (calling Settle, and OnAnchorReady once TCP
// carries the stream) is played by the tests, with the clock passed in: deadlines are
// reached without waiting for them (the kernel's view of the connection is real).
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
  int listener = -1;
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
    for (int* fd : {&server_a, &server_b, &client_a, &client_b, &rendezvous, &tcp_client,
                    &tcp_server, &listener})
      CloseIf(fd);
  }

  // `awaiting`: the client's channel waits for its registration to be decided (else it is
  // settled from the start). `accepted`: the server's end of the TCP connection was
  // accepted (else it waits in the listener's queue, and tcp_server is -1 until Accept()).
  // `listener_flags`: what the listener says of itself in the region (kListener*).
  void Init(bool awaiting, bool accepted = true, uint32_t listener_flags = 0) {
    ASSERT_NO_FATAL_FAILURE(ConnectTcp(accepted));
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
    server = AcceptRegistration(msg, fds, tcp_server, &server_a, &server_b, &claim, &reason,
                                /*across_namespaces=*/false, listener_flags);
    ASSERT_TRUE(server) << "reason " << int(reason);
    ASSERT_NE(claim, nullptr);

    ASSERT_EQ(dup3(tcp_client, offer.anchor_slot, O_CLOEXEC), offer.anchor_slot);
    if (awaiting) {
      int pair[2];
      ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, pair), 0);
      rendezvous_client = pair[0];
      rendezvous = pair[1];
    }
    sockaddr_storage local{}, peer{};
    socklen_t llen = sizeof(local), plen = sizeof(peer);
    ASSERT_EQ(getsockname(tcp_client, reinterpret_cast<sockaddr*>(&local), &llen), 0);
    ASSERT_EQ(getpeername(tcp_client, reinterpret_cast<sockaddr*>(&peer), &plen), 0);
    wire::Endpoint client_ep, server_ep;
    ASSERT_TRUE(wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&local), &client_ep));
    ASSERT_TRUE(wire::EndpointFromSockaddr(reinterpret_cast<sockaddr*>(&peer), &server_ep));
    client =
        MakeClientChannel(&offer, rendezvous_client, client_ep, server_ep, &client_a, &client_b);
    ASSERT_TRUE(client);
    EXPECT_EQ(offer.region, nullptr);  // the channel's now
  }

  void ConnectTcp(bool accepted) {
    sockaddr_in addr;
    ASSERT_NO_FATAL_FAILURE(testing::LoopbackListener(&listener, &addr, 4));
    tcp_client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ASSERT_EQ(connect(tcp_client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    testing::NonBlocking(tcp_client);
    int one = 1;
    setsockopt(tcp_client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (accepted) {
      ASSERT_NO_FATAL_FAILURE(Accept());
    }
  }
  void Accept() {
    tcp_server = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    ASSERT_GE(tcp_server, 0);
    int one = 1;
    setsockopt(tcp_server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }

  // What the listener does with the registration, as its Registration (owning the answer's
  // end of the rendezvous stand-in): takes it at accept (Commit), or drops it (Abandon).
  Registration AsRegistration() {
    Registration reg;
    reg.msg = msg;
    reg.claim = claim;
    reg.answer = rendezvous;
    rendezvous = -1;
    return reg;
  }

  Claim ClaimNow() const { return Claim(claim->load()); }

  // The client publishes `bytes` into its ring (as its application's first send would).
  void ClientPublishes(const std::vector<uint8_t>& bytes) {
    ASSERT_LE(bytes.size(), kRing);
    client->TxCopy(0, bytes.data(), bytes.size());
    client->TxPublish(bytes.size());
  }
};

Settlement SettleAt(Channel* ch, uint64_t now_ms, Reason* why) {
  return ch->control()->Settle(now_ms, why);
}
Settlement SettleNow(Channel* ch, Reason* why) {
  return SettleAt(ch, sys::MonotonicMs(), why);
}

// One message on the client's rendezvous socket (what the listener answered), if any.
std::vector<uint8_t> AnswerOn(int fd) {
  std::vector<uint8_t> buf(wire::kMaxMessageSize);
  const ssize_t n = recv(fd, buf.data(), buf.size(), MSG_DONTWAIT | MSG_PEEK);
  buf.resize(n > 0 ? size_t(n) : 0);
  return buf;
}

// A connection that went plain: the client's stream continues on TCP, everything it had
// published first, and both ways carry exactly what was sent.
void ExpectPlainFromByteZero(Connection* c, const std::vector<uint8_t>& published, uint32_t seed) {
  EXPECT_TRUE(c->client->control()->AnchorCarriesStream());
  EXPECT_EQ(c->client->control()->SettleDeadline(), 0u);
  ChannelEnd client(c->client.get(), published.size());
  SocketEnd server(c->tcp_server);
  EXPECT_TRUE(Exchange(&client, &server, 20000, 20000, seed, published));
}

// ---------------------------------------------------------------------------- the server

TEST(ShmSettleServerTest, TheServersEndCarriesTheStreamFromTheStartWithNothingInBand) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/false));
  EXPECT_EQ(c.server->control()->SettleDeadline(), 0u);
  EXPECT_FALSE(c.server->control()->AnchorCarriesStream());
  ChannelEnd client(c.client.get()), server(c.server.get());
  EXPECT_TRUE(Exchange(&client, &server, 30000, 30000, 11));
  EXPECT_TRUE(NothingToRead(c.tcp_server));
  EXPECT_TRUE(NothingToRead(c.tcp_client));
}

// ---------------------------------------------------------------------------- the client

TEST(ShmSettleClientTest, UntakenItIsPendingOnTheRingsAndTheTakerReadsWhatItWrote) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/true));
  const std::vector<uint8_t> first = Bytes("written before anybody took the registration");
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(first));
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPending);
  EXPECT_NE(c.client->control()->SettleDeadline(), 0u);
  EXPECT_EQ(c.ClaimNow(), Claim::kOpen);

  Registration reg = c.AsRegistration();
  ASSERT_TRUE(reg.Commit());
  EXPECT_EQ(reg.answer, -1);  // answered and closed
  EXPECT_EQ(c.ClaimNow(), Claim::kTaken);
  EXPECT_EQ(AnswerOn(c.rendezvous_client), AcceptBytes(c.msg.nonce));
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kSettled);
  EXPECT_EQ(c.client->control()->SettleDeadline(), 0u);
  EXPECT_FALSE(c.client->control()->AnchorCarriesStream());

  ChannelEnd client(c.client.get(), first.size()), server(c.server.get());
  EXPECT_TRUE(Exchange(&client, &server, 20000, 20000, 21, first));
  EXPECT_TRUE(NothingToRead(c.tcp_server));  // nothing in band, ever
  EXPECT_TRUE(NothingToRead(c.tcp_client));
}

TEST(ShmSettleClientTest, TheClaimDecidesWithoutTheAnswer) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/true));
  c.claim->store(uint32_t(Claim::kTaken));
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kSettled);
  // Taken, an answer that is not an ACCEPT changes nothing either.
  Connection d;
  ASSERT_NO_FATAL_FAILURE(d.Init(/*awaiting=*/true));
  d.claim->store(uint32_t(Claim::kTaken));
  SendAll(d.rendezvous, Bytes("not a message of ours"));
  EXPECT_EQ(SettleNow(d.client.get(), &why), Settlement::kSettled);
  EXPECT_EQ(d.ClaimNow(), Claim::kTaken);
}

TEST(ShmSettleClientTest, ADeclineMakesItPlainFromByteZero) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/true));
  const std::vector<uint8_t> first = RandomBytes(3000, 5);
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(first));
  SendAll(c.rendezvous, DeclineBytes(c.msg.nonce, wire::DeclineReason::kBusy));
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kRendezvousBusy);
  EXPECT_EQ(c.ClaimNow(), Claim::kWithdrawn);
  ExpectPlainFromByteZero(&c, first, 31);
}

TEST(ShmSettleClientTest, AnAbandonedRegistrationIsDeclinedAndPlain) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/true));
  Registration reg = c.AsRegistration();
  EXPECT_EQ(reg.Abandon(), Claim::kAbandoned);
  EXPECT_EQ(AnswerOn(c.rendezvous_client),
            DeclineBytes(c.msg.nonce, wire::DeclineReason::kNoRegistration));
  EXPECT_FALSE(reg.Commit());  // (nothing to take any more)
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kDeclined);
  EXPECT_EQ(c.ClaimNow(), Claim::kAbandoned);
  ExpectPlainFromByteZero(&c, {}, 41);
}

TEST(ShmSettleClientTest, ACommitAfterTheClientWithdrewFailsAndDeclines) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/true));
  SendAll(c.rendezvous, DeclineBytes(c.msg.nonce, wire::DeclineReason::kResources));
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPlain);
  Registration reg = c.AsRegistration();
  EXPECT_FALSE(reg.Commit());
  EXPECT_EQ(c.ClaimNow(), Claim::kWithdrawn);
  EXPECT_EQ(reg.Abandon(), Claim::kWithdrawn);
}

TEST(ShmSettleClientTest, PlainBytesFromTheAcceptorMakeItPlainWithEveryByteDelivered) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/true));
  const std::vector<uint8_t> first = RandomBytes(1000, 6);
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(first));
  const std::vector<uint8_t> greeting = Bytes("220 a plain server speaks first\r\n");
  SendAll(c.tcp_server, greeting);
  testing::WaitFor(c.tcp_client, POLLIN);
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kAcceptedElsewhere);
  EXPECT_EQ(c.ClaimNow(), Claim::kWithdrawn);
  ChannelEnd client(c.client.get(), first.size());
  SocketEnd server(c.tcp_server);
  EXPECT_TRUE(Exchange(&client, &server, 20000, 20000, 51, first, greeting));
}

TEST(ShmSettleClientTest, TheEndFromTheAcceptorMakesItPlain) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/true));
  const std::vector<uint8_t> first = Bytes("request");
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(first));
  ASSERT_EQ(shutdown(c.tcp_server, SHUT_WR), 0);
  testing::WaitFor(c.tcp_client, POLLIN);
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kAcceptedElsewhere);
  // What it had written reaches the acceptor, and the end reaches the client.
  ChannelEnd client(c.client.get(), first.size());
  c.client->control()->OnAnchorReady(EPOLLIN | EPOLLOUT);
  EXPECT_EQ(ReadSome(c.tcp_server, first.size()), first);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!c.client->RxEof() && std::chrono::steady_clock::now() < deadline) {
    testing::WaitFor(c.tcp_client, POLLIN);
    c.client->control()->OnAnchorReady(EPOLLIN | EPOLLOUT);
  }
  EXPECT_TRUE(c.client->RxEof());
}

// Accepted by a process that does not take it (a sibling sharing the listener without the
// registration, a plain member of the group), and nothing said: the kernel shows the
// server's end accepted; after the grace the client withdraws: 100 ms, or 50 ms when the
// listener said it is shared by forked workers (whose acceptor gives up after 20 ms).
void WithdrawsAfterTheGrace(uint32_t listener_flags, uint64_t grace_ms) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/true, /*accepted=*/true, listener_flags));
  const std::vector<uint8_t> first = RandomBytes(2000, 7);
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(first));
  Reason why = Reason::kNone;
  const uint64_t look = c.client->control()->SettleDeadline();
  ASSERT_NE(look, 0u);
  EXPECT_EQ(SettleAt(c.client.get(), look - 1, &why), Settlement::kPending);  // not due yet
  EXPECT_EQ(c.client->control()->SettleDeadline(), look);
  EXPECT_EQ(SettleAt(c.client.get(), look, &why), Settlement::kPending);  // seen accepted
  const uint64_t grace_end = c.client->control()->SettleDeadline();
  EXPECT_EQ(grace_end, look + grace_ms);
  EXPECT_EQ(SettleAt(c.client.get(), grace_end - 1, &why), Settlement::kPending);
  EXPECT_EQ(SettleAt(c.client.get(), grace_end, &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kAcceptedElsewhere);
  EXPECT_EQ(c.ClaimNow(), Claim::kWithdrawn);
  ExpectPlainFromByteZero(&c, first, 61);
}

TEST(ShmSettleClientTest, AcceptedAndNotTakenItWithdrawsAfterTheGrace) {
  WithdrawsAfterTheGrace(0, 100);
  WithdrawsAfterTheGrace(kListenerSolo, 100);
}

TEST(ShmSettleClientTest, AcceptedAndNotTakenAtASharedListenerItWithdrawsSooner) {
  WithdrawsAfterTheGrace(kListenerShared, 50);
  WithdrawsAfterTheGrace(kListenerShared | kListenerSolo, 50);
}

// In the listener's queue nobody could have taken it plain: the client keeps looking, less
// often each time, for as long as a listener keeps a registration; its taker then finds
// it withdrawn, and the connection is plain at both ends.
TEST(ShmSettleClientTest, QueuedItKeepsLookingAndGivesUpOnlyAfterTheRegistrationsLife) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/true, /*accepted=*/false));
  const std::vector<uint8_t> first = RandomBytes(1500, 8);
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(first));
  Reason why = Reason::kNone;
  const uint64_t start = c.client->control()->SettleDeadline();
  uint64_t at = start, gap = 0;
  for (int look = 0; look < 12; ++look) {
    EXPECT_EQ(SettleAt(c.client.get(), at, &why), Settlement::kPending) << "look " << look;
    const uint64_t next = c.client->control()->SettleDeadline();
    ASSERT_GT(next, at);
    EXPECT_GE(next - at, gap) << "the looks grow apart";
    EXPECT_LE(next - at, 1000u);
    gap = next - at;
    at = next;
  }
  EXPECT_EQ(SettleAt(c.client.get(), start + 30000, &why), Settlement::kPending);
  EXPECT_EQ(SettleAt(c.client.get(), start + 40000, &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kHandshakeTimeout);
  ASSERT_NO_FATAL_FAILURE(c.Accept());
  Registration reg = c.AsRegistration();
  EXPECT_FALSE(reg.Commit());
  ExpectPlainFromByteZero(&c, first, 71);
}

TEST(ShmSettleClientTest, EofOnTheRendezvousMakesItPlain) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/true));
  CloseIf(&c.rendezvous);
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPlain);
  EXPECT_EQ(why, Reason::kDeclined);
  EXPECT_EQ(c.ClaimNow(), Claim::kWithdrawn);
}

TEST(ShmSettleClientTest, AnAnswerThatIsNotForItMakesItPlain) {
  for (const auto& answer :
       {AcceptBytes(12345), Bytes("garbage"), DeclineBytes(999, wire::DeclineReason::kBusy)}) {
    Connection c;
    ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/true));
    SendAll(c.rendezvous, answer);
    Reason why = Reason::kNone;
    EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPlain);
    EXPECT_EQ(why, Reason::kDeclined);
    EXPECT_EQ(c.ClaimNow(), Claim::kWithdrawn);
  }
}

TEST(ShmSettleClientTest, GarbageInTheClaimIsNotTaken) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/true));
  c.claim->store(77);
  Reason why = Reason::kNone;
  EXPECT_EQ(SettleNow(c.client.get(), &why), Settlement::kPlain);
  ExpectPlainFromByteZero(&c, {}, 81);
}

TEST(ShmSettleClientTest, DestroyingAnUntakenClientWithdrawsAndSendsItsBytesOnTcp) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/true));
  const std::vector<uint8_t> first = RandomBytes(2500, 9);
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(first));
  c.client->CloseTx();  // as the Stream does when the application closes
  c.client->CloseRx();
  c.client.reset();
  EXPECT_EQ(c.ClaimNow(), Claim::kWithdrawn);
  Registration reg = c.AsRegistration();
  EXPECT_FALSE(reg.Commit());
  std::vector<uint8_t> got = ReadSome(c.tcp_server, first.size() + 1);
  EXPECT_EQ(got, first);  // everything, then the end (ReadSome stops at EOF)
  char byte;
  EXPECT_EQ(recv(c.tcp_server, &byte, 1, MSG_DONTWAIT), 0);
}

TEST(ShmSettleClientTest, DestroyingATakenClientLeavesTheStreamOnTheRings) {
  Connection c;
  ASSERT_NO_FATAL_FAILURE(c.Init(/*awaiting=*/true));
  Registration reg = c.AsRegistration();
  ASSERT_TRUE(reg.Commit());
  const std::vector<uint8_t> first = Bytes("taken, then closed before it settled");
  ASSERT_NO_FATAL_FAILURE(c.ClientPublishes(first));
  c.client->CloseTx();
  c.client->CloseRx();
  c.client.reset();
  EXPECT_EQ(c.ClaimNow(), Claim::kTaken);
  ChannelEnd server(c.server.get());
  std::vector<uint8_t> got(first.size());
  EXPECT_EQ(server.Recv(got.data(), got.size()), first.size());
  EXPECT_EQ(got, first);
  EXPECT_TRUE(c.server->RxEof());
  EXPECT_TRUE(NothingToRead(c.tcp_server));
}

}  // namespace
}  // namespace slip::shm
