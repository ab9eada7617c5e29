// Tests for one connection used by several processes after fork (core/shared_sides.h): two
// processes sending at once, two processes receiving at once, and a sender killed in the
// middle of its calls, over a real shm connection (tests/unit/stream_pair.h) whose ends
// crossed a fork as the shim's do (Stream::ShareAcrossFork in the fork handler).
//
// The writers' bytes are told apart by their high bit (one writer's are 0-127, the other's
// 128-255), so the reader can check each writer's bytes, in order, whatever the
// interleaving: a lost, doubled or overwritten byte shows. Before the cursors were shared,
// both processes wrote at the same ring offsets and these tests failed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "core/stream.h"
#include "tests/unit/stream_pair.h"

namespace slip {
namespace {

constexpr uint32_t kRing = 16384;  // small: the writers often find it full and wait
constexpr size_t kPerWriter = 1 << 20;

// The `n` bytes writer `high` (0 or 0x80) sends: a seeded sequence in its half of the byte
// values.
std::vector<uint8_t> WriterBytes(uint8_t high, size_t n) {
  std::mt19937 rng(high + 17);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = uint8_t((rng() & 0x7f) | high);
  return out;
}

// Sends `bytes` in calls of random sizes (blocking). True when all went.
bool SendAll(Stream* s, const std::vector<uint8_t>& bytes, uint32_t seed) {
  std::mt19937 rng(seed);
  for (size_t off = 0; off < bytes.size();) {
    const size_t n = std::min<size_t>(bytes.size() - off, 1 + rng() % 3000);
    iovec iov{const_cast<uint8_t*>(bytes.data() + off), n};
    const ssize_t rc = s->Send(&iov, 1, MSG_NOSIGNAL, false);
    if (rc <= 0) return false;
    off += size_t(rc);
  }
  return true;
}

// Reads until `total` bytes came (or EOF, or 20 s).
std::vector<uint8_t> ReadAll(Stream* s, size_t total) {
  std::vector<uint8_t> got;
  got.reserve(total);
  uint8_t buf[8192];
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got.size() < total && std::chrono::steady_clock::now() < until) {
    iovec iov{buf, sizeof(buf)};
    const ssize_t rc = s->Recv(&iov, 1, 0, true);
    if (rc == 0) break;
    if (rc == -EAGAIN) {  // (polled: a writer that dies must not leave us asleep)
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      continue;
    }
    if (rc < 0) break;
    got.insert(got.end(), buf, buf + rc);
  }
  return got;
}

// Splits what a reader got by writer (high bit).
void Split(const std::vector<uint8_t>& got, std::vector<uint8_t>* low, std::vector<uint8_t>* high) {
  for (uint8_t b : got) (b & 0x80 ? high : low)->push_back(b);
}

::testing::AssertionResult SameBytes(const std::vector<uint8_t>& got,
                                     const std::vector<uint8_t>& want, const char* who) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure()
           << who << ": " << got.size() << " bytes, expected " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i])
      return ::testing::AssertionFailure() << who << ": byte " << i << " differs";
  }
  return ::testing::AssertionSuccess();
}

TEST(SharedSidesTest, TwoProcessesSendingOnOneConnectionDeliverEveryByteOfEachInOrder) {
  StreamPair pair;
  ASSERT_TRUE(MakeStreamPair(kRing, StreamOptions{}, &pair));
  ASSERT_TRUE(pair.client->ShareAcrossFork());  // what the fork handler does
  const auto child_bytes = WriterBytes(0x00, kPerWriter);
  const auto parent_bytes = WriterBytes(0x80, kPerWriter);
  // Each sends half, in turn (so that the test cannot pass with one writer after the
  // other), then both send the rest at once.
  int child_half[2], parent_half[2];
  ASSERT_EQ(pipe(child_half), 0);
  ASSERT_EQ(pipe(parent_half), 0);
  const auto half = [](const std::vector<uint8_t>& v, int which) {
    return which == 0 ? std::vector<uint8_t>(v.begin(), v.begin() + v.size() / 2)
                      : std::vector<uint8_t>(v.begin() + v.size() / 2, v.end());
  };
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    char c;
    const bool ok = SendAll(pair.client.get(), half(child_bytes, 0), 1) &&
                    write(child_half[1], "c", 1) == 1 && read(parent_half[0], &c, 1) == 1 &&
                    SendAll(pair.client.get(), half(child_bytes, 1), 11);
    _exit(ok ? 0 : 1);
  }
  std::thread writer([&] {
    char c;
    EXPECT_EQ(read(child_half[0], &c, 1), 1);
    EXPECT_TRUE(SendAll(pair.client.get(), half(parent_bytes, 0), 2));
    EXPECT_EQ(write(parent_half[1], "p", 1), 1);
    EXPECT_TRUE(SendAll(pair.client.get(), half(parent_bytes, 1), 12));
  });
  const std::vector<uint8_t> got = ReadAll(pair.server.get(), 2 * kPerWriter);
  writer.join();
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  std::vector<uint8_t> low, high;
  Split(got, &low, &high);
  EXPECT_TRUE(SameBytes(low, child_bytes, "the child's bytes"));
  EXPECT_TRUE(SameBytes(high, parent_bytes, "the parent's bytes"));
  size_t switches = 0;
  for (size_t i = 1; i < got.size(); ++i) switches += (got[i] ^ got[i - 1]) >> 7;
  EXPECT_GE(switches, 2u);
  for (int fd : {child_half[0], child_half[1], parent_half[0], parent_half[1]}) close(fd);
}

TEST(SharedSidesTest, TwoProcessesReceivingShareTheBytesWithoutLossOrDoubles) {
  StreamPair pair;
  ASSERT_TRUE(MakeStreamPair(kRing, StreamOptions{}, &pair));
  ASSERT_TRUE(pair.server->ShareAcrossFork());
  const auto bytes = WriterBytes(0x00, kPerWriter);
  uint64_t want_sum = 0;
  for (uint8_t b : bytes) want_sum += b;
  int report[2], started[2];
  ASSERT_EQ(pipe(report), 0);
  ASSERT_EQ(pipe(started), 0);
  // Each receiver reads until the writer's EOF and reports how many bytes and their sum.
  // The child, after its first bytes, pauses while the parent reads alone, so that both
  // surely receive (one alone would prove nothing), then both read at once.
  auto receive = [&pair](int started_fd) {
    uint64_t count = 0, sum = 0;
    uint8_t buf[3000];
    for (;;) {
      iovec iov{buf, sizeof(buf)};
      const ssize_t rc = pair.server->Recv(&iov, 1, 0, false);
      if (rc <= 0) break;
      if (count == 0 && started_fd >= 0) {
        (void)!write(started_fd, "s", 1);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      count += uint64_t(rc);
      for (ssize_t i = 0; i < rc; ++i) sum += buf[i];
    }
    return std::pair<uint64_t, uint64_t>(count, sum);
  };
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const auto [count, sum] = receive(started[1]);
    const uint64_t out[2] = {count, sum};
    _exit(write(report[1], out, sizeof(out)) == ssize_t(sizeof(out)) ? 0 : 1);
  }
  std::thread writer([&] {
    EXPECT_TRUE(SendAll(pair.client.get(), bytes, 3));
    pair.client->ShutdownWrite();  // EOF for both receivers
  });
  char c;
  ASSERT_EQ(read(started[0], &c, 1), 1);  // (the child has begun)
  const auto [count, sum] = receive(-1);
  writer.join();
  uint64_t theirs[2] = {0, 0};
  EXPECT_EQ(read(report[0], theirs, sizeof(theirs)), ssize_t(sizeof(theirs)));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(count + theirs[0], bytes.size()) << "parent " << count << ", child " << theirs[0];
  // (Both received: one alone would prove nothing.)
  EXPECT_GT(count, 0u);
  EXPECT_GT(theirs[0], 0u);
  EXPECT_EQ(sum + theirs[1], want_sum);
  for (int fd : {report[0], report[1], started[0], started[1]}) close(fd);
}

TEST(SharedSidesTest, ASenderKilledMidCallLeavesTheConnectionToTheOthers) {
  StreamPair pair;
  ASSERT_TRUE(MakeStreamPair(kRing, StreamOptions{}, &pair));
  ASSERT_TRUE(pair.client->ShareAcrossFork());
  const auto child_bytes = WriterBytes(0x00, 64 * kPerWriter);  // more than it can send
  const auto parent_bytes = WriterBytes(0x80, kPerWriter / 4);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(SendAll(pair.client.get(), child_bytes, 4) ? 0 : 1);
  // Let it fill the ring and wait in its calls (mostly asleep, sometimes holding the lock),
  // read some, then kill it.
  std::vector<uint8_t> got = ReadAll(pair.server.get(), 3 * kRing);
  kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  std::thread writer([&] { EXPECT_TRUE(SendAll(pair.client.get(), parent_bytes, 5)); });
  // Everything the parent sends arrives after whatever the child had published.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  std::vector<uint8_t> low, high;
  while (high.size() < parent_bytes.size() && std::chrono::steady_clock::now() < until) {
    const auto more = ReadAll(pair.server.get(), 1);
    got.insert(got.end(), more.begin(), more.end());
    low.clear();
    high.clear();
    Split(got, &low, &high);
  }
  writer.join();
  EXPECT_TRUE(SameBytes(high, parent_bytes, "the parent's bytes"));
  // The child's bytes: a prefix of what it meant to send, in order.
  ASSERT_LE(low.size(), child_bytes.size());
  EXPECT_TRUE(SameBytes(low,
                        std::vector<uint8_t>(child_bytes.begin(), child_bytes.begin() + low.size()),
                        "the child's bytes"));
}

}  // namespace
}  // namespace slip
