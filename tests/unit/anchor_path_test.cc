// Tests for AnchorPath: a stream carried over a real kernel socket after failover, with the
// rings and cursors the channel keeps. Content is checked byte for byte, over randomized
// write and read sizes, with a third thread calling Pull and Push with stale cursors the way
// the control thread does.
#include "core/anchor_path.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "tests/unit/tcp_pair.h"

namespace slip {
namespace {

using testing::RandomBytes;
using testing::TcpPair;
using testing::WaitFor;

// One end: its rings, cursors and path, as a verbs Conn keeps them after failover.
struct End {
  explicit End(uint32_t ring) : rx(ring), tx(ring), size(ring) {}
  std::vector<uint8_t> rx, tx;
  uint32_t size;
  AnchorPath path;
  std::atomic<uint64_t> consumed{0};
  std::atomic<uint64_t> published{0};
  int fd = -1;

  void Start(int socket_fd, uint64_t rx_from, uint64_t tx_from) {
    fd = socket_fd;
    consumed = rx_from;
    published = tx_from;
    path.Start(fd, rx.data(), tx.data(), size, rx_from, tx_from);
  }

  // Writes `data` into the stream, waiting for ring space; Finish at the end.
  void SendAll(const std::vector<uint8_t>& data, uint32_t seed) {
    std::mt19937 rng(seed);
    size_t done = 0;
    while (done < data.size()) {
      uint64_t pub = published.load();
      uint64_t space = size - (pub - path.Push(pub));
      if (space == 0) {
        WaitFor(fd, POLLOUT);
        continue;
      }
      size_t n = std::min<size_t>({space, data.size() - done, 1 + rng() % (3 * size / 2)});
      for (size_t i = 0; i < n; ++i) tx[(pub + i) % size] = data[done + i];
      published.store(pub + n);
      path.Push(pub + n);
      done += n;
    }
    path.Finish(published.load());
    ASSERT_TRUE(path.PushAll(published.load(), 10000));
  }

  // Reads until EOF.
  std::vector<uint8_t> ReceiveAll(uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<uint8_t> out;
    for (;;) {
      uint64_t from = consumed.load();
      uint64_t produced = path.Pull(from);
      if (produced == from) {
        if (path.eof() || path.error()) return out;
        WaitFor(fd, POLLIN);
        continue;
      }
      uint64_t n = std::min<uint64_t>(produced - from, 1 + rng() % size);
      for (uint64_t i = 0; i < n; ++i) out.push_back(rx[(from + i) % size]);
      consumed.store(from + n);
    }
  }
};

TEST(AnchorPath, CarriesBothDirectionsIntact) {
  for (uint32_t ring : {4096u, 65536u}) {
    SCOPED_TRACE(ring);
    int fds[2];
    TcpPair(fds);
    End a(ring), b(ring);
    a.Start(fds[0], 0, 0);
    b.Start(fds[1], 0, 0);
    const auto a_data = RandomBytes(3 << 20, 1), b_data = RandomBytes(2 << 20, 2);
    std::vector<uint8_t> at_a, at_b;
    std::atomic<bool> stop{false};
    // The control thread's calls: cursors read before the lock, maybe overtaken since.
    std::thread control([&] {
      while (!stop.load()) {
        uint64_t ca = a.consumed.load(), cb = b.consumed.load();
        uint64_t pa = a.published.load(), pb = b.published.load();
        std::this_thread::yield();
        a.path.Pull(ca);
        b.path.Pull(cb);
        a.path.Push(pa);
        b.path.Push(pb);
      }
    });
    std::thread a_send([&] { a.SendAll(a_data, 3); });
    std::thread b_send([&] { b.SendAll(b_data, 4); });
    std::thread a_recv([&] { at_a = a.ReceiveAll(5); });
    at_b = b.ReceiveAll(6);
    a_recv.join();
    a_send.join();
    b_send.join();
    stop = true;
    control.join();
    EXPECT_TRUE(at_b == a_data) << "a -> b: " << at_b.size() << " of " << a_data.size();
    EXPECT_TRUE(at_a == b_data) << "b -> a: " << at_a.size() << " of " << b_data.size();
    EXPECT_EQ(a.path.error(), 0);
    EXPECT_EQ(b.path.error(), 0);
    close(fds[0]);
    close(fds[1]);
  }
}

// After failover each direction resumes mid-stream: the sender resends from what the peer
// received (still in its ring), the receiver continues after what it had.
TEST(AnchorPath, ResumesAtTheAgreedOffsets) {
  constexpr uint32_t kRing = 8192;
  constexpr uint64_t kReceived = 5 * kRing + 1234;  // what the receiver had over RDMA
  constexpr uint64_t kPublished = kReceived + 3000;
  int fds[2];
  TcpPair(fds);
  End sender(kRing), receiver(kRing);
  const auto stream = RandomBytes(kPublished + 50000, 7);
  for (uint64_t p = kPublished - kRing; p < kPublished; ++p) sender.tx[p % kRing] = stream[p];
  for (uint64_t p = kReceived - 100; p < kReceived; ++p) receiver.rx[p % kRing] = stream[p];
  sender.Start(fds[0], 0, kReceived);
  sender.published = kPublished;
  receiver.Start(fds[1], kReceived, 0);
  receiver.consumed = kReceived - 100;  // received over RDMA, not yet read
  std::thread send([&] {
    std::vector<uint8_t> rest(stream.begin() + kPublished, stream.end());
    sender.SendAll(rest, 8);
  });
  std::vector<uint8_t> got = receiver.ReceiveAll(9);
  send.join();
  std::vector<uint8_t> want(stream.begin() + (kReceived - 100), stream.end());
  EXPECT_TRUE(got == want) << got.size() << " of " << want.size();
  close(fds[0]);
  close(fds[1]);
}

// On TCP, the urgent byte of a send(MSG_OOB) goes to the kernel as its urgent data: the
// plain peer reads the bytes around it in order, without it, and gets it from recv(MSG_OOB)
// at the mark, however the ring wraps and however much the kernel takes per send.
TEST(AnchorPath, SendsTheMarkedByteAsTcpUrgentData) {
  constexpr uint32_t kRing = 4096;
  int fds[2];
  TcpPair(fds);
  End sender(kRing);
  sender.Start(fds[0], 0, 0);
  const auto stream = RandomBytes(3 * kRing, 21);
  const uint64_t urgent = kRing + 1000;  // past a wrap
  // The mark comes before its byte is published, as a send(MSG_OOB) sets it.
  sender.path.MarkUrgent(urgent);
  std::thread send([&] {
    uint64_t pub = 0;
    while (pub < stream.size()) {
      const uint64_t space = kRing - (pub - sender.path.Push(pub));
      if (space == 0) {
        WaitFor(fds[0], POLLOUT);
        continue;
      }
      // Pieces that straddle the urgent byte: the push must split them there.
      const uint64_t n = std::min<uint64_t>({space, stream.size() - pub, 700});
      for (uint64_t i = 0; i < n; ++i) sender.tx[(pub + i) % kRing] = stream[pub + i];
      pub += n;
      sender.path.Push(pub);
    }
    sender.path.Finish(pub);
    ASSERT_TRUE(sender.path.PushAll(pub, 10000));
  });
  // A plain receiver: sockatmark before each read, the urgent byte by recv(MSG_OOB).
  std::vector<uint8_t> got;
  bool oob_read = false;
  for (;;) {
    WaitFor(fds[1], POLLIN);
    // (Reads stop at the mark, and one starting there skips the byte: look first.)
    int at_mark = 0;
    ASSERT_EQ(ioctl(fds[1], SIOCATMARK, &at_mark), 0);
    if (at_mark && !oob_read) {
      uint8_t byte = 0;
      ASSERT_EQ(recv(fds[1], &byte, 1, MSG_OOB), 1);
      EXPECT_EQ(byte, stream[urgent]);
      EXPECT_EQ(got.size(), urgent) << "the mark is not where the urgent byte was";
      oob_read = true;
    }
    uint8_t buf[1500];
    const ssize_t n = recv(fds[1], buf, sizeof(buf), 0);
    ASSERT_GE(n, 0) << strerror(errno);
    if (n == 0) break;
    got.insert(got.end(), buf, buf + n);
  }
  send.join();
  std::vector<uint8_t> want;
  for (uint64_t p = 0; p < stream.size(); ++p)
    if (p != urgent) want.push_back(stream[p]);
  EXPECT_TRUE(oob_read);
  EXPECT_TRUE(got == want) << got.size() << " of " << want.size();
  EXPECT_EQ(sender.path.error(), 0);
  close(fds[0]);
  close(fds[1]);
}

TEST(AnchorPath, PushAllGivesUpWhenThePeerDoesNotRead) {
  int fds[2];
  TcpPair(fds);
  int small = 4096;
  setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
  setsockopt(fds[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
  End a(1u << 20);
  a.Start(fds[0], 0, 0);
  EXPECT_FALSE(a.path.PushAll(1u << 20, 100));
  EXPECT_LT(a.path.sent(), 1u << 20);
  EXPECT_GT(a.path.sent(), 0u);
  close(fds[0]);
  close(fds[1]);
}

TEST(AnchorPath, ReportsResetAndClosedPeer) {
  int fds[2];
  TcpPair(fds);
  End a(4096);
  a.Start(fds[0], 0, 0);
  // The peer resets the connection (SO_LINGER {1, 0}): the next read fails.
  linger lg{1, 0};
  ASSERT_EQ(setsockopt(fds[1], SOL_SOCKET, SO_LINGER, &lg, sizeof(lg)), 0);
  close(fds[1]);
  for (int i = 0; i < 100 && a.path.error() == 0; ++i) {
    WaitFor(fds[0], POLLIN);
    a.path.Pull(0);
  }
  EXPECT_EQ(a.path.error(), ECONNRESET);
  EXPECT_FALSE(a.path.eof());
  close(fds[0]);

  // A peer that closed (no reset): EOF for reads; writes fail once it is gone.
  TcpPair(fds);
  End b(4096);
  b.Start(fds[0], 0, 0);
  ASSERT_EQ(shutdown(fds[1], SHUT_WR), 0);
  for (int i = 0; i < 100 && !b.path.eof(); ++i) {
    WaitFor(fds[0], POLLIN);
    b.path.Pull(0);
  }
  EXPECT_TRUE(b.path.eof());
  EXPECT_EQ(b.path.error(), 0);
  close(fds[1]);
  for (int i = 0; i < 100 && !b.path.peer_closed() && b.path.error() == 0; ++i) {
    b.tx[0] = 1;
    b.path.Push(b.path.sent() + 1);
    WaitFor(fds[0], POLLOUT);
  }
  EXPECT_TRUE(b.path.peer_closed() || b.path.error() == ECONNRESET);
  close(fds[0]);
}

// The FAILOVER exchange: a whole message is taken and nothing after it; one split across
// segments waits for its tail; anything else (other bytes, EOF, silence) is refused with
// the bytes left where they were.
TEST(FailoverExchange, TakesOneWholeMessageAndNothingElse) {
  int fds[2];
  TcpPair(fds);
  const wire::Failover sent{
      .received = 0x1234567890ull, .sent = 77, .cause = wire::FailoverCause::kHandBack};
  ASSERT_TRUE(SendFailover(fds[0], sent, 1000));
  const uint8_t after[3] = {'a', 'b', 'c'};
  ASSERT_EQ(send(fds[0], after, sizeof(after), 0), ssize_t(sizeof(after)));
  wire::Failover got;
  ASSERT_TRUE(ReceiveFailover(fds[1], 1000, &got));
  EXPECT_EQ(got.received, sent.received);
  EXPECT_EQ(got.sent, sent.sent);
  EXPECT_EQ(got.cause, sent.cause);
  // The stream's bytes behind it stay for the application, and they are no FAILOVER.
  EXPECT_FALSE(ReceiveFailover(fds[1], 50, &got));
  uint8_t rest[8];
  ASSERT_EQ(recv(fds[1], rest, sizeof(rest), 0), ssize_t(sizeof(after)));
  EXPECT_EQ(memcmp(rest, after, sizeof(after)), 0);

  // Split in two segments: the reader waits for the tail.
  wire::Message msg;
  msg.type = wire::Type::kFailover;
  msg.failover = sent;
  uint8_t buf[wire::kMaxMessageSize];
  const size_t len = wire::EncodeMessage(msg, buf, sizeof(buf));
  ASSERT_EQ(send(fds[0], buf, 10, 0), 10);
  std::thread tail([&] {
    usleep(30000);
    send(fds[0], buf + 10, len - 10, 0);
  });
  EXPECT_TRUE(ReceiveFailover(fds[1], 2000, &got));
  tail.join();
  EXPECT_EQ(got.received, sent.received);

  // Silence: refused once the time is up.
  EXPECT_FALSE(ReceiveFailover(fds[1], 30, &got));
  // EOF: refused.
  shutdown(fds[0], SHUT_WR);
  EXPECT_FALSE(ReceiveFailover(fds[1], 1000, &got));
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
}  // namespace slip
