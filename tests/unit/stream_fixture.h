// What the tests of the stream engine share (stream_content_test.cc,
// stream_semantics_test.cc, stream_readiness_test.cc): the two Stream objects are the two
// ends of one connection over the real shm channel and readiness proxy, in one process,
// built the way the shim builds them (the client's offer, the server's registration), with
// no mocks. What the application would see on its descriptor is proxy A, so readiness is
// checked with poll() on it.
//
// Every thread a test starts runs as a Task: if it has not returned when the test is done
// with it (or after the watchdog's 20 s), the test fails and the pair is woken (peer gone,
// reads shut down) so that nothing hangs; a thread that still does not return aborts.
#pragma once

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

#include "core/stream.h"
#include "core/wire.h"
#include "shm/region.h"
#include "shm/shm.h"
#include "tests/unit/stream_pair.h"

namespace slip::stream_fixture {

using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

inline constexpr uint32_t kSmallRing = 4096;
inline constexpr uint32_t kLargeRing = 1u << 20;
inline constexpr auto kWatchdog = seconds(20);

// Wakes every thread that may sleep on either end, so that a stuck test can end.
inline void Unstick(StreamPair* pair) {
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
        std::fprintf(stderr, "stream tests: a thread is stuck for good; aborting\n");
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
            std::fprintf(stderr, "stream tests: the test is stuck for good; aborting\n");
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
inline void AwaitAll(StreamPair* pair, const std::vector<std::unique_ptr<Task>>& tasks) {
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

inline ssize_t SendBytes(Stream* s, const void* data, size_t len, int flags = MSG_NOSIGNAL,
                         bool nonblocking = false) {
  iovec iov{const_cast<void*>(data), len};
  return s->Send(&iov, 1, flags, nonblocking);
}

inline ssize_t SendString(Stream* s, const std::string& text, int flags = MSG_NOSIGNAL) {
  return SendBytes(s, text.data(), text.size(), flags);
}

inline ssize_t RecvBytes(Stream* s, void* data, size_t len, int flags = 0,
                         bool nonblocking = false) {
  iovec iov{data, len};
  return s->Recv(&iov, 1, flags, nonblocking);
}

// Receives up to `len` bytes as a string; the error code as "<-errno>" so that it compares.
inline std::string RecvString(Stream* s, size_t len, int flags = 0, bool nonblocking = false) {
  std::string buf(len, '\0');
  ssize_t n = RecvBytes(s, buf.data(), len, flags, nonblocking);
  if (n < 0) return "<" + std::to_string(n) + ">";
  buf.resize(size_t(n));
  return buf;
}

// The kernel's readiness of a proxy, right now.
inline uint32_t PollNow(int fd) {
  pollfd p{fd, POLLIN | POLLOUT | POLLRDHUP, 0};
  if (poll(&p, 1, 0) < 0) return ~0u;
  return uint32_t(p.revents);
}

inline std::string Bits(uint32_t ev) {
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

inline constexpr uint32_t kAllEvents = EPOLLIN | EPOLLOUT | EPOLLRDHUP;

// Fills the send ring of `s` with non-blocking sends; returns the bytes it took.
inline size_t FillRing(Stream* s) {
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

// Seeded bytes: what `seed` says at `offset` of a stream, `len` of them into `out`.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The stream's content: byte `offset` of a direction seeded `seed`. Every 8-byte word is
// distinct, so a byte from another place or another lap of the ring does not match.
inline void Pattern(uint64_t seed, uint64_t offset, uint8_t* out, size_t len) {
  size_t i = 0;
  while (i < len) {
    uint64_t pos = offset + i;
    uint64_t word = Mix64(seed + (pos >> 3));
    for (unsigned k = unsigned(pos & 7); k < 8 && i < len; ++k) out[i++] = uint8_t(word >> (8 * k));
  }
}

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
  // A thread that reads up to 8 bytes from `s` (blocking).
  std::unique_ptr<Task> StartReader(Stream* s) {
    return Start([s] {
      char buf[8];
      return RecvBytes(s, buf, sizeof(buf));
    });
  }

  std::mutex pair_mu_;  // the watchdog against Connect
  StreamPair pair_;
  Stream* client_ = nullptr;
  Stream* server_ = nullptr;
  std::unique_ptr<Watchdog> watchdog_;
};

}  // namespace slip::stream_fixture
