// fabric's WriteLedger: whether any write completed after one that failed, from write
// numbers whose low 32 bits are all a completion carries; and the cursor words in flight.
#include "fabric/write_ledger.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

namespace slip::fabric {
namespace {

TEST(WriteLedger, CountsPostedAndCompleted) {
  WriteLedger l;
  EXPECT_TRUE(l.AllCompleted());
  const uint32_t a = l.Next(), b = l.Next();
  l.Posted();
  l.Posted();
  EXPECT_FALSE(l.AllCompleted());
  l.Done(b);
  l.Done(a);
  EXPECT_TRUE(l.AllCompleted());
  EXPECT_EQ(l.posted(), 2u);
  EXPECT_TRUE(l.InOrder());
  EXPECT_FALSE(l.AnyFailed());
}

TEST(WriteLedger, AWriteDoneAfterAFailedOneIsOutOfOrder) {
  // Completions in any order: in order exactly when no write numbered after the first
  // failure completed.
  std::mt19937 rng(12345);
  for (int round = 0; round < 200; ++round) {
    WriteLedger l;
    const int n = 1 + int(rng() % 40);
    std::vector<uint32_t> seqs;
    for (int i = 0; i < n; ++i) {
      seqs.push_back(l.Next());
      l.Posted();
    }
    const int failed = int(rng() % (n + 1));  // n: none fails
    std::vector<int> order(n);
    for (int i = 0; i < n; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    int last_done = -1;
    for (int i : order) {
      if (i >= failed) {
        l.Failed(seqs[i]);
      } else {
        l.Done(seqs[i]);
        last_done = std::max(last_done, i);
      }
    }
    EXPECT_TRUE(l.AllCompleted());
    EXPECT_EQ(l.AnyFailed(), failed < n);
    EXPECT_EQ(l.InOrder(), last_done < failed) << "round " << round;
  }
  // A later write done after an earlier failed.
  WriteLedger l;
  const uint32_t first = l.Next(), second = l.Next();
  l.Failed(first);
  l.Done(second);
  EXPECT_FALSE(l.InOrder());
}

TEST(WriteLedger, HandsOutEachCursorWordOnce) {
  WriteLedger l;
  std::vector<uint64_t> words(WriteLedger::kWordSlots);
  l.SetWords(words.data());
  std::set<uint32_t> taken;
  for (uint32_t i = 0; i < WriteLedger::kWordSlots; ++i) {
    const uint32_t slot = l.TakeWord();
    ASSERT_GE(slot, 1u);
    ASSERT_LE(slot, WriteLedger::kWordSlots);
    EXPECT_TRUE(taken.insert(slot).second);
    EXPECT_EQ(l.word(slot), &words[slot - 1]);
  }
  EXPECT_EQ(l.TakeWord(), 0u);  // every one in flight
  l.ReleaseWord(17);
  l.ReleaseWord(0);                            // no word's: ignored
  l.ReleaseWord(WriteLedger::kWordSlots + 1);  // the data slot's kind: ignored
  EXPECT_EQ(l.TakeWord(), 17u);
  EXPECT_EQ(l.TakeWord(), 0u);
}

}  // namespace
}  // namespace slip::fabric
