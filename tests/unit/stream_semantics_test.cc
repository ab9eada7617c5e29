// Tests for the stream engine's TCP semantics (tests/unit/stream_fixture.h has the
// setting): peeking, gathering, MSG_WAITALL and MSG_DONTWAIT, the ends (shutdown, close,
// the peer gone, EPIPE and SIGPIPE), timeouts and signals, and several blocked threads.
#include <gtest/gtest.h>

#include "tests/unit/stream_fixture.h"

namespace slip {
namespace {

using namespace stream_fixture;  // NOLINT(google-build-using-namespace)

TEST_F(StreamTest, PeekDoesNotConsume) {
  ASSERT_EQ(SendString(server_, "hello world"), 11);
  EXPECT_EQ(RecvString(client_, 5, MSG_PEEK), "hello");
  EXPECT_EQ(client_->ReadableBytes(), 11u);
  EXPECT_EQ(RecvString(client_, 64, MSG_PEEK), "hello world");
  EXPECT_EQ(RecvString(client_, 64, MSG_PEEK | MSG_DONTWAIT), "hello world");
  EXPECT_EQ(server_->UnconsumedBytes(), 11u);
  EXPECT_EQ(RecvString(client_, 6), "hello ");
  EXPECT_EQ(RecvString(client_, 64, MSG_PEEK), "world");
  EXPECT_EQ(RecvString(client_, 64), "world");
  EXPECT_EQ(client_->ReadableBytes(), 0u);
  EXPECT_EQ(RecvString(client_, 64, MSG_PEEK | MSG_DONTWAIT), "<" + std::to_string(-EAGAIN) + ">");
}

TEST_F(StreamTest, PeekAndReceiveAcrossTheRingWrap) {
  std::vector<uint8_t> data(3000), got(3000);
  Pattern(1, 0, data.data(), data.size());
  ASSERT_EQ(SendBytes(server_, data.data(), data.size()), 3000);
  ASSERT_EQ(RecvBytes(client_, got.data(), got.size()), 3000);
  ASSERT_EQ(got, data);
  Pattern(2, 0, data.data(), data.size());  // 3000..6000: wraps at 4096
  ASSERT_EQ(SendBytes(server_, data.data(), data.size()), 3000);
  EXPECT_EQ(client_->ReadableBytes(), 3000u);
  std::fill(got.begin(), got.end(), 0);
  ASSERT_EQ(RecvBytes(client_, got.data(), got.size(), MSG_PEEK), 3000);
  EXPECT_EQ(got, data);
  std::fill(got.begin(), got.end(), 0);
  // Into three pieces, the middle one straddling the wrap.
  iovec iov[3] = {{got.data(), 1000}, {got.data() + 1000, 1500}, {got.data() + 2500, 500}};
  ASSERT_EQ(client_->Recv(iov, 3, 0, false), 3000);
  EXPECT_EQ(got, data);
}

TEST_F(StreamTest, SendGathersAnIovecArray) {
  std::string a = "first,", b, c = "third";
  std::vector<uint8_t> big(5000);  // larger than the ring: the send waits for the reader
  Pattern(3, 0, big.data(), big.size());
  iovec iov[4] = {
      {a.data(), a.size()}, {b.data(), 0}, {big.data(), big.size()}, {c.data(), c.size()}};
  auto sender = Start([&] { return client_->Send(iov, 4, MSG_NOSIGNAL, false); });
  std::vector<uint8_t> got(6 + 5000 + 5);
  EXPECT_EQ(RecvBytes(server_, got.data(), got.size(), MSG_WAITALL), ssize_t(got.size()));
  ASSERT_TRUE(sender->WaitFor(seconds(5)));
  EXPECT_EQ(sender->result(), ssize_t(got.size()));
  EXPECT_EQ(std::string(got.begin(), got.begin() + 6), a);
  EXPECT_TRUE(std::equal(big.begin(), big.end(), got.begin() + 6));
  EXPECT_EQ(std::string(got.end() - 5, got.end()), c);
}

TEST_F(StreamTest, WaitAllGathersAcrossSeveralSends) {
  std::vector<uint8_t> data(1000), got(1000, 0);
  Pattern(4, 0, data.data(), data.size());
  iovec iov[3] = {{got.data(), 100}, {got.data() + 100, 0}, {got.data() + 100, 900}};
  auto reader = Start([&] { return server_->Recv(iov, 3, MSG_WAITALL, false); });
  ASSERT_EQ(SendBytes(client_, data.data(), 300), 300);
  EXPECT_FALSE(reader->WaitFor(milliseconds(50))) << "returned after 300 of 1000 bytes";
  ASSERT_EQ(SendBytes(client_, data.data() + 300, 300), 300);
  EXPECT_FALSE(reader->WaitFor(milliseconds(50))) << "returned after 600 of 1000 bytes";
  ASSERT_EQ(SendBytes(client_, data.data() + 600, 400), 400);
  ASSERT_TRUE(reader->WaitFor(seconds(5)));
  EXPECT_EQ(reader->result(), 1000);
  EXPECT_EQ(got, data);
}

TEST_F(StreamTest, WaitAllLargerThanTheRing) {
  const size_t len = 3 * kSmallRing + 17;
  std::vector<uint8_t> data(len), got(len, 0);
  Pattern(5, 0, data.data(), len);
  auto reader = Start([&] { return RecvBytes(server_, got.data(), len, MSG_WAITALL); });
  for (size_t off = 0; off < len; off += 999) {
    size_t n = std::min<size_t>(999, len - off);
    ASSERT_EQ(SendBytes(client_, data.data() + off, n), ssize_t(n));
  }
  ASSERT_TRUE(reader->WaitFor(seconds(5)));
  EXPECT_EQ(reader->result(), ssize_t(len));
  EXPECT_EQ(got, data);
}

TEST_F(StreamTest, WaitAllIntoManyIovecs) {
  // More pieces than the receive path's continuation array (64) holds at once.
  constexpr size_t kPieces = 150, kPiece = 20;
  std::vector<uint8_t> data(kPieces * kPiece), got(kPieces * kPiece, 0);
  Pattern(6, 0, data.data(), data.size());
  std::vector<iovec> iov(kPieces);
  for (size_t i = 0; i < kPieces; ++i) iov[i] = iovec{got.data() + i * kPiece, kPiece};
  auto reader = Start([&] { return server_->Recv(iov.data(), int(kPieces), MSG_WAITALL, false); });
  for (size_t off = 0; off < data.size(); off += 7) {
    size_t n = std::min<size_t>(7, data.size() - off);
    ASSERT_EQ(SendBytes(client_, data.data() + off, n), ssize_t(n));
    if (off % 700 == 0) std::this_thread::sleep_for(milliseconds(1));
  }
  ASSERT_TRUE(reader->WaitFor(seconds(5)));
  EXPECT_EQ(reader->result(), ssize_t(data.size()));
  EXPECT_EQ(got, data);
}

TEST_F(StreamTest, WaitAllStopsAtEof) {
  ASSERT_EQ(SendString(client_, "short"), 5);
  ASSERT_EQ(client_->ShutdownWrite(), 0);
  EXPECT_EQ(RecvString(server_, 100, MSG_WAITALL), "short");
  EXPECT_EQ(RecvString(server_, 100, MSG_WAITALL), "");
}

TEST_F(StreamTest, DontWaitOnAnEmptyRingGivesEagain) {
  char buf[16];
  auto start = Clock::now();
  EXPECT_EQ(RecvBytes(client_, buf, sizeof(buf), MSG_DONTWAIT), -EAGAIN);
  EXPECT_EQ(RecvBytes(client_, buf, sizeof(buf), 0, /*nonblocking=*/true), -EAGAIN);
  EXPECT_EQ(RecvBytes(client_, buf, sizeof(buf), MSG_WAITALL | MSG_DONTWAIT), -EAGAIN);
  EXPECT_LT(Clock::now() - start, seconds(1));
  // Data that arrives later is received.
  ASSERT_EQ(SendString(server_, "late"), 4);
  EXPECT_EQ(RecvString(client_, 16, MSG_DONTWAIT), "late");
  EXPECT_EQ(RecvBytes(client_, buf, sizeof(buf), MSG_DONTWAIT), -EAGAIN);
}

TEST_F(StreamTest, DontWaitSendOnAFullRing) {
  EXPECT_EQ(FillRing(client_), kSmallRing);
  EXPECT_EQ(server_->ReadableBytes(), kSmallRing);
  char byte = 'x';
  EXPECT_EQ(SendBytes(client_, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT), -EAGAIN);
  // EAGAIN leaves the proxy unwritable by itself, for a waiter that already sleeps.
  EXPECT_EQ(PollNow(pair_.client_fd) & POLLOUT, 0u);
  EXPECT_EQ(client_->Ready(EPOLLOUT), 0u);
  std::vector<uint8_t> buf(10);
  ASSERT_EQ(RecvBytes(server_, buf.data(), buf.size()), 10);
  // A partial send: only the room there is.
  std::vector<uint8_t> more(100, 'y');
  EXPECT_EQ(SendBytes(client_, more.data(), more.size(), MSG_NOSIGNAL | MSG_DONTWAIT), 10);
  EXPECT_EQ(client_->UnconsumedBytes(), kSmallRing);
}

TEST_F(StreamTest, ZeroLengthSendAndReceive) {
  char buf[8] = {};
  EXPECT_EQ(SendBytes(client_, buf, 0), 0);
  EXPECT_EQ(client_->Send(nullptr, 0, MSG_NOSIGNAL, false), 0);
  EXPECT_EQ(server_->ReadableBytes(), 0u);
  EXPECT_EQ(client_->UnconsumedBytes(), 0u);
  // On an empty ring, even a blocking zero-length receive returns at once.
  auto reader = Start([&] { return RecvBytes(server_, buf, 0); });
  ASSERT_TRUE(reader->WaitFor(seconds(2))) << "a zero-length recv blocked";
  EXPECT_EQ(reader->result(), 0);
  ASSERT_EQ(SendString(client_, "abc"), 3);
  EXPECT_EQ(RecvBytes(server_, buf, 0), 0);
  EXPECT_EQ(server_->ReadableBytes(), 3u) << "a zero-length recv consumed bytes";
  EXPECT_EQ(RecvString(server_, 8), "abc");
  // On a full ring, a zero-length send still succeeds without blocking.
  FillRing(client_);
  EXPECT_EQ(SendBytes(client_, buf, 0), 0);
}

TEST_F(StreamTest, ShutdownWriteDeliversTheRestThenEof) {
  std::vector<uint8_t> data(100), got(100, 0);
  Pattern(7, 0, data.data(), data.size());
  ASSERT_EQ(SendBytes(server_, data.data(), 100), 100);
  ASSERT_EQ(server_->ShutdownWrite(), 0);
  EXPECT_EQ(server_->ShutdownWrite(), 0);  // again: no effect
  // The peer's proxy reports it like a TCP FIN, without any PrepareToSleep.
  uint32_t ev = PollNow(pair_.client_fd);
  EXPECT_EQ(ev & (POLLIN | POLLRDHUP), uint32_t(POLLIN | POLLRDHUP)) << Bits(ev);
  EXPECT_EQ(client_->Ready(EPOLLIN | EPOLLRDHUP), uint32_t(EPOLLIN | EPOLLRDHUP));
  ASSERT_EQ(RecvBytes(client_, got.data(), 60), 60);
  ASSERT_EQ(RecvBytes(client_, got.data() + 60, 100), 40);
  EXPECT_EQ(got, data);
  EXPECT_EQ(RecvString(client_, 10), "");
  EXPECT_EQ(RecvString(client_, 10), "");
  EXPECT_EQ(RecvString(client_, 10, MSG_DONTWAIT), "");
  EXPECT_EQ(RecvString(client_, 10, MSG_PEEK), "");
  // The shut side cannot send; the other direction still works (half-close).
  EXPECT_EQ(SendString(server_, "more"), -EPIPE);
  ASSERT_EQ(SendString(client_, "reply"), 5);
  EXPECT_EQ(RecvString(server_, 10), "reply");
}

TEST_F(StreamTest, ShutdownWriteWakesABlockedReaderOfThePeer) {
  auto reader = StartReader(client_);
  ASSERT_TRUE(reader->WaitUntilAsleep());
  ASSERT_EQ(server_->ShutdownWrite(), 0);
  ASSERT_TRUE(reader->WaitFor(seconds(5)));
  EXPECT_EQ(reader->result(), 0);
}

// As TCP, whose kernel resets a connection closed with bytes unread: the next send reports
// the reset once (no SIGPIPE), then EPIPE.
TEST_F(StreamTest, CloseWithBytesUnreadResetsThePeersNextSendThenEpipe) {
  ASSERT_EQ(SendString(client_, "unread"), 6);
  server_->Close();
  EXPECT_EQ(SendString(client_, "x"), -ECONNRESET);
  EXPECT_EQ(SendString(client_, "x", MSG_NOSIGNAL), -EPIPE);
  EXPECT_EQ(SendBytes(client_, "", 0), -EPIPE);
  EXPECT_EQ(RecvString(client_, 8), "");  // the close also ended the server's sending side
  uint32_t ev = PollNow(pair_.client_fd);
  EXPECT_EQ(ev & (POLLIN | POLLRDHUP), uint32_t(POLLIN | POLLRDHUP)) << Bits(ev);
}

// Destroying one end only releases that process's resources: after fork another process
// may still hold the connection. The peer learns of the last holder from the TCP anchor's
// FIN, which the control thread turns into MarkPeerGone.
TEST_F(StreamTest, DestroyingOneEndTellsNothingUntilTheAnchorCloses) {
  ASSERT_EQ(SendString(server_, "bye"), 3);
  {
    std::lock_guard<std::mutex> lock(pair_mu_);
    pair_.server.reset();
    server_ = nullptr;
  }
  EXPECT_EQ(RecvString(client_, 8), "bye");
  EXPECT_EQ(RecvString(client_, 8, MSG_DONTWAIT), "<-11>") << "EOF before the anchor closed";
  client_->MarkPeerGone();
  EXPECT_EQ(RecvString(client_, 8), "");
  // As TCP after an orderly close: one more write is accepted (and lost), then EPIPE.
  EXPECT_EQ(SendString(client_, "x", MSG_NOSIGNAL), 1);
  EXPECT_EQ(SendString(client_, "x", MSG_NOSIGNAL), -EPIPE);
}

TEST_F(StreamTest, EpipeRaisesSigpipeUnlessNosignal) {
  server_->Close();
  sigset_t pipe_set, old_set, pending;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  ASSERT_EQ(pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set), 0);
  const timespec zero{0, 0};
  while (sigtimedwait(&pipe_set, nullptr, &zero) == SIGPIPE) {
  }
  // As TCP: the first write after the peer's orderly close is accepted, without a signal.
  EXPECT_EQ(SendString(client_, "x", 0), 1);
  sigpending(&pending);
  EXPECT_FALSE(sigismember(&pending, SIGPIPE)) << "SIGPIPE on the write TCP accepts";
  EXPECT_EQ(SendString(client_, "x", MSG_NOSIGNAL), -EPIPE);
  sigpending(&pending);
  EXPECT_FALSE(sigismember(&pending, SIGPIPE)) << "SIGPIPE despite MSG_NOSIGNAL";
  EXPECT_EQ(SendString(client_, "x", 0), -EPIPE);
  sigpending(&pending);
  EXPECT_TRUE(sigismember(&pending, SIGPIPE)) << "no SIGPIPE without MSG_NOSIGNAL";
  while (sigtimedwait(&pipe_set, nullptr, &zero) == SIGPIPE) {
  }
  pthread_sigmask(SIG_SETMASK, &old_set, nullptr);
}

// The peer closes with a ring full of our bytes unread: as TCP's reset, ECONNRESET.
TEST_F(StreamTest, BlockedSenderWakesWithAResetWhenThePeerClosesUnread) {
  FillRing(client_);
  auto sender = Start([&] { return SendString(client_, "more"); });
  ASSERT_TRUE(sender->WaitUntilAsleep());
  EXPECT_FALSE(sender->WaitFor(milliseconds(0)));
  server_->Close();
  ASSERT_TRUE(sender->WaitFor(seconds(5)));
  EXPECT_EQ(sender->result(), -ECONNRESET);
}

TEST_F(StreamTest, ShutdownWriteWakesOwnBlockedSenderWithEpipe) {
  FillRing(client_);
  auto sender = Start([&] { return SendString(client_, "more"); });
  ASSERT_TRUE(sender->WaitUntilAsleep());
  ASSERT_EQ(client_->ShutdownWrite(), 0);
  ASSERT_TRUE(sender->WaitFor(seconds(5)));
  EXPECT_EQ(sender->result(), -EPIPE);
  // What was sent before the shutdown still arrives, then EOF.
  std::vector<uint8_t> buf(2 * kSmallRing);
  EXPECT_EQ(RecvBytes(server_, buf.data(), buf.size(), MSG_WAITALL), ssize_t(kSmallRing));
  EXPECT_EQ(RecvBytes(server_, buf.data(), buf.size()), 0);
}

// Linux TCP delivers what is already queued after shutdown(SHUT_RD), then EOF.
TEST_F(StreamTest, ShutdownReadStillDeliversQueuedBytes) {
  ASSERT_EQ(SendString(server_, "queued"), 6);
  ASSERT_EQ(client_->ShutdownRead(), 0);
  EXPECT_EQ(RecvString(client_, 16), "queued");
  EXPECT_EQ(RecvString(client_, 16), "");
}

TEST_F(StreamTest, ShutdownReadReturnsZeroAndWakesABlockedReader) {
  auto reader = StartReader(client_);
  ASSERT_TRUE(reader->WaitUntilAsleep());
  ASSERT_EQ(client_->ShutdownRead(), 0);
  ASSERT_TRUE(reader->WaitFor(seconds(5)));
  EXPECT_EQ(reader->result(), 0);
  EXPECT_EQ(RecvString(client_, 8), "");
  EXPECT_EQ(RecvString(client_, 8, MSG_DONTWAIT), "");
  // Writing still works.
  ASSERT_EQ(SendString(client_, "still"), 5);
  EXPECT_EQ(RecvString(server_, 8), "still");
}

TEST_F(StreamTest, MarkPeerGoneWakesABlockedReaderWithEof) {
  auto reader = StartReader(client_);
  ASSERT_TRUE(reader->WaitUntilAsleep());
  client_->MarkPeerGone();
  ASSERT_TRUE(reader->WaitFor(seconds(5)));
  EXPECT_EQ(reader->result(), 0);
  EXPECT_EQ(SendString(client_, "x", MSG_NOSIGNAL), 1);  // accepted once, as TCP does
  EXPECT_EQ(SendString(client_, "x", MSG_NOSIGNAL), -EPIPE);
}

TEST_F(StreamTest, MarkPeerGoneWithOurBytesUnreadResetsOnce) {
  ASSERT_EQ(SendString(client_, "never read"), 10);
  auto reader = StartReader(client_);
  ASSERT_TRUE(reader->WaitUntilAsleep());
  client_->MarkPeerGone();
  ASSERT_TRUE(reader->WaitFor(seconds(5)));
  EXPECT_EQ(reader->result(), -ECONNRESET);
  EXPECT_EQ(RecvString(client_, 8), "");
  EXPECT_EQ(RecvString(client_, 8, MSG_DONTWAIT), "");
  EXPECT_EQ(SendString(client_, "x"), -EPIPE);
}

TEST_F(StreamTest, MarkPeerGoneDeliversThePeersLastBytesFirst) {
  ASSERT_EQ(SendString(server_, "last words"), 10);
  ASSERT_EQ(SendString(client_, "unread"), 6);
  client_->MarkPeerGone();
  EXPECT_EQ(RecvString(client_, 64), "last words");
  EXPECT_EQ(RecvString(client_, 64, MSG_DONTWAIT), "<" + std::to_string(-ECONNRESET) + ">");
  EXPECT_EQ(RecvString(client_, 64), "");
}

// The peer dies while a blocking Recv is still spinning (before it sleeps in the kernel): the
// reset must be reported just the same.
TEST_F(StreamTest, MarkPeerGoneDuringTheSpinStillResets) {
  Connect(kSmallRing, /*spin_us=*/300000);
  ASSERT_EQ(SendString(client_, "never read"), 10);
  auto reader = StartReader(client_);
  std::this_thread::sleep_for(milliseconds(50));  // inside the 300 ms spin
  client_->MarkPeerGone();
  ASSERT_TRUE(reader->WaitFor(seconds(5)));
  EXPECT_EQ(reader->result(), -ECONNRESET);
}

TEST_F(StreamTest, MarkPeerGoneWakesABlockedSenderWithAReset) {
  FillRing(client_);
  auto sender = Start([&] { return SendString(client_, "more"); });
  ASSERT_TRUE(sender->WaitUntilAsleep());
  client_->MarkPeerGone();
  ASSERT_TRUE(sender->WaitFor(seconds(5)));
  EXPECT_EQ(sender->result(), -ECONNRESET);  // its ring was full of our bytes
  EXPECT_EQ(SendString(client_, "x", MSG_NOSIGNAL), -EPIPE);
}

TEST_F(StreamTest, ReadableAndUnconsumedBytes) {
  EXPECT_EQ(server_->ReadableBytes(), 0u);
  EXPECT_EQ(client_->UnconsumedBytes(), 0u);
  std::vector<uint8_t> data(100);
  Pattern(8, 0, data.data(), data.size());
  ASSERT_EQ(SendBytes(client_, data.data(), 100), 100);
  EXPECT_EQ(client_->UnconsumedBytes(), 100u);
  EXPECT_EQ(server_->ReadableBytes(), 100u);
  EXPECT_EQ(server_->UnconsumedBytes(), 0u);
  EXPECT_EQ(client_->ReadableBytes(), 0u);
  EXPECT_EQ(client_->bytes_produced(), 100u);
  std::vector<uint8_t> got(100);
  ASSERT_EQ(RecvBytes(server_, got.data(), 50, MSG_PEEK), 50);
  EXPECT_EQ(server_->ReadableBytes(), 100u);
  ASSERT_EQ(RecvBytes(server_, got.data(), 30), 30);
  EXPECT_EQ(server_->ReadableBytes(), 70u);
  EXPECT_EQ(client_->UnconsumedBytes(), 70u);
  ASSERT_EQ(RecvBytes(server_, got.data() + 30, 100), 70);
  EXPECT_EQ(got, data);
  EXPECT_EQ(server_->ReadableBytes(), 0u);
  EXPECT_EQ(client_->UnconsumedBytes(), 0u);
  EXPECT_EQ(FillRing(client_), kSmallRing);
  EXPECT_EQ(client_->UnconsumedBytes(), kSmallRing);
  EXPECT_EQ(server_->ReadableBytes(), kSmallRing);
  EXPECT_EQ(client_->bytes_produced(), 100u + kSmallRing);
}

TEST_F(StreamTest, BlockedSenderWakesWhenThePeerReads) {
  const size_t len = kSmallRing + 1000;
  std::vector<uint8_t> data(len), got(len, 0);
  Pattern(9, 0, data.data(), len);
  auto sender = Start([&] { return SendBytes(client_, data.data(), len); });
  ASSERT_TRUE(sender->WaitUntilAsleep());
  EXPECT_FALSE(sender->WaitFor(milliseconds(0)));
  EXPECT_EQ(server_->ReadableBytes(), kSmallRing);
  ASSERT_EQ(RecvBytes(server_, got.data(), 600), 600);
  // 600 bytes of room are not enough for the rest: the sender fills them and sleeps again.
  ASSERT_TRUE(sender->WaitUntilAsleep());
  EXPECT_EQ(server_->ReadableBytes(), kSmallRing);
  ASSERT_EQ(RecvBytes(server_, got.data() + 600, len - 600, MSG_WAITALL), ssize_t(len - 600));
  ASSERT_TRUE(sender->WaitFor(seconds(5)));
  EXPECT_EQ(sender->result(), ssize_t(len));
  EXPECT_EQ(got, data);
}

TEST_F(StreamTest, RcvtimeoOnTheProxyTimesOutABlockingRecv) {
  timeval tv{0, 150 * 1000};
  ASSERT_EQ(setsockopt(pair_.client_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
  char buf[8];
  auto start = Clock::now();
  EXPECT_EQ(RecvBytes(client_, buf, sizeof(buf)), -EAGAIN);
  auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, milliseconds(140));
  EXPECT_LT(elapsed, seconds(3));
  // Data that is there is returned at once.
  ASSERT_EQ(SendString(server_, "now"), 3);
  EXPECT_EQ(RecvString(client_, 8), "now");
}

TEST_F(StreamTest, SndtimeoOnTheProxyTimesOutABlockingSend) {
  timeval tv{0, 150 * 1000};
  ASSERT_EQ(setsockopt(pair_.client_fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
  std::vector<uint8_t> data(kSmallRing + 100, 'z');
  // Like TCP: what fitted before the timeout is reported, then EAGAIN.
  EXPECT_EQ(SendBytes(client_, data.data(), data.size()), ssize_t(kSmallRing));
  auto start = Clock::now();
  EXPECT_EQ(SendBytes(client_, data.data(), 100), -EAGAIN);
  auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, milliseconds(140));
  EXPECT_LT(elapsed, seconds(3));
}

void NoopHandler(int) {}

TEST_F(StreamTest, SignalInterruptsABlockedRecv) {
  struct sigaction sa {
  }, old{};
  sa.sa_handler = NoopHandler;  // no SA_RESTART
  sigemptyset(&sa.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  auto reader = StartReader(client_);
  ASSERT_TRUE(reader->WaitUntilAsleep());
  ASSERT_EQ(pthread_kill(reader->handle(), SIGUSR1), 0);
  EXPECT_TRUE(reader->WaitFor(seconds(5)));
  EXPECT_EQ(reader->result(), -EINTR);
  reader.reset();
  sigaction(SIGUSR1, &old, nullptr);
}

// The header's contract: the per-side lock is never held while sleeping, so a non-blocking
// call is not held up by another thread that sleeps in a blocking one (as on TCP).
TEST_F(StreamTest, DontWaitRecvIsNotHeldUpByABlockedReader) {
  auto sleeper = Start([&] {
    char buf[1];
    return RecvBytes(client_, buf, sizeof(buf));
  });
  ASSERT_TRUE(sleeper->WaitUntilAsleep());
  auto prober = Start([&] {
    char buf[1];
    return RecvBytes(client_, buf, sizeof(buf), MSG_DONTWAIT);
  });
  EXPECT_TRUE(prober->WaitFor(seconds(2))) << "MSG_DONTWAIT recv blocked";
  ASSERT_EQ(SendString(server_, "w"), 1);  // releases the sleeper
  ASSERT_TRUE(sleeper->WaitFor(seconds(5)));
  ASSERT_TRUE(prober->WaitFor(seconds(5)));
  EXPECT_EQ(prober->result(), -EAGAIN);
  EXPECT_EQ(sleeper->result(), 1);
}

TEST_F(StreamTest, DontWaitSendIsNotHeldUpByABlockedSender) {
  FillRing(client_);
  auto sleeper = Start([&] { return SendString(client_, "s"); });
  ASSERT_TRUE(sleeper->WaitUntilAsleep());
  auto prober = Start([&] { return SendString(client_, "p", MSG_NOSIGNAL | MSG_DONTWAIT); });
  EXPECT_TRUE(prober->WaitFor(seconds(2))) << "MSG_DONTWAIT send blocked";
  std::vector<uint8_t> buf(kSmallRing + 2);
  EXPECT_GE(RecvBytes(server_, buf.data(), buf.size()), 1);  // releases the sleeper
  ASSERT_TRUE(sleeper->WaitFor(seconds(5)));
  ASSERT_TRUE(prober->WaitFor(seconds(5)));
  EXPECT_EQ(sleeper->result(), 1);
}

// Two threads asleep in Recv and one send with a message for each: both wake (as on TCP,
// where every sleeping reader wakes up on new data).
TEST_F(StreamTest, TwoBlockedReadersShareOneSend) {
  auto reader = [this] {
    char buf[5];
    ssize_t n = RecvBytes(client_, buf, sizeof(buf), MSG_WAITALL);
    return n == 5 && (std::string(buf, 5) == "AAAAA" || std::string(buf, 5) == "BBBBB") ? n : -1;
  };
  auto first = Start(reader);
  auto second = Start(reader);
  ASSERT_TRUE(first->WaitUntilAsleep());
  ASSERT_TRUE(second->WaitUntilAsleep());
  ASSERT_EQ(SendString(server_, "AAAAABBBBB"), 10);
  EXPECT_TRUE(first->WaitFor(seconds(2)));
  EXPECT_TRUE(second->WaitFor(seconds(2))) << "one reader slept on with a message waiting for it";
  if (!first->WaitFor(milliseconds(0)) || !second->WaitFor(milliseconds(0))) {
    client_->ShutdownRead();  // frees the sleeper
  }
  ASSERT_TRUE(first->WaitFor(seconds(5)));
  ASSERT_TRUE(second->WaitFor(seconds(5)));
  EXPECT_EQ(first->result(), 5);
  EXPECT_EQ(second->result(), 5);
}

// Two threads asleep in Recv; the first message wakes one of them, which then leaves; a later
// message must wake the other.
TEST_F(StreamTest, SecondBlockedReaderGetsALaterMessage) {
  auto reader = [this] {
    char buf[8];
    ssize_t n = RecvBytes(client_, buf, sizeof(buf));
    return n == 1 ? ssize_t(buf[0]) : -1;
  };
  auto first = Start(reader);
  auto second = Start(reader);
  ASSERT_TRUE(first->WaitUntilAsleep());
  ASSERT_TRUE(second->WaitUntilAsleep());
  ASSERT_EQ(SendString(server_, "a"), 1);
  const auto deadline = Clock::now() + seconds(5);
  while (!first->WaitFor(milliseconds(0)) && !second->WaitFor(milliseconds(5)) &&
         Clock::now() < deadline) {
  }
  Task* woken = first->WaitFor(milliseconds(0)) ? first.get() : second.get();
  Task* other = woken == first.get() ? second.get() : first.get();
  ASSERT_TRUE(woken->WaitFor(milliseconds(0))) << "nobody woke for the first message";
  EXPECT_EQ(woken->result(), 'a');
  EXPECT_FALSE(other->WaitFor(milliseconds(20)));
  ASSERT_EQ(SendString(server_, "b"), 1);
  EXPECT_TRUE(other->WaitFor(seconds(2))) << "the second reader slept through a later message";
  if (!other->WaitFor(milliseconds(0))) client_->ShutdownRead();  // frees it
  ASSERT_TRUE(other->WaitFor(seconds(5)));
  EXPECT_EQ(other->result(), 'b');
}

TEST_F(StreamTest, TwoBlockedSendersBothWake) {
  FillRing(client_);
  std::vector<uint8_t> a(100, 'a'), b(100, 'b');
  auto first = Start([&] { return SendBytes(client_, a.data(), a.size()); });
  auto second = Start([&] { return SendBytes(client_, b.data(), b.size()); });
  ASSERT_TRUE(first->WaitUntilAsleep());
  ASSERT_TRUE(second->WaitUntilAsleep());
  std::vector<uint8_t> buf(kSmallRing);
  ASSERT_EQ(RecvBytes(server_, buf.data(), buf.size(), MSG_WAITALL), ssize_t(kSmallRing));
  ASSERT_TRUE(first->WaitFor(seconds(5)));
  ASSERT_TRUE(second->WaitFor(seconds(5)));
  EXPECT_EQ(first->result(), 100);
  EXPECT_EQ(second->result(), 100);
  // Each send's bytes arrive; a send fits the free space in one piece, so they do not mix.
  ASSERT_EQ(RecvBytes(server_, buf.data(), 200, MSG_WAITALL), 200);
  std::string got(buf.begin(), buf.begin() + 200);
  EXPECT_TRUE(got == std::string(100, 'a') + std::string(100, 'b') ||
              got == std::string(100, 'b') + std::string(100, 'a'))
      << got;
}

// Like TCP, MSG_PEEK|MSG_WAITALL waits until the whole amount is there, and consumes nothing.
TEST_F(StreamTest, PeekWaitAllWaitsForTheWholeAmount) {
  char buf[10] = {};
  auto peeker = Start([&] { return RecvBytes(client_, buf, sizeof(buf), MSG_PEEK | MSG_WAITALL); });
  ASSERT_EQ(SendString(server_, "0123"), 4);
  EXPECT_FALSE(peeker->WaitFor(milliseconds(50))) << "returned with 4 of 10 bytes";
  ASSERT_EQ(SendString(server_, "456789"), 6);
  ASSERT_TRUE(peeker->WaitFor(seconds(5)));
  EXPECT_EQ(peeker->result(), 10);
  EXPECT_EQ(std::string(buf, 10), "0123456789");
  EXPECT_EQ(client_->ReadableBytes(), 10u);
  // At EOF it returns what there is.
  ASSERT_EQ(SendString(server_, "ab"), 2);
  server_->ShutdownWrite();
  char big[32];
  EXPECT_EQ(RecvBytes(client_, big, sizeof(big), MSG_PEEK | MSG_WAITALL), 12);
  EXPECT_EQ(RecvString(client_, 32), "0123456789ab");
}

// Two threads wait in MSG_PEEK|MSG_WAITALL for more than there is: both sleep until more
// comes, without handing wake-ups back and forth (the bytes there stay unconsumed).
TEST_F(StreamTest, TwoPeekersWaitingForMoreSleepQuietly) {
  auto peeker = [this] {
    char buf[10];
    return RecvBytes(client_, buf, sizeof(buf), MSG_PEEK | MSG_WAITALL);
  };
  auto first = Start(peeker);
  auto second = Start(peeker);
  ASSERT_TRUE(first->WaitUntilAsleep());
  ASSERT_TRUE(second->WaitUntilAsleep());
  ASSERT_EQ(SendString(server_, "0123"), 4);
  std::this_thread::sleep_for(milliseconds(20));
  timespec cpu0, cpu1;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu0);
  std::this_thread::sleep_for(milliseconds(300));
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu1);
  const double busy_ms =
      double(cpu1.tv_sec - cpu0.tv_sec) * 1e3 + double(cpu1.tv_nsec - cpu0.tv_nsec) / 1e6;
  EXPECT_LT(busy_ms, 100.0) << "the waiting peekers kept the CPU busy for " << busy_ms
                            << " ms of 300";
  EXPECT_FALSE(first->WaitFor(milliseconds(0)));
  EXPECT_FALSE(second->WaitFor(milliseconds(0)));
  ASSERT_EQ(SendString(server_, "456789"), 6);
  ASSERT_TRUE(first->WaitFor(seconds(5)));
  ASSERT_TRUE(second->WaitFor(seconds(5)));
  EXPECT_EQ(first->result(), 10);
  EXPECT_EQ(second->result(), 10);
  EXPECT_EQ(client_->ReadableBytes(), 10u);
}

// Several threads on each side at once: nothing lost, nothing duplicated, nobody stuck.
TEST_F(StreamTest, SeveralSendersAndReceiversOnOneDirection) {
  constexpr int kSenders = 3, kReceivers = 2, kRecords = 3000;
  constexpr size_t kRecord = 61;
  std::atomic<uint64_t> received_bytes{0}, received_sum{0};
  uint64_t want_sum = 0;
  for (int s = 0; s < kSenders; ++s) {
    for (int r = 0; r < kRecords; ++r) {
      for (size_t i = 0; i < kRecord; ++i) want_sum += uint8_t(s * 31 + r + i);
    }
  }
  std::vector<std::unique_ptr<Task>> senders, receivers;
  for (int s = 0; s < kSenders; ++s) {
    senders.push_back(Start([&, s] {
      uint8_t rec[kRecord];
      for (int r = 0; r < kRecords; ++r) {
        for (size_t i = 0; i < kRecord; ++i) rec[i] = uint8_t(s * 31 + r + i);
        if (SendBytes(client_, rec, kRecord) != ssize_t(kRecord)) return ssize_t(-1);
      }
      return ssize_t(0);
    }));
  }
  for (int r = 0; r < kReceivers; ++r) {
    receivers.push_back(Start([&, r] {
      std::vector<uint8_t> buf(97 + 500 * r);
      for (;;) {
        ssize_t n = RecvBytes(server_, buf.data(), buf.size());
        if (n <= 0) return n;
        uint64_t sum = 0;
        for (ssize_t i = 0; i < n; ++i) sum += buf[size_t(i)];
        received_sum += sum;
        received_bytes += uint64_t(n);
      }
    }));
  }
  AwaitAll(&pair_, senders);
  for (const auto& t : senders) EXPECT_EQ(t->result(), 0);
  client_->ShutdownWrite();
  AwaitAll(&pair_, receivers);
  for (const auto& t : receivers) EXPECT_EQ(t->result(), 0);
  EXPECT_EQ(received_bytes.load(), uint64_t(kSenders) * kRecords * kRecord);
  EXPECT_EQ(received_sum.load(), want_sum);
}

}  // namespace
}  // namespace slip
