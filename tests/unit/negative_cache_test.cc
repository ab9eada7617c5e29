// Tests for core/negative_cache.h: the destinations that said no (a REJECT, no path, a
// timeout), remembered until their deadline, within a fixed capacity.
#include "core/negative_cache.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>

#include "core/stats.h"
#include "core/wire.h"
#include "tests/fuzz/wire_samples.h"

namespace slip {
namespace {

using wire::Endpoint;
using wire::samples::V4;
using wire::samples::V6;

// Two IPv6 addresses (documentation and link-local).
constexpr std::array<uint8_t, 16> kV6a = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0,
                                          0,    0,    0,    0,    0, 0, 0, 0x2a};
constexpr std::array<uint8_t, 16> kV6b = {0xfe, 0x80, 0,    0,    0,    0,    0,    0,
                                          0x02, 0x11, 0x22, 0xff, 0xfe, 0x33, 0x44, 0x55};

Endpoint Dest(uint32_t i, uint16_t port = 443) {
  return V4({10, uint8_t(i >> 16), uint8_t(i >> 8), uint8_t(i)}, port);
}

TEST(NegativeCache, EmptyMisses) {
  NegativeCache cache;
  Reason why = Reason::kNone;
  EXPECT_FALSE(cache.Lookup(Dest(1), 0, &why));
  EXPECT_EQ(why, Reason::kNone);
  EXPECT_EQ(cache.size(), 0u);
}

TEST(NegativeCache, InsertLookupExpire) {
  NegativeCache cache;
  cache.Insert(Dest(1), Reason::kNoRdmaPath, 1000);
  EXPECT_EQ(cache.size(), 1u);
  Reason why = Reason::kNone;
  EXPECT_TRUE(cache.Lookup(Dest(1), 0, &why));
  EXPECT_EQ(why, Reason::kNoRdmaPath);
  why = Reason::kNone;
  EXPECT_TRUE(cache.Lookup(Dest(1), 999, &why));
  EXPECT_EQ(why, Reason::kNoRdmaPath);
  EXPECT_FALSE(cache.Lookup(Dest(2), 0, &why));
  // Expired at exactly its deadline; an expired entry is dropped when seen.
  why = Reason::kNone;
  EXPECT_FALSE(cache.Lookup(Dest(1), 1000, &why));
  EXPECT_EQ(why, Reason::kNone);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_FALSE(cache.Lookup(Dest(1), 0, &why));
}

TEST(NegativeCache, ExpiredLookupKeepsOthers) {
  NegativeCache cache;
  for (uint32_t i = 0; i < 10; ++i) cache.Insert(Dest(i), Reason::kNoRdmaPath, 100 + i);
  Reason why;
  EXPECT_FALSE(cache.Lookup(Dest(3), 500, &why));
  EXPECT_EQ(cache.size(), 9u);
  for (uint32_t i = 0; i < 10; ++i) {
    if (i == 3) continue;
    EXPECT_TRUE(cache.Lookup(Dest(i), 50, &why)) << i;
  }
}

TEST(NegativeCache, Overwrite) {
  NegativeCache cache;
  cache.Insert(Dest(1), Reason::kNoRdmaPath, 1000);
  cache.Insert(Dest(1), Reason::kNoRdmaDevice, 5000);
  EXPECT_EQ(cache.size(), 1u);
  Reason why;
  EXPECT_TRUE(cache.Lookup(Dest(1), 2000, &why));
  EXPECT_EQ(why, Reason::kNoRdmaDevice);
  // Overwriting with an earlier deadline shortens the entry.
  cache.Insert(Dest(1), Reason::kMemlock, 10);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_FALSE(cache.Lookup(Dest(1), 2000, &why));
  EXPECT_EQ(cache.size(), 0u);
}

TEST(NegativeCache, DifferentPortsAreDifferentDestinations) {
  NegativeCache cache;
  cache.Insert(Dest(1, 443), Reason::kNoRdmaPath, 1000);
  Reason why;
  EXPECT_FALSE(cache.Lookup(Dest(1, 444), 0, &why));
  EXPECT_FALSE(cache.Lookup(Dest(1, 0), 0, &why));
  cache.Insert(Dest(1, 444), Reason::kMemlock, 1000);
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_TRUE(cache.Lookup(Dest(1, 443), 0, &why));
  EXPECT_EQ(why, Reason::kNoRdmaPath);
  EXPECT_TRUE(cache.Lookup(Dest(1, 444), 0, &why));
  EXPECT_EQ(why, Reason::kMemlock);
}

TEST(NegativeCache, FamiliesAndAddressesAreDistinct) {
  NegativeCache cache;
  cache.Insert(V4({10, 0, 0, 1}, 80), Reason::kNoRdmaPath, 1000);
  Reason why;
  // The same first bytes as IPv6 are another destination.
  EXPECT_FALSE(cache.Lookup(V6({10, 0, 0, 1}, 80), 0, &why));
  EXPECT_FALSE(cache.Lookup(V4({10, 0, 0, 2}, 80), 0, &why));
  cache.Insert(V6(kV6a, 80), Reason::kMemlock, 1000);
  EXPECT_TRUE(cache.Lookup(V6(kV6a, 80), 0, &why));
  EXPECT_EQ(why, Reason::kMemlock);
  EXPECT_FALSE(cache.Lookup(V6(kV6b, 80), 0, &why));
}

TEST(NegativeCache, CapacityBound) {
  NegativeCache cache;
  constexpr uint32_t kCap = 4096;
  constexpr uint32_t kTotal = kCap + 500;
  for (uint32_t i = 0; i < kTotal; ++i) {
    cache.Insert(Dest(i), Reason::kNoRdmaPath, 1000000 + i);
    ASSERT_EQ(cache.size(), std::min(i + 1, kCap)) << i;
    Reason why;
    ASSERT_TRUE(cache.Lookup(Dest(i), 0, &why)) << "newest entry missing after insert " << i;
  }
  EXPECT_EQ(cache.size(), kCap);
  // The oldest (earliest-expiring) entries went first; the newest kCap are all there.
  Reason why;
  for (uint32_t i = 0; i < kTotal - kCap; ++i) EXPECT_FALSE(cache.Lookup(Dest(i), 0, &why)) << i;
  for (uint32_t i = kTotal - kCap; i < kTotal; ++i)
    EXPECT_TRUE(cache.Lookup(Dest(i), 0, &why)) << i;
  EXPECT_EQ(cache.size(), kCap);
}

// Full of entries that all expire at the same time: a new one still gets in.
TEST(NegativeCache, CapacityBoundSameDeadline) {
  NegativeCache cache;
  for (uint32_t i = 0; i < 4096 + 10; ++i) {
    cache.Insert(Dest(i, 9), Reason::kNoRdmaPath, 777);
    Reason why;
    ASSERT_TRUE(cache.Lookup(Dest(i, 9), 0, &why)) << i;
  }
  EXPECT_EQ(cache.size(), 4096u);
}

}  // namespace
}  // namespace slip
