// Unit tests for fabric/request_rates.h: how fast a fabric listener answers requests.
#include <gtest/gtest.h>

#include "fabric/request_rates.h"
#include "tests/unit/loopback_endpoint.h"

namespace slip::fabric {
namespace {

using test::LoopbackAt;

TEST(RequestRatesTest, ASourceGetsItsBurstThenItsRate) {
  RequestRates rates;
  ASSERT_TRUE(rates.Init());
  TokenBucket listener = RequestRates::ListenerBucket();
  uint64_t now = 1000000;
  int answered = 0;
  for (int i = 0; i < 1000; ++i)
    answered += rates.Admit(&listener, LoopbackAt(2, uint16_t(i)), now);
  EXPECT_EQ(answered, int(RequestRates::kSourceBurst));
  EXPECT_TRUE(rates.DroppedLately(LoopbackAt(2, 9), now / 1000));
  EXPECT_FALSE(rates.DroppedLately(LoopbackAt(3, 9), now / 1000));
  now += 500000;  // half a second: half its rate
  answered = 0;
  for (int i = 0; i < 1000; ++i)
    answered += rates.Admit(&listener, LoopbackAt(2, uint16_t(i)), now);
  EXPECT_EQ(answered, int(RequestRates::kSourceRate / 2));
}

// A flood from many addresses empties the listener's bucket; a source that is not
// flooding is still answered, and one whose requests were proven gets its tokens back.
TEST(RequestRatesTest, QuietAndProvenSourcesAreAnsweredThroughAFlood) {
  RequestRates rates;
  ASSERT_TRUE(rates.Init());
  TokenBucket listener = RequestRates::ListenerBucket();
  uint64_t now = 1000000;
  auto flood = [&] {
    for (int s = 0; s < 64; ++s)
      for (int i = 0; i < 100; ++i)
        rates.Admit(&listener, LoopbackAt(uint8_t(10 + s), uint16_t(i)), now);
  };
  flood();
  now += 100000;
  flood();
  EXPECT_FALSE(rates.Admit(&listener, LoopbackAt(10, 1), now));
  int answered = 0;
  for (int i = 0; i < 8; ++i) answered += rates.Admit(&listener, LoopbackAt(2, uint16_t(i)), now);
  EXPECT_EQ(answered, 8);
  // A busy client whose connections are real: each accepted one gives its tokens back.
  answered = 0;
  for (int i = 0; i < 200; ++i) {
    if (rates.Admit(&listener, LoopbackAt(3, uint16_t(i)), now)) {
      ++answered;
      rates.Refund(&listener, LoopbackAt(3, uint16_t(i)));
    }
  }
  EXPECT_EQ(answered, 200);
}

}  // namespace
}  // namespace slip::fabric
