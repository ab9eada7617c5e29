// The proxy pair's readiness moves (core/proxy.h): Fill makes A unwritable, Unfill makes it
// writable again, whatever is queued; tokens wake A's reader and drain.
#include "core/proxy.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

namespace slip {
namespace {

short Revents(int fd, short events) {
  pollfd p{fd, events, 0};
  EXPECT_GE(poll(&p, 1, 0), 0);
  return p.revents;
}

class ProxyTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(proxy::CreatePair(pair_), 0); }
  void TearDown() override {
    close(pair_[0]);
    close(pair_[1]);
  }
  int pair_[2] = {-1, -1};
};

TEST_F(ProxyTest, FillAndUnfillToggleWritability) {
  const int a = pair_[0], b = pair_[1];
  EXPECT_TRUE(Revents(a, POLLOUT) & POLLOUT);
  for (int round = 0; round < 5; ++round) {
    proxy::Fill(a);
    EXPECT_FALSE(Revents(a, POLLOUT) & POLLOUT) << round;
    EXPECT_TRUE(Revents(b, POLLIN) & POLLIN) << round;
    proxy::Fill(a);  // filling a full proxy changes nothing
    EXPECT_FALSE(Revents(a, POLLOUT) & POLLOUT) << round;
    proxy::Unfill(b);
    EXPECT_TRUE(Revents(a, POLLOUT) & POLLOUT) << round;
    EXPECT_FALSE(Revents(b, POLLIN) & POLLIN) << round;
  }
}

TEST_F(ProxyTest, TokensWakeTheReaderAndDrain) {
  const int a = pair_[0], b = pair_[1];
  WakeState wake{};
  EXPECT_FALSE(Revents(a, POLLIN) & POLLIN);
  for (int i = 0; i < 3; ++i) proxy::WriteToken(&wake, b);
  EXPECT_EQ(wake.tokens.load(), 3u);
  EXPECT_TRUE(Revents(a, POLLIN) & POLLIN);
  proxy::DrainTokens(&wake, a);
  EXPECT_FALSE(Revents(a, POLLIN) & POLLIN);
  // A fill in the other direction does not disturb the tokens' side.
  proxy::Fill(a);
  proxy::WriteToken(&wake, b);
  EXPECT_TRUE(Revents(a, POLLIN) & POLLIN);
  proxy::Unfill(b);
  EXPECT_TRUE(Revents(a, POLLIN) & POLLIN);
}

}  // namespace
}  // namespace slip
