// Tests for RearmList, the bookkeeping that lets a wait arm only the streams read since the
// last one (core/rearm_list.h), over real shm stream pairs and real epoll sets: what an
// event loop sees must be what it saw when every stream was armed before every wait.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/rearm_list.h"
#include "core/stream.h"
#include "tests/unit/stream_pair.h"

namespace slip {
namespace {

constexpr uint32_t kRing = 4096;

bool Readable(int fd) {
  pollfd p{fd, POLLIN, 0};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

ssize_t SendText(Stream* s, const std::string& text) {
  iovec iov{const_cast<char*>(text.data()), text.size()};
  return s->Send(&iov, 1, MSG_NOSIGNAL, /*nonblocking=*/true);
}

std::string RecvAll(Stream* s) {
  std::string out;
  char buf[8192];
  for (;;) {
    iovec iov{buf, sizeof(buf)};
    ssize_t n = s->Recv(&iov, 1, 0, /*nonblocking=*/true);
    if (n <= 0) return out;
    out.append(buf, size_t(n));
  }
}

// A byte of direction `seed` at stream offset `off`: a misplaced or repeated byte differs.
uint8_t PatternByte(uint64_t seed, uint64_t off) {
  uint64_t x = (off + seed * 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
  return uint8_t(x >> 56);
}

TEST(RearmListTest, AStreamReadEmptyIsArmedAgainBeforeTheNextSleep) {
  RearmList list;
  StreamPair pair;
  ASSERT_TRUE(MakeStreamPair(kRing, {}, &pair));
  pair.server->SetRearmList(&list);
  EXPECT_EQ(list.members(), 1u);
  EXPECT_EQ(list.PrepareChanged(), 1u);  // a new member is listed
  EXPECT_EQ(list.PrepareChanged(), 0u);  // and then stays armed

  ASSERT_EQ(SendText(pair.client.get(), "one"), 3);
  EXPECT_TRUE(Readable(pair.server_fd));
  EXPECT_EQ(list.PrepareChanged(), 0u);  // the token shows it; nothing to arm
  EXPECT_EQ(RecvAll(pair.server.get()), "one");
  EXPECT_FALSE(Readable(pair.server_fd));

  // The read took the token with no ask pending: the next publish would not show, so the
  // stream is listed, and arming it makes the next one show.
  EXPECT_EQ(list.PrepareChanged(), 1u);
  ASSERT_EQ(SendText(pair.client.get(), "two"), 3);
  EXPECT_TRUE(Readable(pair.server_fd));
  EXPECT_EQ(RecvAll(pair.server.get()), "two");
}

TEST(RearmListTest, BytesThatArriveUnarmedShowOnceArmed) {
  RearmList list;
  StreamPair pair;
  ASSERT_TRUE(MakeStreamPair(kRing, {}, &pair));
  pair.server->SetRearmList(&list);
  list.PrepareChanged();
  ASSERT_EQ(SendText(pair.client.get(), "a"), 1);
  EXPECT_EQ(RecvAll(pair.server.get()), "a");
  ASSERT_EQ(SendText(pair.client.get(), "b"), 1);  // published while unarmed: no token
  EXPECT_FALSE(Readable(pair.server_fd));
  EXPECT_EQ(list.PrepareChanged(), 1u);
  EXPECT_TRUE(Readable(pair.server_fd));
  EXPECT_EQ(RecvAll(pair.server.get()), "b");
}

// An ask shows only what is published after it. A blocking receive asks, then finds that
// bytes came meanwhile and does not sleep: its ask stays, with bytes left that no publish
// will come to show. A receive that leaves them so must list the stream (seen as a poll
// that slept through a full ring, threads_accept over fabric).
TEST(RearmListTest, BytesLeftBehindALateAskShowAtTheNextSleep) {
  RearmList list;
  StreamPair pair;
  ASSERT_TRUE(MakeStreamPair(kRing, {}, &pair));
  pair.server->SetRearmList(&list);
  ASSERT_EQ(list.PrepareChanged(), 1u);
  WakeState* wake = pair.server->channel()->RxWake();
  // The interleaving: the publish finds no ask, then the receiver makes its ask.
  wake->reader_waiting.store(kAskNone);
  ASSERT_EQ(SendText(pair.client.get(), "abcdefgh"), 8);
  wake->reader_waiting.store(kAskOnce);
  EXPECT_FALSE(Readable(pair.server_fd));

  char buf[4];
  iovec iov{buf, sizeof(buf)};
  ASSERT_EQ(pair.server->Recv(&iov, 1, 0, /*nonblocking=*/true), 4);
  EXPECT_EQ(std::string(buf, 4), "abcd");
  EXPECT_EQ(list.PrepareChanged(), 1u);  // listed by that receive, and armed now
  EXPECT_TRUE(Readable(pair.server_fd));
  EXPECT_EQ(RecvAll(pair.server.get()), "efgh");
}

TEST(RearmListTest, AWaitCostsTheStreamsThatWereReadNotTheIdleOnes) {
  RearmList list;
  std::vector<StreamPair> pairs(200);
  for (StreamPair& p : pairs) {
    ASSERT_TRUE(MakeStreamPair(kRing, {}, &p));
    p.server->SetRearmList(&list);
  }
  EXPECT_EQ(list.PrepareChanged(), pairs.size());
  for (int round = 0; round < 3; ++round) {
    for (int i : {7, 50, 199}) {
      ASSERT_EQ(SendText(pairs[i].client.get(), "ping"), 4);
      EXPECT_EQ(RecvAll(pairs[i].server.get()), "ping");
    }
    EXPECT_EQ(list.PrepareChanged(), 3u);
    EXPECT_EQ(list.PrepareChanged(), 0u);
  }
  pairs.resize(100);  // leaving: the destructors take them out
  EXPECT_EQ(list.members(), 100u);
  EXPECT_EQ(list.PrepareChanged(), 0u);
}

TEST(RearmListTest, EdgeTriggeredWatchersGetAnEdgeAtEveryArrival) {
  RearmList list;
  StreamPair pair;
  ASSERT_TRUE(MakeStreamPair(kRing, {}, &pair));
  pair.server->SetRearmList(&list);
  pair.server->SetEdgeTriggered(true);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(ep, 0);
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLET;
  ASSERT_EQ(epoll_ctl(ep, EPOLL_CTL_ADD, pair.server_fd, &ev), 0);
  list.PrepareChanged();
  epoll_event out{};
  EXPECT_EQ(epoll_wait(ep, &out, 1, 0), 0);
  for (const char* text : {"first", "second", "third"}) {
    // Nothing is read in between: as on TCP, each arrival is an edge of its own.
    ASSERT_GT(SendText(pair.client.get(), text), 0);
    EXPECT_EQ(epoll_wait(ep, &out, 1, 1000), 1) << text;
    EXPECT_EQ(epoll_wait(ep, &out, 1, 0), 0) << text;
    list.PrepareChanged();
  }
  EXPECT_EQ(RecvAll(pair.server.get()), "firstsecondthird");
  // Level-triggered again: one token per sleep, and the proxy stays readable while bytes
  // wait, which is all a level-triggered watcher needs.
  pair.server->SetEdgeTriggered(false);
  EXPECT_EQ(list.PrepareChanged(), 1u);
  ASSERT_EQ(SendText(pair.client.get(), "x"), 1);
  ASSERT_EQ(SendText(pair.client.get(), "y"), 1);
  EXPECT_TRUE(Readable(pair.server_fd));
  EXPECT_EQ(RecvAll(pair.server.get()), "xy");
  close(ep);
}

TEST(RearmListTest, StreamsArmedAlwaysAreArmedBeforeEveryWait) {
  RearmList list;
  StreamPair pair;
  ASSERT_TRUE(MakeStreamPair(kRing, {}, &pair));
  pair.server->SetRearmList(&list);
  list.ArmAlways(pair.server.get());
  EXPECT_EQ(list.PrepareChanged(), 1u);
  EXPECT_EQ(list.PrepareChanged(), 1u);
  pair.server->SetRearmList(nullptr);
  EXPECT_EQ(list.members(), 0u);
  EXPECT_EQ(list.PrepareChanged(), 0u);
}

// Event loops over one list, as the threads of a server: each waits in epoll on its own
// streams (level- or edge-triggered) after arming only what changed, reads what epoll
// reports (level: one piece, leaving the rest for the next round; edge: to EAGAIN), and
// checks every byte; writers send random sizes into small rings (so they often wait for
// room); a third thread makes and ends connections on the same list meanwhile. A wake-up
// lost by the bookkeeping shows as a loop that sleeps while its rings hold bytes.
class EventLoop {
 public:
  static constexpr int kStreams = 8;
  static constexpr uint64_t kBytes = 192 * 1024;  // per stream

  EventLoop(RearmList* list, bool edge, uint64_t seed) : list_(list), edge_(edge), seed_(seed) {}

  ::testing::AssertionResult Build() {
    ep_ = epoll_create1(EPOLL_CLOEXEC);
    if (ep_ < 0) return ::testing::AssertionFailure() << "epoll_create1";
    for (int i = 0; i < kStreams; ++i) {
      if (auto r = MakeStreamPair(kRing, {}, &pairs_[i]); !r) return r;
      pairs_[i].server->SetRearmList(list_);
      pairs_[i].server->SetEdgeTriggered(edge_);
      epoll_event ev{};
      ev.events = EPOLLIN | (edge_ ? uint32_t(EPOLLET) : 0u);
      ev.data.u32 = uint32_t(i);
      if (epoll_ctl(ep_, EPOLL_CTL_ADD, pairs_[i].server_fd, &ev) != 0)
        return ::testing::AssertionFailure() << "epoll_ctl";
    }
    return ::testing::AssertionSuccess();
  }
  ~EventLoop() {
    if (ep_ >= 0) close(ep_);
  }

  void Write(int i) {
    std::mt19937_64 rng(seed_ * 100 + uint64_t(i));
    std::vector<uint8_t> buf(3000);
    for (uint64_t off = 0; off < kBytes && !failed_.load();) {
      size_t n = std::min<uint64_t>(1 + rng() % buf.size(), kBytes - off);
      for (size_t k = 0; k < n; ++k) buf[k] = PatternByte(seed_ + uint64_t(i), off + k);
      iovec iov{buf.data(), n};
      ssize_t sent = pairs_[i].client->Send(&iov, 1, MSG_NOSIGNAL, /*nonblocking=*/false);
      if (sent <= 0) return Fail("send failed: " + std::to_string(sent));
      off += uint64_t(sent);
    }
  }

  void Loop() {
    uint64_t total = 0;
    epoll_event events[kStreams];
    uint8_t buf[1500];
    while (total < kBytes * kStreams && !failed_.load()) {
      list_->PrepareChanged();
      int n = epoll_wait(ep_, events, kStreams, 5000);
      if (n < 0) return Fail("epoll_wait failed");
      if (n == 0) {
        for (int i = 0; i < kStreams; ++i) {
          if (pairs_[i].server->ReadableBytes() != 0)
            return Fail("lost wake-up: stream " + std::to_string(i) + " holds bytes");
        }
        return Fail("no progress for 5 s");
      }
      for (int e = 0; e < n; ++e) {
        const int i = int(events[e].data.u32);
        do {
          iovec iov{buf, sizeof(buf)};
          ssize_t got = pairs_[i].server->Recv(&iov, 1, 0, /*nonblocking=*/true);
          if (got == -EAGAIN) break;
          if (got <= 0) return Fail("recv: " + std::to_string(got));
          for (ssize_t k = 0; k < got; ++k) {
            if (buf[k] != PatternByte(seed_ + uint64_t(i), received_[i] + uint64_t(k)))
              return Fail("wrong byte at offset " + std::to_string(received_[i] + uint64_t(k)));
          }
          received_[i] += uint64_t(got);
          total += uint64_t(got);
        } while (edge_);
      }
    }
  }

  void Unstick() {
    for (StreamPair& p : pairs_) {
      p.client->MarkPeerGone();
      p.server->MarkPeerGone();
    }
  }
  bool done() const {
    for (uint64_t r : received_) {
      if (r != kBytes) return false;
    }
    return true;
  }
  std::string error() const { return error_; }

 private:
  void Fail(const std::string& why) {
    if (!failed_.exchange(true)) error_ = why;
    Unstick();
  }

  RearmList* list_;
  const bool edge_;
  const uint64_t seed_;
  int ep_ = -1;
  StreamPair pairs_[kStreams];
  uint64_t received_[kStreams] = {};
  std::atomic<bool> failed_{false};
  std::string error_;
};

TEST(RearmListTest, EventLoopsNeverSleepOnBytesWhileStreamsComeAndGo) {
  RearmList list;
  EventLoop level(&list, /*edge=*/false, 1);
  EventLoop edge(&list, /*edge=*/true, 2);
  ASSERT_TRUE(level.Build());
  ASSERT_TRUE(edge.Build());
  std::atomic<bool> stop{false};
  std::string churn_error;
  std::thread churn([&] {
    // Connections made, used and ended on the same list while the loops run.
    while (!stop.load()) {
      StreamPair p;
      if (!MakeStreamPair(kRing, {}, &p)) {
        churn_error = "MakeStreamPair failed";
        return;
      }
      p.server->SetRearmList(&list);
      if (SendText(p.client.get(), "churn") != 5 || RecvAll(p.server.get()) != "churn") {
        churn_error = "churn connection lost its bytes";
        return;
      }
    }
  });
  std::vector<std::thread> threads;
  for (EventLoop* loop : {&level, &edge}) {
    threads.emplace_back([loop] { loop->Loop(); });
    for (int i = 0; i < EventLoop::kStreams; ++i)
      threads.emplace_back([loop, i] { loop->Write(i); });
  }
  for (std::thread& t : threads) t.join();
  stop = true;
  churn.join();
  EXPECT_EQ(level.error(), "");
  EXPECT_EQ(edge.error(), "");
  EXPECT_TRUE(level.done());
  EXPECT_TRUE(edge.done());
  EXPECT_EQ(churn_error, "");
  EXPECT_EQ(list.members(), size_t(2 * EventLoop::kStreams));
}

}  // namespace
}  // namespace slip
