// Tests for AnchorFailover, core's continue-on-anchor: two ends over a real kernel TCP
// connection, each with the rings and counts a transport would have left at the moment its
// path failed (seeded random: bytes in flight, credited, consumed, in both directions),
// run through the FAILOVER exchange and on to the end of both streams. Every byte of both
// streams is checked, with writers and readers running across the switch and a third
// thread driving the anchor's readiness as the control thread does.
#include "core/failover.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
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

// One end: the transport's rings and counters as a channel keeps them, and the
// AnchorFailover under test.
class End final : public AnchorFailover::Ends {
 public:
  End(uint32_t ring, int fd) : rx(ring), tx(ring), size(ring), failover("test", this, ring) {
    failover.SetAnchor(fd);
    failover.SetRings(rx.data(), tx.data());
  }

  void WakeReaderNow() const noexcept override { reader_wakes.fetch_add(1); }
  void WakeWriterNow() const noexcept override { writer_wakes.fetch_add(1); }
  bool MayDeliver() const noexcept override { return may_deliver.load(); }

  // What the transport had done when it failed: `published` bytes of `out` went into the
  // send ring, the peer credited `credited` of them; `received` bytes of `in` arrived in
  // the receive ring, of which the application consumed `consumed`.
  void Stand(const std::vector<uint8_t>& out, uint64_t published, uint64_t credited,
             const std::vector<uint8_t>& in, uint64_t received, uint64_t consumed) {
    for (uint64_t p = credited; p < published; ++p) tx[p % size] = out[p];
    for (uint64_t p = consumed; p < received; ++p) rx[p % size] = in[p];
    failover.Publish(published);
    failover.SetConsumed(consumed);
    this->credited = credited;
    this->received = received;
    delivered.assign(in.begin(), in.begin() + long(consumed));
  }

  // The application's writer, as Stream drives a channel: space from the transport's
  // credit until TCP carries the stream, from what the kernel took after. Ends with FIN.
  void WriteAll(const std::vector<uint8_t>& out, uint32_t seed) {
    std::mt19937 rng(seed);
    uint64_t pub = failover.published();
    while (pub < out.size()) {
      const bool tcp = failover.on_tcp();
      const uint64_t freed = tcp ? failover.Push() : credited;
      const uint64_t space = size - (pub - freed);
      if (space == 0) {
        if (tcp)
          WaitFor(failover.anchor(), POLLOUT);
        else
          std::this_thread::yield();
        continue;
      }
      const uint64_t n = std::min<uint64_t>({space, out.size() - pub, 1 + rng() % size});
      for (uint64_t i = 0; i < n; ++i) tx[(pub + i) % size] = out[pub + i];
      pub += n;
      failover.Publish(pub);
    }
    failover.FinishTx();
    while (!failover.on_tcp()) std::this_thread::yield();
    EXPECT_TRUE(failover.FinishOnClose(10000));
  }

  // The application's reader: what the transport received until TCP carries the stream,
  // then what the anchor brings, to EOF.
  void ReadAll(uint32_t seed) {
    std::mt19937 rng(seed);
    for (;;) {
      const uint64_t from = failover.consumed();
      const bool tcp = failover.on_tcp();
      const uint64_t produced = tcp ? failover.Pull() : received;
      if (produced == from) {
        if (tcp && (failover.eof() || failover.error())) return;
        if (tcp)
          WaitFor(failover.anchor(), POLLIN);
        else
          std::this_thread::yield();
        continue;
      }
      ASSERT_LE(produced - from, size);
      const uint64_t n = std::min<uint64_t>(produced - from, 1 + rng() % size);
      for (uint64_t i = 0; i < n; ++i) delivered.push_back(rx[(from + i) % size]);
      failover.SetConsumed(from + n);
    }
  }

  std::vector<uint8_t> rx, tx;
  uint32_t size;
  AnchorFailover failover;
  uint64_t credited = 0;
  uint64_t received = 0;
  std::vector<uint8_t> delivered;
  mutable std::atomic<int> reader_wakes{0};
  mutable std::atomic<int> writer_wakes{0};
  std::atomic<bool> may_deliver{true};
};

// Where one direction stood when the transport failed: the sender published `published`,
// the receiver got `received` of it and consumed `consumed`, and credited `credited`.
struct Direction {
  uint64_t published, credited, received, consumed;
};

Direction RandomDirection(std::mt19937* rng, uint32_t ring, size_t total) {
  Direction d;
  d.published = (*rng)() % std::min<uint64_t>(total, 3 * uint64_t(ring));
  d.credited = d.published - (*rng)() % (std::min<uint64_t>(d.published, ring) + 1);
  d.received = d.credited + (*rng)() % (d.published - d.credited + 1);  // lost in flight: the rest
  d.consumed = d.credited + (*rng)() % (d.received - d.credited + 1);   // credit <= consumed
  return d;
}

std::array<int, 2> ConnectedPair() {
  std::array<int, 2> fds{-1, -1};
  TcpPair(fds.data());
  return fds;
}

// Two ends over one TCP connection, standing where a transport left them: a random point
// of each direction (RandomDirection).
struct Pair {
  Pair(uint32_t ring, const std::vector<uint8_t>& a_data, const std::vector<uint8_t>& b_data,
       std::mt19937* rng)
      : ab(RandomDirection(rng, ring, a_data.size())),
        ba(RandomDirection(rng, ring, b_data.size())),
        fds(ConnectedPair()),
        a(ring, fds[0]),
        b(ring, fds[1]) {
    a.Stand(a_data, ab.published, ab.credited, b_data, ba.received, ba.consumed);
    b.Stand(b_data, ba.published, ba.credited, a_data, ab.received, ab.consumed);
  }
  ~Pair() {
    close(fds[0]);
    close(fds[1]);
  }
  const Direction ab, ba;
  const std::array<int, 2> fds;
  End a, b;
};

wire::Failover Receive(int fd) {
  wire::Failover got{};
  EXPECT_TRUE(ReceiveFailover(fd, 5000, &got));
  return got;
}

// A fails, B answers; both streams continue on TCP from where the ends stood, every byte
// once and in order, whatever was in flight, credited or unread at the moment.
TEST(AnchorFailover, ContinuesBothStreamsFromWhereBothEndsStood) {
  for (uint32_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    const uint32_t ring = seed % 2 ? 4096 : 65536;
    const auto a_data = RandomBytes(200000 + rng() % 300000, seed * 2);
    const auto b_data = RandomBytes(rng() % 300000 + 1, seed * 2 + 1);
    Pair pair(ring, a_data, b_data, &rng);
    const Direction &ab = pair.ab, &ba = pair.ba;
    const int* fds = pair.fds.data();
    End &a = pair.a, &b = pair.b;

    // The applications keep going across the switch; the control thread drives the anchor.
    std::atomic<bool> stop{false};
    std::thread a_write([&] { a.WriteAll(a_data, seed + 100); });
    std::thread b_write([&] { b.WriteAll(b_data, seed + 200); });
    std::thread a_read([&] { a.ReadAll(seed + 300); });
    std::thread b_read([&] { b.ReadAll(seed + 400); });
    std::thread control([&] {
      while (!stop.load()) {
        a.failover.OnAnchorReady(EPOLLIN | EPOLLOUT);
        b.failover.OnAnchorReady(EPOLLIN | EPOLLOUT);
        std::this_thread::yield();
      }
    });

    {
      std::lock_guard<std::mutex> lock(a.failover.lock());
      a.failover.Begin();
      EXPECT_EQ(a.failover.carriage(), Carriage::kFailing);
      ASSERT_TRUE(a.failover.SendOurs(a.received, wire::FailoverCause::kTransportError));
    }
    const wire::Failover from_a = Receive(fds[1]);
    EXPECT_EQ(from_a.received, ba.received);
    {
      std::lock_guard<std::mutex> lock(b.failover.lock());
      b.failover.Begin();
      EXPECT_EQ(b.failover.OnPeerFailover(from_a, b.received, b.credited),
                AnchorFailover::Outcome::kContinued);
    }
    const wire::Failover from_b = Receive(fds[0]);
    EXPECT_EQ(from_b.received, ab.received);
    EXPECT_EQ(from_b.cause, wire::FailoverCause::kPeerRequest);
    {
      std::lock_guard<std::mutex> lock(a.failover.lock());
      // (Its own count is what its FAILOVER said: the argument is not looked at.)
      EXPECT_EQ(a.failover.OnPeerFailover(from_b, ~0ull, a.credited),
                AnchorFailover::Outcome::kContinued);
    }
    EXPECT_TRUE(a.failover.on_tcp());
    EXPECT_TRUE(b.failover.on_tcp());

    a_write.join();
    b_write.join();
    a_read.join();
    b_read.join();
    stop = true;
    control.join();
    EXPECT_TRUE(b.delivered == a_data)
        << "a -> b: " << b.delivered.size() << " of " << a_data.size();
    EXPECT_TRUE(a.delivered == b_data)
        << "b -> a: " << a.delivered.size() << " of " << b_data.size();
    EXPECT_GT(a.reader_wakes.load(), 0);
    EXPECT_GT(b.writer_wakes.load(), 0);
  }
}

// A FAILOVER whose counts contradict this end's is refused, and nothing is answered: the
// peer cannot have received less than it credited or more than was published, nor have
// sent less than this end received.
TEST(AnchorFailover, RefusesCountsThatDoNotFit) {
  struct Case {
    const char* what;
    wire::Failover peer;
    AnchorFailover::Outcome outcome;
  };
  // This end: published 9000, the peer credited 5000; received 7000.
  const Case cases[] = {
      {"received less than it credited",
       {.received = 4999, .sent = 7000},
       AnchorFailover::Outcome::kMisfit},
      {"received more than was published",
       {.received = 9001, .sent = 7000},
       AnchorFailover::Outcome::kMisfit},
      {"sent less than this end received",
       {.received = 6000, .sent = 6999},
       AnchorFailover::Outcome::kMisfit},
      {"the edges", {.received = 5000, .sent = 7000}, AnchorFailover::Outcome::kContinued},
      {"the other edges", {.received = 9000, .sent = 7000}, AnchorFailover::Outcome::kContinued},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    int fds[2];
    TcpPair(fds);
    End a(8192, fds[0]);
    const auto data = RandomBytes(9000, 3);
    a.Stand(data, 9000, 5000, data, 7000, 6000);
    {
      std::lock_guard<std::mutex> lock(a.failover.lock());
      a.failover.Begin();
      EXPECT_EQ(a.failover.OnPeerFailover(c.peer, a.received, a.credited), c.outcome);
    }
    const bool fits = c.outcome == AnchorFailover::Outcome::kContinued;
    EXPECT_EQ(a.failover.on_tcp(), fits);
    if (!fits) {
      uint8_t byte;
      EXPECT_EQ(recv(fds[1], &byte, 1, MSG_DONTWAIT), -1);  // no answer went out
      EXPECT_EQ(errno, EAGAIN);
    } else {
      EXPECT_EQ(Receive(fds[1]).received, 7000u);  // the answer: what this end received
    }
    close(fds[0]);
    close(fds[1]);
  }
}

// A hand-back (exec): the leaving end tells the peer what its application read, resends
// what the peer had not received, and leaves the socket to the new program, which reads
// and writes it as plain TCP while the peer carries on through its AnchorFailover.
TEST(AnchorFailover, HandsBackToANewProgramOnPlainTcp) {
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    SCOPED_TRACE(seed);
    std::mt19937 rng(seed);
    const uint32_t ring = 8192;
    const auto a_old = RandomBytes(40000, seed * 3);
    const auto b_data = RandomBytes(60000, seed * 3 + 1);
    Pair pair(ring, a_old, b_data, &rng);
    const Direction &ab = pair.ab, &ba = pair.ba;
    const int* fds = pair.fds.data();
    End &a = pair.a, &b = pair.b;
    const bool finished = seed % 2;
    if (finished) a.failover.FinishTx();

    bool handed = false;
    std::thread leaving([&] {
      std::lock_guard<std::mutex> lock(a.failover.lock());
      handed = a.failover.HandBack(ba.consumed, a.credited, 5000);
    });
    const wire::Failover from_a = Receive(fds[1]);
    EXPECT_EQ(from_a.cause, wire::FailoverCause::kHandBack);
    EXPECT_EQ(from_a.received, ba.consumed);
    {
      std::lock_guard<std::mutex> lock(b.failover.lock());
      b.failover.Begin();
      EXPECT_EQ(b.failover.OnPeerFailover(from_a, b.received, b.credited),
                AnchorFailover::Outcome::kContinued);
    }
    leaving.join();
    ASSERT_TRUE(handed);

    // The new program: plain reads and writes on the socket.
    const auto a_new = finished ? std::vector<uint8_t>{} : RandomBytes(30000, seed * 3 + 2);
    std::thread new_program([&] {
      size_t sent = 0;
      while (sent < a_new.size()) {
        ssize_t n = send(fds[0], a_new.data() + sent, a_new.size() - sent, MSG_NOSIGNAL);
        if (n > 0)
          sent += size_t(n);
        else
          WaitFor(fds[0], POLLOUT);
      }
      if (!finished) shutdown(fds[0], SHUT_WR);
      std::vector<uint8_t> got;
      uint8_t buf[4096];
      for (;;) {
        ssize_t n = recv(fds[0], buf, sizeof(buf), 0);
        if (n > 0)
          got.insert(got.end(), buf, buf + n);
        else if (n == 0)
          break;
        else
          WaitFor(fds[0], POLLIN);
      }
      const std::vector<uint8_t> want(b_data.begin() + long(ba.consumed), b_data.end());
      EXPECT_TRUE(got == want) << got.size() << " of " << want.size();
    });
    std::thread b_write([&] { b.WriteAll(b_data, seed + 10); });
    b.ReadAll(seed + 20);
    b_write.join();
    new_program.join();
    std::vector<uint8_t> want(a_old.begin(), a_old.begin() + long(ab.published));
    want.insert(want.end(), a_new.begin(), a_new.end());
    EXPECT_TRUE(b.delivered == want) << b.delivered.size() << " of " << want.size();
  }
}

// A server connection settled as plain: held (nothing can be published, nothing read),
// then on TCP from byte 0; while the first bytes are not known to be the application's
// (gated), the anchor's bytes stay where they are.
TEST(AnchorFailover, SettlesPlainFromByteZeroBehindTheGate) {
  int fds[2];
  TcpPair(fds);
  End server(4096, fds[1]);
  server.failover.Hold();
  EXPECT_TRUE(server.failover.held());
  EXPECT_EQ(server.failover.Publish(0), Carriage::kHeld);
  EXPECT_EQ(server.failover.FinishTx(), Carriage::kHeld);  // (settling finishes it)
  ASSERT_EQ(send(fds[0], "hello", 5, 0), 5);
  server.may_deliver = false;
  {
    std::lock_guard<std::mutex> lock(server.failover.lock());
    server.failover.EnterTcp(0, 0);
  }
  // Writers look again (credit may have moved); readers are woken by bytes they may have,
  // and behind the gate there are none: a wake-up now would show the application a
  // readable socket with nothing to read.
  EXPECT_GT(server.writer_wakes.load(), 0);
  EXPECT_EQ(server.reader_wakes.load(), 0);
  WaitFor(fds[1], POLLIN);
  EXPECT_EQ(server.failover.Pull(), 0u);
  uint8_t peek[5];
  EXPECT_EQ(recv(fds[1], peek, 5, MSG_PEEK | MSG_DONTWAIT), 5);  // still there
  server.may_deliver = true;
  server.failover.OnAnchorReady(EPOLLIN);  // the control thread's next look
  EXPECT_GT(server.reader_wakes.load(), 0);
  EXPECT_EQ(server.failover.Pull(), 5u);
  EXPECT_EQ(memcmp(server.rx.data(), "hello", 5), 0);
  // It had finished sending while held: its FIN went once on TCP.
  uint8_t byte;
  for (int i = 0; i < 100 && recv(fds[0], &byte, 1, MSG_DONTWAIT) != 0; ++i)
    WaitFor(fds[0], POLLIN);
  EXPECT_EQ(recv(fds[0], &byte, 1, MSG_DONTWAIT), 0);
  close(fds[0]);
  close(fds[1]);
}

}  // namespace
}  // namespace slip
