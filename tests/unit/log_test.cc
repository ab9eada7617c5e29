// Unit tests for core/log's rate limit: per call site, a burst of kLogBurst warn or error
// lines, then one per kLogIntervalMs, and the count of dropped lines carried by the next
// line that passes. The clock is the test's own (LogSetClockForTest), so every count is
// exact; one test runs on the real clock.
#include "core/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace slip {
namespace {

std::atomic<uint64_t> g_now{1'000'000'000};
uint64_t FakeNow() {
  return g_now.load();
}
void Advance(uint64_t ms) {
  g_now.fetch_add(ms);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The count a line carries, 0 when it carries none.
uint64_t SuppressedIn(const std::string& line) {
  size_t at = line.rfind(" (");
  unsigned long long n = 0;
  if (at == std::string::npos || sscanf(line.c_str() + at, " (%llu similar", &n) != 1) return 0;
  return n;
}

class LogRateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/slip_lograte_test_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    path_ = dir_ + "/log";
    prefix_ = "slipstream[" + std::to_string(getpid()) + "]: ";
    LogInit(LogLevel::kWarn, path_.c_str());
    LogSetClockForTest(FakeNow);
    Advance(100 * kLogIntervalMs);  // sites used by an earlier test have refilled
  }
  void TearDown() override {
    LogSetClockForTest(nullptr);
    LogInit(LogLevel::kWarn, nullptr);
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }
  std::vector<std::string> Lines() {
    std::vector<std::string> lines;
    std::istringstream in(ReadFile(path_));
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
  std::string dir_, path_, prefix_;
};

// Each test logs from its own site, a lambda (each lambda has its own static; copies share
// it): a site keeps the count of its drops from one test into the next.
TEST_F(LogRateTest, BurstThenOneLineCarryingTheCount) {
  auto bad = [](int i) { SLIP_LOG(kWarn, "bad message %d", i); };
  for (int i = 0; i < 1000; ++i) bad(i);
  Advance(kLogIntervalMs);
  for (int i = 1000; i < 1005; ++i) bad(i);
  Advance(kLogIntervalMs);
  bad(1005);
  Advance(kLogIntervalMs);
  bad(1006);  // nothing dropped since the last line: no count

  std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), kLogBurst + 3);
  for (size_t i = 0; i < kLogBurst; ++i) {
    EXPECT_EQ(lines[i], prefix_ + "warn: bad message " + std::to_string(i));
  }
  EXPECT_EQ(lines[10], prefix_ + "warn: bad message 1000 (990 similar messages suppressed)");
  EXPECT_EQ(lines[11], prefix_ + "warn: bad message 1005 (4 similar messages suppressed)");
  EXPECT_EQ(lines[12], prefix_ + "warn: bad message 1006");
}

TEST_F(LogRateTest, OneDroppedLineIsSingular) {
  auto bad = [](int i) { SLIP_LOG(kWarn, "bad message %d", i); };
  for (int i = 0; i < 11; ++i) bad(i);
  Advance(kLogIntervalMs);
  bad(11);
  std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), kLogBurst + 1);
  EXPECT_EQ(lines.back(), prefix_ + "warn: bad message 11 (1 similar message suppressed)");
}

TEST_F(LogRateTest, SteadyRateAfterTheBurstAndRefillWhenQuiet) {
  auto bad = [](int i) { SLIP_LOG(kWarn, "bad message %d", i); };
  int calls = 0;
  for (int i = 0; i < 100; ++i, ++calls) bad(calls);
  for (int s = 0; s < 20; ++s) {
    Advance(kLogIntervalMs);
    for (int i = 0; i < 5; ++i, ++calls) bad(calls);
  }
  std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), kLogBurst + 20);  // the burst, then one per interval
  EXPECT_EQ(SuppressedIn(lines[kLogBurst]), 90u);
  for (size_t i = kLogBurst + 1; i < lines.size(); ++i) EXPECT_EQ(SuppressedIn(lines[i]), 4u);

  // Quiet for as long as the burst takes to earn: a full burst again.
  Advance(kLogBurst * kLogIntervalMs);
  for (int i = 0; i < 50; ++i) bad(i);
  lines = Lines();
  ASSERT_EQ(lines.size(), 2 * kLogBurst + 20);
  EXPECT_EQ(SuppressedIn(lines[kLogBurst + 20]), 4u);  // the last interval's drops
}

TEST_F(LogRateTest, SitesAreIndependent) {
  for (int i = 0; i < 100; ++i) {
    SLIP_LOG(kWarn, "site a %d", i);
    SLIP_LOG(kError, "site b %d", i);
  }
  std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), 2 * kLogBurst);
  int a = 0, b = 0;
  for (const auto& line : lines) {
    a += line.find("warn: site a") != std::string::npos;
    b += line.find("error: site b") != std::string::npos;
  }
  EXPECT_EQ(a, static_cast<int>(kLogBurst));
  EXPECT_EQ(b, static_cast<int>(kLogBurst));
}

TEST_F(LogRateTest, InfoAndBelowAreNotLimited) {
  LogInit(LogLevel::kDebug, path_.c_str());
  for (int i = 0; i < 50; ++i) {
    SLIP_LOG(kInfo, "info %d", i);
    SLIP_LOG(kDebug, "debug %d", i);
  }
  EXPECT_EQ(Lines().size(), 100u);
}

TEST_F(LogRateTest, RunTimeLevelIsLimitedByLevel) {
  auto log = [](LogLevel level, int i) { SLIP_LOG_AT(level, "chosen %d", i); };
  LogInit(LogLevel::kInfo, path_.c_str());
  for (int i = 0; i < 30; ++i) log(LogLevel::kInfo, i);
  for (int i = 0; i < 30; ++i) log(LogLevel::kWarn, i);
  std::vector<std::string> lines = Lines();
  EXPECT_EQ(lines.size(), 30 + kLogBurst);
}

TEST_F(LogRateTest, CountSurvivesALongLineBeingCut) {
  std::string big(5000, 'x');
  auto log = [&] { SLIP_LOG(kWarn, "%s", big.c_str()); };
  for (size_t i = 0; i < kLogBurst + 7; ++i) log();
  Advance(kLogIntervalMs);
  log();
  std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), kLogBurst + 1);
  EXPECT_EQ(lines[0].size(), 1023u);  // the ~1 KiB line limit, without its newline
  const std::string tail = " (7 similar messages suppressed)";
  EXPECT_EQ(lines.back().size(), 1023u);
  EXPECT_EQ(lines.back().substr(lines.back().size() - tail.size()), tail);
}

// Many threads on one site at one instant: exactly a burst passes, every line is whole,
// and the counts the lines carry add up to every drop (a line of the burst may carry drops
// that raced with it; the next line carries the rest).
TEST_F(LogRateTest, ManyThreadsOneSiteExact) {
  auto bad = [](int i) { SLIP_LOG(kWarn, "bad message %d", i); };
  constexpr int kThreads = 8, kCalls = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([bad] {
      for (int i = 0; i < kCalls; ++i) bad(i);
    });
  }
  for (auto& th : threads) th.join();
  Advance(kLogIntervalMs);
  bad(-1);
  std::vector<std::string> lines = Lines();
  ASSERT_EQ(lines.size(), kLogBurst + 1);
  uint64_t carried = 0;
  for (const auto& line : lines) {
    int n;
    EXPECT_EQ(sscanf(line.c_str() + prefix_.size(), "warn: bad message %d", &n), 1) << line;
    carried += SuppressedIn(line);
  }
  EXPECT_EQ(lines.back().rfind(prefix_ + "warn: bad message -1", 0), 0u) << lines.back();
  EXPECT_EQ(carried, kThreads * kCalls - kLogBurst);
}

// Many threads while the clock moves: no drop is lost or counted twice (lines that passed
// plus the counts they carry make every call), and the rate holds.
TEST_F(LogRateTest, ManyThreadsWhileTimePasses) {
  auto bad = [](int i) { SLIP_LOG(kWarn, "bad message %d", i); };
  constexpr int kThreads = 6, kCalls = 3000;
  std::atomic<bool> done{false};
  const uint64_t start = FakeNow();
  std::thread clock([&] {
    while (!done.load()) {
      Advance(kLogIntervalMs / 4);
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([bad] {
      for (int i = 0; i < kCalls; ++i) bad(i);
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  clock.join();
  const uint64_t elapsed = FakeNow() - start;
  Advance(kLogBurst * kLogIntervalMs);
  bad(-1);  // carries whatever was still counted

  std::vector<std::string> lines = Lines();
  uint64_t carried = 0;
  for (const auto& line : lines) carried += SuppressedIn(line);
  EXPECT_EQ(lines.size() - 1 + carried, uint64_t{kThreads} * kCalls);
  EXPECT_LE(lines.size() - 1, kLogBurst + elapsed / kLogIntervalMs + 1);
  EXPECT_GE(lines.size() - 1, kLogBurst);
}

TEST_F(LogRateTest, RealClock) {
  LogSetClockForTest(nullptr);
  auto started = std::chrono::steady_clock::now();
  auto log = [](int i) { SLIP_LOG(kWarn, "real %d", i); };
  for (int i = 0; i < 200; ++i) log(i);
  auto secs =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - started)
          .count();
  size_t lines = Lines().size();
  static bool first_run = true;  // under --gtest_repeat the site's budget may still be spent
  if (first_run) {
    EXPECT_GE(lines, kLogBurst);
  }
  first_run = false;
  EXPECT_LE(lines, kLogBurst + static_cast<size_t>(secs) + 1);
}

}  // namespace
}  // namespace slip
