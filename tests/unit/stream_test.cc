// Tests for the stream engine over the real shm channel and readiness proxy, in one process:
// the two Stream objects are the two ends of one connection, built the way the shim builds
// them (the client's offer, the server's registration), with no mocks. What the application
// would see on its descriptor is proxy A, so readiness is checked with poll() on it.
//
// Every thread a test starts runs as a Task: if it has not returned when the test is done
// with it (or after the watchdog's 20 s), the test fails and the pair is woken (peer gone,
// reads shut down) so that nothing hangs; a thread that still does not return aborts.
#include "core/stream.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/wire.h"
#include "shm/region.h"
#include "shm/shm.h"
#include "tests/unit/stream_pair.h"

namespace slip {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kSmallRing = 4096;
constexpr uint32_t kLargeRing = 1u << 20;
constexpr auto kWatchdog = seconds(20);

// Wakes every thread that may sleep on either end, so that a stuck test can end.
void Unstick(StreamPair* pair) {
  for (Stream* s : {pair->client.get(), pair->server.get()}) {
    if (!s) continue;
    s->MarkPeerGone();
    s->ShutdownRead();
  }
}

// ---------------------------------------------------------------------------- threads

// A function run on its own thread, with a watchdog (see the top of the file).
class Task {
 public:
  Task(StreamPair* pair, std::function<ssize_t()> fn)
      : pair_(pair), thread_([this, fn = std::move(fn)] {
          tid_.store(gettid());
          ssize_t r = fn();
          std::lock_guard<std::mutex> lock(mu_);
          result_ = r;
          done_ = true;
          cv_.notify_all();
        }) {}
  ~Task() {
    if (!WaitFor(milliseconds(0))) {
      ADD_FAILURE() << "a thread did not return: waking it";
      Unstick(pair_);
      if (!WaitFor(seconds(5))) {
        std::fprintf(stderr, "stream_test: a thread is stuck for good; aborting\n");
        std::abort();
      }
    }
    thread_.join();
  }
  Task(const Task&) = delete;
  Task& operator=(const Task&) = delete;

  // True once the function has returned (waits up to `timeout`).
  bool WaitFor(Clock::duration timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return done_; });
  }
  ssize_t result() {
    std::lock_guard<std::mutex> lock(mu_);
    return result_;
  }
  pthread_t handle() { return thread_.native_handle(); }

  // Waits until the thread sleeps in the kernel (state S: a blocking call or a lock), and
  // lets it settle there. False if it never does.
  bool WaitUntilAsleep() {
    const auto deadline = Clock::now() + seconds(5);
    while (Clock::now() < deadline) {
      pid_t tid = tid_.load();
      if (tid != 0 && ThreadState(tid) == 'S') {
        std::this_thread::sleep_for(milliseconds(20));
        return ThreadState(tid) == 'S';
      }
      if (WaitFor(milliseconds(1))) return false;  // returned instead of sleeping
    }
    return false;
  }

 private:
  static char ThreadState(pid_t tid) {
    std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t paren = stat.rfind(')');
    return paren == std::string::npos || paren + 2 >= stat.size() ? '?' : stat[paren + 2];
  }

  StreamPair* pair_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  ssize_t result_ = 0;
  std::atomic<pid_t> tid_{0};
  std::thread thread_;  // last: starts once the members above exist
};

// Bounds a test's own thread: when the test has not ended after the watchdog's time (a
// blocking call that never returns), the test fails and `wake` runs; if that does not free
// it within 5 s either, the binary aborts rather than hang.
class Watchdog {
 public:
  explicit Watchdog(std::function<void()> wake)
      : thread_([this, wake = std::move(wake)] {
          std::unique_lock<std::mutex> lock(mu_);
          if (cv_.wait_for(lock, kWatchdog, [this] { return done_; })) return;
          lock.unlock();
          ADD_FAILURE() << "watchdog: the test still runs after " << kWatchdog.count()
                        << " s: waking its streams";
          wake();
          lock.lock();
          if (!cv_.wait_for(lock, seconds(5), [this] { return done_; })) {
            std::fprintf(stderr, "stream_test: the test is stuck for good; aborting\n");
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

// Waits for all tasks, together bounded by the watchdog; on expiry fails the test and wakes
// the pair (the tasks' destructors then join). A task that fails (returns non-zero) stops
// the others: they are woken rather than left to the watchdog.
void AwaitAll(StreamPair* pair, const std::vector<std::unique_ptr<Task>>& tasks) {
  const auto deadline = Clock::now() + kWatchdog;
  bool woken = false;
  for (;;) {
    bool all_done = true;
    for (const auto& t : tasks) {
      if (!t->WaitFor(milliseconds(0))) {
        all_done = false;
      } else if (t->result() != 0 && !woken) {
        Unstick(pair);
        woken = true;
      }
    }
    if (all_done) return;
    if (Clock::now() >= deadline) {
      ADD_FAILURE() << "watchdog: threads still running after " << kWatchdog.count() << " s";
      Unstick(pair);
      return;
    }
    std::this_thread::sleep_for(milliseconds(2));
  }
}

// ---------------------------------------------------------------------------- helpers

ssize_t SendBytes(Stream* s, const void* data, size_t len, int flags = MSG_NOSIGNAL,
                  bool nonblocking = false) {
  iovec iov{const_cast<void*>(data), len};
  return s->Send(&iov, 1, flags, nonblocking);
}

ssize_t SendString(Stream* s, const std::string& text, int flags = MSG_NOSIGNAL) {
  return SendBytes(s, text.data(), text.size(), flags);
}

ssize_t RecvBytes(Stream* s, void* data, size_t len, int flags = 0, bool nonblocking = false) {
  iovec iov{data, len};
  return s->Recv(&iov, 1, flags, nonblocking);
}

// Receives up to `len` bytes as a string; the error code as "<-errno>" so that it compares.
std::string RecvString(Stream* s, size_t len, int flags = 0, bool nonblocking = false) {
  std::string buf(len, '\0');
  ssize_t n = RecvBytes(s, buf.data(), len, flags, nonblocking);
  if (n < 0) return "<" + std::to_string(n) + ">";
  buf.resize(size_t(n));
  return buf;
}

// The kernel's readiness of a proxy, right now.
uint32_t PollNow(int fd) {
  pollfd p{fd, POLLIN | POLLOUT | POLLRDHUP, 0};
  if (poll(&p, 1, 0) < 0) return ~0u;
  return uint32_t(p.revents);
}

std::string Bits(uint32_t ev) {
  if (ev == ~0u) return "poll-error";
  std::string s;
  const std::pair<uint32_t, const char*> names[] = {{EPOLLIN, "IN"},       {EPOLLOUT, "OUT"},
                                                    {EPOLLRDHUP, "RDHUP"}, {EPOLLHUP, "HUP"},
                                                    {EPOLLERR, "ERR"},     {POLLNVAL, "NVAL"}};
  for (const auto& [bit, name] : names) {
    if (ev & bit) s += s.empty() ? name : std::string("|") + name;
  }
  return s.empty() ? "0" : s;
}

constexpr uint32_t kAllEvents = EPOLLIN | EPOLLOUT | EPOLLRDHUP;

// Fills the send ring of `s` with non-blocking sends; returns the bytes it took.
size_t FillRing(Stream* s) {
  std::vector<uint8_t> chunk(1000, 0x5a);
  size_t total = 0;
  for (;;) {
    ssize_t n = SendBytes(s, chunk.data(), chunk.size(), MSG_NOSIGNAL, /*nonblocking=*/true);
    if (n <= 0) {
      EXPECT_EQ(n, -EAGAIN);
      return total;
    }
    total += size_t(n);
  }
}

// ---------------------------------------------------------------------------- content

uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The stream's content: byte `offset` of a direction seeded `seed`. Every 8-byte word is
// distinct, so a byte from another place or another lap of the ring does not match.
void Pattern(uint64_t seed, uint64_t offset, uint8_t* out, size_t len) {
  size_t i = 0;
  while (i < len) {
    uint64_t pos = offset + i;
    uint64_t word = Mix64(seed + (pos >> 3));
    for (unsigned k = unsigned(pos & 7); k < 8 && i < len; ++k) out[i++] = uint8_t(word >> (8 * k));
  }
}

// A 64-bit hash of a byte stream that does not depend on how it was split (xxh64 rounds).
class StreamHash {
 public:
  void Update(const uint8_t* p, size_t n) {
    length_ += n;
    while (n > 0) {
      if (fill_ == 0 && n >= 8) {
        uint64_t w;
        std::memcpy(&w, p, 8);
        Round(w);
        p += 8;
        n -= 8;
        continue;
      }
      pending_ |= uint64_t(*p++) << (8 * fill_);
      --n;
      if (++fill_ == 8) {
        Round(pending_);
        pending_ = 0;
        fill_ = 0;
      }
    }
  }
  uint64_t Digest() const {
    uint64_t h = acc_ ^ Mix64(pending_ ^ (uint64_t(fill_) << 56)) ^ Mix64(length_);
    return Mix64(h);
  }

 private:
  void Round(uint64_t w) {
    acc_ += w * 0xc2b2ae3d27d4eb4full;
    acc_ = (acc_ << 31) | (acc_ >> 33);
    acc_ *= 0x9e3779b185ebca87ull;
  }
  uint64_t acc_ = 0x27d4eb2f165667c5ull;
  uint64_t pending_ = 0;
  unsigned fill_ = 0;
  uint64_t length_ = 0;
};

using Rng = std::mt19937_64;

size_t Uniform(Rng& rng, size_t lo, size_t hi) {
  return std::uniform_int_distribution<size_t>(lo, hi)(rng);
}

// 1 B .. 3x the ring: log-uniform, with the edges around the ring size now and then.
size_t RandomSize(Rng& rng, uint32_t ring) {
  const size_t max = 3 * size_t(ring);
  if (Uniform(rng, 0, 15) == 0) {
    const size_t edges[] = {1, ring - 1u, ring, ring + 1u, 2 * size_t(ring), max};
    return edges[Uniform(rng, 0, std::size(edges) - 1)];
  }
  size_t bits = Uniform(rng, 0, 64 - __builtin_clzll(max));
  return Uniform(rng, 1, std::min(max, size_t(1) << bits));
}

// Splits [base, base+len) into one iovec, or into 2..8 pieces (some may be empty).
int RandomIov(Rng& rng, uint8_t* base, size_t len, iovec* iov) {
  if (Uniform(rng, 0, 1) == 0) {
    iov[0] = iovec{base, len};
    return 1;
  }
  int count = int(Uniform(rng, 2, 8));
  std::vector<size_t> cuts{0, len};
  for (int i = 1; i < count; ++i) cuts.push_back(Uniform(rng, 0, len));
  std::sort(cuts.begin(), cuts.end());
  for (int i = 0; i < count; ++i) iov[i] = iovec{base + cuts[i], cuts[i + 1] - cuts[i]};
  return count;
}

enum class Mode { kBlocking, kBlockingNoSpin, kNonblocking };

struct ContentParam {
  uint32_t ring;
  Mode mode;
};

std::string ContentName(const ::testing::TestParamInfo<ContentParam>& info) {
  std::string ring = info.param.ring >= (1u << 20) ? std::to_string(info.param.ring >> 20) + "M"
                                                   : std::to_string(info.param.ring >> 10) + "K";
  const char* mode = info.param.mode == Mode::kBlocking         ? "Blocking"
                     : info.param.mode == Mode::kBlockingNoSpin ? "BlockingNoSpin"
                                                                : "Nonblocking";
  return "Ring" + ring + "_" + mode;
}

uint64_t TestSeed() {
  if (const char* env = std::getenv("SLIP_TEST_SEED")) return std::strtoull(env, nullptr, 0);
  return 0x5eed0f5712ea3ull;
}

// One direction of a connection, driven by one sending and one receiving thread.
class Direction {
 public:
  Direction(Stream* tx, int tx_fd, Stream* rx, int rx_fd, uint64_t seed, uint64_t total,
            Clock::time_point stop_sending, uint32_t ring, bool nonblocking,
            std::atomic<bool>* failed)
      : tx_(tx),
        rx_(rx),
        tx_fd_(tx_fd),
        rx_fd_(rx_fd),
        seed_(seed),
        total_(total),
        stop_sending_(stop_sending),
        ring_(ring),
        nonblocking_(nonblocking),
        failed_(failed) {}

  // Sends the stream in random pieces (`total` bytes, or less if that takes too long, as under
  // a sanitizer), then shuts down writing.
  ssize_t Send() {
    Rng rng(seed_ ^ 0x73656e64);
    std::vector<uint8_t> buf(3 * size_t(ring_));
    uint64_t offset = 0;
    while (offset < total_ && Clock::now() < stop_sending_) {
      size_t len = std::min<uint64_t>(RandomSize(rng, ring_), total_ - offset);
      Pattern(seed_, offset, buf.data(), len);
      iovec iov[8];
      int count = RandomIov(rng, buf.data(), len, iov);
      ssize_t n = tx_->Send(iov, count, MSG_NOSIGNAL, nonblocking_);
      if (n == -EAGAIN && nonblocking_) {
        if (!Wait(tx_, tx_fd_, POLLOUT)) return -1;
        continue;
      }
      if (n <= 0 || size_t(n) > len)
        return Fail("send of " + std::to_string(len) + " at " + std::to_string(offset) +
                    " returned " + std::to_string(n));
      if (!nonblocking_ && size_t(n) != len)
        return Fail("blocking send of " + std::to_string(len) + " returned " + std::to_string(n));
      sent_hash_.Update(buf.data(), size_t(n));
      offset += uint64_t(n);
    }
    sent_ = offset;
    if (int rc = tx_->ShutdownWrite(); rc != 0) return Fail("ShutdownWrite: " + std::to_string(rc));
    return 0;
  }

  // Receives until EOF with random buffers (and now and then a MSG_PEEK or MSG_WAITALL),
  // checking every byte against the pattern.
  ssize_t Recv() {
    Rng rng(seed_ ^ 0x72656376);
    std::vector<uint8_t> buf(3 * size_t(ring_));
    std::vector<uint8_t> want(buf.size());
    uint64_t offset = 0;
    bool eof_due = false;  // a MSG_WAITALL receive came back short: only EOF may follow
    for (;;) {
      size_t len = RandomSize(rng, ring_);
      ssize_t peeked = 0;
      if (Uniform(rng, 0, 7) == 0) {
        peeked = RecvBytes(rx_, buf.data(), len, MSG_PEEK, nonblocking_);
        if (peeked > 0 && !Check(buf.data(), size_t(peeked), offset, "peeked")) return -1;
        if (peeked < 0 && peeked != -EAGAIN) return Fail("peek: " + std::to_string(peeked));
        if (peeked < 0) peeked = 0;
      }
      int flags = !nonblocking_ && Uniform(rng, 0, 3) == 0 ? MSG_WAITALL : 0;
      iovec iov[8];
      int count = RandomIov(rng, buf.data(), len, iov);
      ssize_t n = rx_->Recv(iov, count, flags, nonblocking_);
      if (n == -EAGAIN && nonblocking_) {
        if (!Wait(rx_, rx_fd_, POLLIN)) return -1;
        continue;
      }
      if (n < 0) return Fail("recv at " + std::to_string(offset) + ": " + std::to_string(n));
      if (n == 0) break;
      if (eof_due)
        return Fail("bytes after a short MSG_WAITALL receive at " + std::to_string(offset));
      if (size_t(n) > len || n < std::min<ssize_t>(ssize_t(len), peeked))
        return Fail("recv of " + std::to_string(len) + " after a peek of " +
                    std::to_string(peeked) + " returned " + std::to_string(n));
      eof_due = (flags & MSG_WAITALL) && size_t(n) < len;
      if (!Check(buf.data(), size_t(n), offset, "received")) return -1;
      recv_hash_.Update(buf.data(), size_t(n));
      offset += uint64_t(n);
    }
    received_ = offset;
    if (rx_->ReadableBytes() != 0) return Fail("readable bytes after EOF");
    return 0;
  }

  uint64_t sent() const { return sent_; }
  uint64_t received() const { return received_; }
  uint64_t sent_hash() const { return sent_hash_.Digest(); }
  uint64_t recv_hash() const { return recv_hash_.Digest(); }
  uint64_t spurious_wakeups() const { return spurious_.load(); }

 private:
  ssize_t Fail(const std::string& what) {
    if (!failed_->exchange(true)) ADD_FAILURE() << what;
    return -1;
  }

  bool Check(const uint8_t* got, size_t len, uint64_t offset, const char* what) {
    std::vector<uint8_t> want(len);
    Pattern(seed_, offset, want.data(), len);
    if (std::memcmp(got, want.data(), len) == 0) return true;
    size_t i = 0;
    while (got[i] == want[i]) ++i;
    Fail(std::string(what) + " byte " + std::to_string(offset + i) + " is " +
         std::to_string(got[i]) + ", want " + std::to_string(want[i]));
    return false;
  }

  // The application's wait after EAGAIN: PrepareToSleep, then poll proxy A. A wait that
  // times out while the rings say ready is a lost wake-up.
  bool Wait(Stream* s, int fd, short events) {
    const uint32_t interest = events == POLLIN ? EPOLLIN | EPOLLRDHUP : EPOLLOUT;
    for (int tries = 0; tries < 10; ++tries) {
      if (failed_->load()) return false;
      s->PrepareToSleep(interest);
      pollfd p{fd, events, 0};
      int rc = poll(&p, 1, 2000);
      if (rc < 0 && errno == EINTR) continue;
      if (rc < 0) return Fail(std::string("poll: ") + std::strerror(errno)), false;
      if (rc > 0) {
        if (!(s->Ready(interest) & interest)) ++spurious_;
        return true;
      }
      if (s->Ready(interest) & interest)
        return Fail(std::string("lost wake-up: poll timed out while the rings say ") +
                    Bits(s->Ready(interest))),
               false;
    }
    return Fail("nothing happened for 20 s"), false;
  }

  Stream* tx_;
  Stream* rx_;
  int tx_fd_;
  int rx_fd_;
  uint64_t seed_;
  uint64_t total_;
  Clock::time_point stop_sending_;
  uint32_t ring_;
  bool nonblocking_;
  std::atomic<bool>* failed_;
  uint64_t sent_ = 0;
  uint64_t received_ = 0;
  StreamHash sent_hash_;
  StreamHash recv_hash_;
  // Counted by both threads of the direction (the sender's and the receiver's waits).
  std::atomic<uint64_t> spurious_{0};
};

class StreamContentTest : public ::testing::TestWithParam<ContentParam> {};

// Both directions at once, each with its own sender and receiver thread: every byte arrives,
// in order, exactly once, and the whole-stream hashes agree.
TEST_P(StreamContentTest, BothDirectionsConcurrently) {
  const ContentParam param = GetParam();
  const bool nonblocking = param.mode == Mode::kNonblocking;
  StreamOptions options;
  options.spin_us = param.mode == Mode::kBlockingNoSpin ? 0 : 50;
  StreamPair pair;
  ASSERT_TRUE(MakeStreamPair(param.ring, options, &pair));
  const uint64_t seed = TestSeed() ^ param.ring ^ (uint64_t(param.mode) << 40);
  SCOPED_TRACE("seed " + std::to_string(seed) + " (SLIP_TEST_SEED)");
  const uint64_t total = param.ring == kSmallRing ? (8u << 20) + 12345 : (48u << 20) + 54321;
  const Clock::time_point stop_sending = Clock::now() + seconds(4);

  std::atomic<bool> failed{false};
  Direction up(pair.client.get(), pair.client_fd, pair.server.get(), pair.server_fd, seed, total,
               stop_sending, param.ring, nonblocking, &failed);
  Direction down(pair.server.get(), pair.server_fd, pair.client.get(), pair.client_fd, Mix64(seed),
                 total, stop_sending, param.ring, nonblocking, &failed);
  {
    std::vector<std::unique_ptr<Task>> tasks;
    tasks.push_back(std::make_unique<Task>(&pair, [&] { return up.Recv(); }));
    tasks.push_back(std::make_unique<Task>(&pair, [&] { return down.Recv(); }));
    tasks.push_back(std::make_unique<Task>(&pair, [&] { return up.Send(); }));
    tasks.push_back(std::make_unique<Task>(&pair, [&] { return down.Send(); }));
    AwaitAll(&pair, tasks);
  }
  ASSERT_FALSE(failed.load());
  EXPECT_EQ(up.received(), up.sent());
  EXPECT_EQ(down.received(), down.sent());
  // Under a slow sanitizer or a loaded machine the sending stops at the time budget: still,
  // each ring must have wrapped.
  EXPECT_GT(std::min(up.sent(), down.sent()), uint64_t(param.ring))
      << "too little sent to tell: " << up.sent() << " and " << down.sent() << " bytes";
  EXPECT_EQ(up.sent_hash(), up.recv_hash());
  EXPECT_EQ(down.sent_hash(), down.recv_hash());
  EXPECT_NE(up.sent_hash(), down.sent_hash());
  EXPECT_EQ(pair.client->UnconsumedBytes(), 0u);
  EXPECT_EQ(pair.server->UnconsumedBytes(), 0u);
  RecordProperty("bytes_each_way", std::to_string(std::min(up.sent(), down.sent())));
  RecordProperty("spurious_wakeups", int(up.spurious_wakeups() + down.spurious_wakeups()));
}

INSTANTIATE_TEST_SUITE_P(StreamRings, StreamContentTest,
                         ::testing::Values(ContentParam{kSmallRing, Mode::kBlocking},
                                           ContentParam{kSmallRing, Mode::kBlockingNoSpin},
                                           ContentParam{kSmallRing, Mode::kNonblocking},
                                           ContentParam{kLargeRing, Mode::kBlocking},
                                           ContentParam{kLargeRing, Mode::kBlockingNoSpin},
                                           ContentParam{kLargeRing, Mode::kNonblocking}),
                         ContentName);

// ---------------------------------------------------------------------------- semantics

// One connection with a 4 KiB ring and no spinning (every wait is a kernel sleep), under a
// watchdog for the blocking calls that the test makes on its own thread.
class StreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    watchdog_ = std::make_unique<Watchdog>([this] {
      std::lock_guard<std::mutex> lock(pair_mu_);
      Unstick(&pair_);
    });
    Connect(kSmallRing, 0);
  }
  void TearDown() override { watchdog_.reset(); }

  void Connect(uint32_t ring, uint32_t spin_us) {
    std::lock_guard<std::mutex> lock(pair_mu_);
    pair_ = StreamPair();
    StreamOptions options;
    options.spin_us = spin_us;
    ASSERT_TRUE(MakeStreamPair(ring, options, &pair_));
    client_ = pair_.client.get();
    server_ = pair_.server.get();
  }

  std::unique_ptr<Task> Start(std::function<ssize_t()> fn) {
    return std::make_unique<Task>(&pair_, std::move(fn));
  }

  std::mutex pair_mu_;  // the watchdog against Connect
  StreamPair pair_;
  Stream* client_ = nullptr;
  Stream* server_ = nullptr;
  std::unique_ptr<Watchdog> watchdog_;
};

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
  auto reader = Start([&] {
    char buf[8];
    return RecvBytes(client_, buf, sizeof(buf));
  });
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
  auto reader = Start([&] {
    char buf[8];
    return RecvBytes(client_, buf, sizeof(buf));
  });
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
  auto reader = Start([&] {
    char buf[8];
    return RecvBytes(client_, buf, sizeof(buf));
  });
  ASSERT_TRUE(reader->WaitUntilAsleep());
  client_->MarkPeerGone();
  ASSERT_TRUE(reader->WaitFor(seconds(5)));
  EXPECT_EQ(reader->result(), 0);
  EXPECT_EQ(SendString(client_, "x", MSG_NOSIGNAL), 1);  // accepted once, as TCP does
  EXPECT_EQ(SendString(client_, "x", MSG_NOSIGNAL), -EPIPE);
}

TEST_F(StreamTest, MarkPeerGoneWithOurBytesUnreadResetsOnce) {
  ASSERT_EQ(SendString(client_, "never read"), 10);
  auto reader = Start([&] {
    char buf[8];
    return RecvBytes(client_, buf, sizeof(buf));
  });
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
  auto reader = Start([&] {
    char buf[8];
    return RecvBytes(client_, buf, sizeof(buf));
  });
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
  auto reader = Start([&] {
    char buf[8];
    return RecvBytes(client_, buf, sizeof(buf));
  });
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
