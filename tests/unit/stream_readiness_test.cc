// Tests for the stream engine's readiness (tests/unit/stream_fixture.h has the setting):
// the proxy's poll and epoll bits in every state, edges, interest, and a large read's
// credits.
#include <gtest/gtest.h>

#include "tests/unit/stream_fixture.h"

namespace slip {
namespace {

using namespace stream_fixture;  // NOLINT(google-build-using-namespace)

// ---------------------------------------------------------------------------- readiness

// poll() on proxy A after PrepareToSleep is what an application sleeping in poll/epoll sees.
TEST_F(StreamTest, ProxyReadinessFollowsTheRings) {
  const int fd = pair_.client_fd;
  client_->PrepareToSleep(kAllEvents);
  EXPECT_EQ(Bits(PollNow(fd)), "OUT");

  // A publish while the reader is armed writes a token: readable.
  ASSERT_EQ(SendString(server_, "abc"), 3);
  EXPECT_EQ(Bits(PollNow(fd)), "IN|OUT");
  EXPECT_EQ(RecvString(client_, 8), "abc");
  client_->PrepareToSleep(kAllEvents);
  EXPECT_EQ(Bits(PollNow(fd)), "OUT") << "readable after the ring was drained";

  // Bytes published while nobody was armed: PrepareToSleep makes the proxy true.
  ASSERT_EQ(SendString(server_, "defg"), 4);
  client_->PrepareToSleep(EPOLLIN);
  EXPECT_EQ(Bits(PollNow(fd)), "IN|OUT");
  client_->PrepareToSleep(EPOLLIN);  // again: still exactly readable, nothing doubled
  EXPECT_EQ(RecvString(client_, 2), "de");
  client_->PrepareToSleep(EPOLLIN);
  EXPECT_EQ(Bits(PollNow(fd)), "IN|OUT") << "bytes left, but not readable";
  EXPECT_EQ(RecvString(client_, 8), "fg");
  client_->PrepareToSleep(EPOLLIN);
  EXPECT_EQ(Bits(PollNow(fd)), "OUT");

  // A full ring: not writable after EAGAIN, writable again once the peer reads.
  EXPECT_EQ(FillRing(client_), kSmallRing);
  client_->PrepareToSleep(EPOLLOUT);
  EXPECT_EQ(Bits(PollNow(fd)), "0");
  EXPECT_EQ(client_->Ready(EPOLLOUT), 0u);
  char byte;
  ASSERT_EQ(RecvBytes(server_, &byte, 1), 1);
  EXPECT_EQ(Bits(PollNow(fd)), "OUT") << "the peer's read did not make the proxy writable";
  EXPECT_EQ(client_->Ready(EPOLLOUT), uint32_t(EPOLLOUT));

  // Full again by a plain send (no EAGAIN): PrepareToSleep alone makes it unwritable.
  ASSERT_EQ(SendBytes(client_, "x", 1), 1);
  client_->PrepareToSleep(EPOLLOUT);
  EXPECT_EQ(Bits(PollNow(fd)), "0");
  std::vector<uint8_t> buf(kSmallRing);
  ASSERT_EQ(RecvBytes(server_, buf.data(), buf.size()), ssize_t(kSmallRing));
  EXPECT_EQ(Bits(PollNow(fd)), "OUT");
  client_->PrepareToSleep(kAllEvents);
  EXPECT_EQ(Bits(PollNow(fd)), "OUT");
}

TEST_F(StreamTest, PollWakesWhenThePeerActs) {
  const int fd = pair_.client_fd;
  auto poll_for = [fd](short events) {
    pollfd p{fd, events, 0};
    return poll(&p, 1, 5000) == 1 ? ssize_t(p.revents) : ssize_t(-1);
  };
  client_->PrepareToSleep(EPOLLIN);
  auto waiter = Start([&] { return poll_for(POLLIN); });
  ASSERT_TRUE(waiter->WaitUntilAsleep());
  ASSERT_EQ(SendString(server_, "ping"), 4);
  ASSERT_TRUE(waiter->WaitFor(seconds(5)));
  EXPECT_EQ(waiter->result(), POLLIN);
  EXPECT_EQ(RecvString(client_, 8), "ping");

  FillRing(client_);
  client_->PrepareToSleep(EPOLLOUT);
  auto writer = Start([&] { return poll_for(POLLOUT); });
  ASSERT_TRUE(writer->WaitUntilAsleep());
  std::vector<uint8_t> buf(100);
  ASSERT_EQ(RecvBytes(server_, buf.data(), buf.size()), 100);
  ASSERT_TRUE(writer->WaitFor(seconds(5)));
  EXPECT_EQ(writer->result(), POLLOUT);
}

TEST_F(StreamTest, EdgeTriggeredEpollSeesEdges) {
  const int fd = pair_.client_fd;
  int ep = epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(ep, 0);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLET;
  ASSERT_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev), 0);
  auto wait = [ep](int timeout_ms) {
    epoll_event out{};
    return epoll_wait(ep, &out, 1, timeout_ms) == 1 ? out.events : 0u;
  };
  EXPECT_EQ(Bits(wait(0)), "OUT");  // the state at ADD
  EXPECT_EQ(Bits(wait(0)), "0");
  client_->PrepareToSleep(EPOLLIN | EPOLLOUT);
  EXPECT_EQ(Bits(wait(0)), "0");
  ASSERT_EQ(SendString(server_, "edge"), 4);
  EXPECT_EQ(wait(2000) & EPOLLIN, uint32_t(EPOLLIN));
  EXPECT_EQ(RecvString(client_, 8), "edge");

  FillRing(client_);
  client_->PrepareToSleep(EPOLLIN | EPOLLOUT);
  wait(0);  // whatever the fill itself edged
  EXPECT_EQ(Bits(wait(0)), "0");
  std::vector<uint8_t> buf(kSmallRing);
  ASSERT_EQ(RecvBytes(server_, buf.data(), 10), 10);
  EXPECT_EQ(wait(2000) & EPOLLOUT, uint32_t(EPOLLOUT)) << "no EPOLLOUT edge when room came";
  close(ep);
}

// Ready() and the proxy (after PrepareToSleep) must tell the same story, the one TCP tells.
TEST_F(StreamTest, ReadyBitsAndProxyAgreeInEveryState) {
  struct Case {
    const char* state;
    std::function<void(Stream* client, Stream* server)> setup;
    std::string want;
  };
  const std::vector<Case> cases = {
      {"fresh", [](Stream*, Stream*) {}, "OUT"},
      {"peer sent", [](Stream* client, Stream* server) { SendString(server, "d"); }, "IN|OUT"},
      {"own ring full", [](Stream* client, Stream* server) { FillRing(client); }, "0"},
      {"full ring, peer sent",
       [](Stream* client, Stream* server) {
         FillRing(client);
         SendString(server, "d");
       },
       "IN"},
      {"peer shut down writing", [](Stream* client, Stream* server) { server->ShutdownWrite(); },
       "IN|OUT|RDHUP"},
      {"we shut down writing", [](Stream* client, Stream* server) { client->ShutdownWrite(); },
       "OUT"},
      {"both shut down writing",
       [](Stream* client, Stream* server) {
         client->ShutdownWrite();
         server->ShutdownWrite();
       },
       "IN|OUT|RDHUP|HUP"},
      {"we shut down reading", [](Stream* client, Stream* server) { client->ShutdownRead(); },
       "IN|OUT|RDHUP"},
      {"peer closed", [](Stream* client, Stream* server) { server->Close(); }, "IN|OUT|RDHUP"},
      {"full ring, then peer closed",
       [](Stream* client, Stream* server) {
         FillRing(client);
         server->Close();
       },
       "IN|OUT|RDHUP"},
      // A dead peer's kernel sent FIN: HUP only after we shut down writing, as for TCP.
      {"peer gone", [](Stream* client, Stream* server) { client->MarkPeerGone(); }, "IN|OUT|RDHUP"},
      {"full ring, then peer gone",
       [](Stream* client, Stream* server) {
         FillRing(client);
         client->MarkPeerGone();
       },
       "IN|OUT|RDHUP"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.state);
    Connect(kSmallRing, 0);
    c.setup(client_, server_);
    EXPECT_EQ(Bits(client_->Ready(kAllEvents)), c.want) << "Ready()";
    client_->PrepareToSleep(kAllEvents);
    EXPECT_EQ(Bits(PollNow(pair_.client_fd)), c.want) << "poll on proxy A";
  }
}

TEST_F(StreamTest, ReadyHonoursInterest) {
  ASSERT_EQ(SendString(server_, "d"), 1);
  EXPECT_EQ(client_->Ready(EPOLLIN), uint32_t(EPOLLIN));
  EXPECT_EQ(client_->Ready(EPOLLOUT), uint32_t(EPOLLOUT));
  EXPECT_EQ(client_->Ready(0), 0u);
  server_->ShutdownWrite();
  EXPECT_EQ(client_->Ready(EPOLLIN), uint32_t(EPOLLIN));  // RDHUP only when asked for
  client_->ShutdownWrite();
  EXPECT_EQ(client_->Ready(0), uint32_t(EPOLLHUP));  // HUP always
}

// The real channel, with every consumer cursor the stream gives it written down: what
// the peer is credited, and when.
class CreditLog final : public Channel {
 public:
  explicit CreditLog(std::unique_ptr<Channel> inner) noexcept
      : Channel(inner->ring_size()), inner_(std::move(inner)) {}
  TransportKind kind() const noexcept override { return inner_->kind(); }
  uint64_t RxProduced() const noexcept override { return inner_->RxProduced(); }
  const uint8_t* RxData() const noexcept override { return inner_->RxData(); }
  void RxConsumed(uint64_t consumed) noexcept override {
    credits.push_back(consumed);
    inner_->RxConsumed(consumed);
  }
  bool RxEof() const noexcept override { return inner_->RxEof(); }
  WakeState* RxWake() noexcept override { return inner_->RxWake(); }
  int Error() const noexcept override { return inner_->Error(); }
  uint64_t TxConsumed() const noexcept override { return inner_->TxConsumed(); }
  void TxCopy(uint32_t offset, const void* src, size_t len) noexcept override {
    inner_->TxCopy(offset, src, len);
  }
  void TxPublish(uint64_t produced) noexcept override { inner_->TxPublish(produced); }
  bool TxPeerClosed() const noexcept override { return inner_->TxPeerClosed(); }
  WakeState* TxWake() noexcept override { return inner_->TxWake(); }
  void CloseTx() noexcept override { inner_->CloseTx(); }
  void CloseRx() noexcept override { inner_->CloseRx(); }
  ChannelControl* control() noexcept override { return inner_->control(); }

  std::vector<uint64_t> credits;  // (the receiving thread's)

 private:
  std::unique_ptr<Channel> inner_;
};

// A read of a whole ring credits it a quarter at a time, so that the sender refills what
// the reader freed while the reader copies the rest (crediting once at the end made the
// two ends take turns over whole rings: half the bandwidth at 1 MiB writes). Content is
// checked over randomized sizes as ever.
TEST(StreamCredit, ALargeReadCreditsAQuarterRingAtATime) {
  constexpr uint32_t kRing = 1u << 16;
  CreditLog* log = nullptr;
  StreamPair pair;
  ASSERT_TRUE(MakeStreamPair(kRing, StreamOptions{}, &pair, [&](std::unique_ptr<Channel> real) {
    auto spy = std::make_unique<CreditLog>(std::move(real));
    log = spy.get();
    return std::unique_ptr<Channel>(std::move(spy));
  }));
  std::mt19937 rng(7);
  std::vector<uint8_t> sent(kRing);
  for (auto& b : sent) b = uint8_t(rng());
  ASSERT_EQ(SendBytes(pair.client.get(), sent.data(), kRing), ssize_t(kRing));  // a full ring
  std::vector<uint8_t> got(kRing);
  ASSERT_EQ(RecvBytes(pair.server.get(), got.data(), kRing), ssize_t(kRing));
  EXPECT_TRUE(got == sent);
  ASSERT_EQ(log->credits.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(log->credits[i], (i + 1) * kRing / 4);

  // Randomized sizes: every byte once, in order, each credit at most a quarter ring on.
  std::vector<uint8_t> stream(3 * kRing + 12345);
  for (auto& b : stream) b = uint8_t(rng());
  Task writer(&pair, [&] {
    size_t done = 0;
    while (done < stream.size()) {
      const size_t n = std::min<size_t>(stream.size() - done, 1 + rng() % (2 * kRing));
      if (SendBytes(pair.client.get(), stream.data() + done, n) != ssize_t(n)) return ssize_t(-1);
      done += n;
    }
    return ssize_t(done);
  });
  std::mt19937 read_rng(8);
  std::vector<uint8_t> received;
  uint64_t last = log->credits.back();
  while (received.size() < stream.size()) {
    std::vector<uint8_t> buf(1 + read_rng() % (2 * kRing));
    const ssize_t n = RecvBytes(pair.server.get(), buf.data(), buf.size());
    ASSERT_GT(n, 0);
    received.insert(received.end(), buf.begin(), buf.begin() + n);
  }
  EXPECT_TRUE(received == stream);
  for (size_t i = 4; i < log->credits.size(); ++i) {
    EXPECT_LE(log->credits[i] - last, kRing / 4);
    last = log->credits[i];
  }
  EXPECT_TRUE(writer.WaitFor(seconds(10)));
}

}  // namespace
}  // namespace slip
