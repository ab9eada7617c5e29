// The short-connection policy (core/short_conns.h): a destination whose accelerated
// connections keep closing young and small goes plain, but for a probe now and then; one
// connection that lives or moves enough, or a pause, brings acceleration back; other
// destinations are judged on their own.
#include "core/short_conns.h"

#include <gtest/gtest.h>

#include <string>
#include <string_view>
#include <tuple>

#include "core/config.h"
#include "tests/unit/rendezvous_helpers.h"

namespace slip {
namespace {

using shm::rendezvous_helpers::Ep;
using P = ShortConnPolicy;

// `n` accelerated connections to `dest`, each ending as given; the clock moves 1 ms each.
void Close(P* policy, const wire::Endpoint& dest, int n, uint64_t* now, uint64_t life_ms,
           uint64_t bytes) {
  for (int i = 0; i < n; ++i) {
    ++*now;
    EXPECT_FALSE(policy->Bypass(dest, *now)) << "connection " << i << " must be accelerated";
    policy->NoteClosed(dest, *now, life_ms, bytes);
  }
}

TEST(ShortConnPolicyTest, ARunOfShortConnectionsGoesPlainButForProbes) {
  P policy;
  const auto dest = Ep("127.0.0.1", 5432);
  uint64_t now = 1000;
  Close(&policy, dest, P::kRun - 1, &now, 1, 100);
  EXPECT_FALSE(policy.Bypass(dest, ++now)) << "one short of the run";
  policy.NoteClosed(dest, now, 1, 100);
  int plain = 0, probes = 0;
  for (uint32_t i = 0; i < 4 * P::kProbeEvery; ++i) {
    if (policy.Bypass(dest, ++now)) {
      ++plain;
    } else {
      ++probes;
      policy.NoteClosed(dest, now, 1, 100);  // the probe was short too
    }
  }
  EXPECT_EQ(probes, 4);
  EXPECT_EQ(plain, int(4 * P::kProbeEvery) - 4);
}

TEST(ShortConnPolicyTest, AProbeThatLivesOrMovesEnoughBringsAccelerationBack) {
  for (const bool by_bytes : {false, true}) {
    SCOPED_TRACE(by_bytes ? "by bytes" : "by life");
    P policy;
    const auto dest = Ep("10.0.0.1", 80);
    uint64_t now = 5000;
    Close(&policy, dest, P::kRun, &now, 1, 100);
    uint32_t bypassed = 0;
    while (policy.Bypass(dest, ++now)) ++bypassed;
    EXPECT_EQ(bypassed, P::kProbeEvery - 1);
    // The probe: a connection that paid off.
    policy.NoteClosed(dest, now, by_bytes ? 1 : P::kShortLifeMs, by_bytes ? P::kShortBytes : 0);
    Close(&policy, dest, P::kRun - 1, &now, 1, 100);  // accelerated again, the run from zero
  }
}

TEST(ShortConnPolicyTest, APauseStartsAfresh) {
  P policy;
  const auto dest = Ep("127.0.0.1", 8080);
  uint64_t now = 1;
  Close(&policy, dest, P::kRun, &now, 0, 0);
  EXPECT_TRUE(policy.Bypass(dest, ++now));
  now += P::kIdleMs + 1;
  EXPECT_FALSE(policy.Bypass(dest, now)) << "after a pause";
  policy.NoteClosed(dest, now, 0, 0);
  EXPECT_FALSE(policy.Bypass(dest, ++now)) << "the run starts from zero";
}

TEST(ShortConnPolicyTest, DestinationsAreJudgedApartAndLongOnesAreNotRemembered) {
  P policy;
  const auto a = Ep("127.0.0.1", 1000), b = Ep("127.0.0.1", 1001), c = Ep("::1", 1000);
  uint64_t now = 1;
  Close(&policy, a, P::kRun, &now, 0, 0);
  Close(&policy, c, 3 * P::kRun, &now, P::kShortLifeMs + 5, 0);  // long ones
  EXPECT_TRUE(policy.Bypass(a, ++now));
  EXPECT_FALSE(policy.Bypass(b, ++now));
  EXPECT_FALSE(policy.Bypass(c, ++now));
  // More destinations than it remembers: the stalest goes, nothing breaks.
  for (int port = 2000; port < 2200; ++port) {
    const auto d = Ep("127.0.0.1", uint16_t(port));
    Close(&policy, d, 1, &now, 0, 0);
  }
  EXPECT_FALSE(policy.Bypass(a, ++now)) << "forgotten (or paused): accelerated";
}

TEST(ShortConnPolicyTest, TheKnobParsesAndDefaultsToAdaptive) {
  EXPECT_TRUE(Config{}.short_conns_adaptive);
  for (const auto& [value, ok, adaptive] :
       {std::tuple{"adaptive", true, true}, std::tuple{"accelerate", true, false},
        std::tuple{" accelerate ", true, false}, std::tuple{"off", false, true},
        std::tuple{"", false, true}}) {
    SCOPED_TRACE(value);
    const char* v = value;
    auto lookup = [](const char* name, void* ctx) -> const char* {
      return std::string_view(name) == "SLIP_SHORT_CONNS" ? static_cast<const char*>(ctx) : nullptr;
    };
    Config config;
    std::string error;
    EXPECT_EQ(ParseConfig(lookup, const_cast<char*>(v), &config, &error), ok) << error;
    EXPECT_EQ(config.short_conns_adaptive, adaptive);
    if (!ok) {
      EXPECT_NE(error.find("SLIP_SHORT_CONNS"), std::string::npos) << error;
    }
  }
}

}  // namespace
}  // namespace slip
