// Tests for the stream engine's bytes (tests/unit/stream_fixture.h has the setting): both
// directions at once, seeded random sizes and flags, every byte checked by a running hash.
#include <gtest/gtest.h>

#include "tests/unit/stream_fixture.h"

namespace slip {
namespace {

using namespace stream_fixture;  // NOLINT(google-build-using-namespace)

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

}  // namespace
}  // namespace slip
