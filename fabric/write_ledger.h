// The writes of one stream connection as their completions tell them: how many were posted
// and completed, which cursor words are in flight, and whether a write completed after one
// that failed.
//
// The last matters because ofi_rxm connects again after its connection failed: a write
// posted after one that failed may still land, and a note it carries would then claim
// bytes that never did (StreamConn::WritesLandedInOrder). Writes are numbered as posted
// (the low 32 bits travel in their context, fabric/stream_conn.h write_context); the ledger
// keeps the first number that failed and one past the last that completed.
//
// Thread safety: any thread (senders post, pollers complete).
#pragma once

#include <atomic>
#include <cstdint>

#include "core/sanitizer.h"

namespace slip::fabric {

class WriteLedger {
 public:
  // Cursor words: one per note write in flight (a word must not change before its write
  // has read it), numbered 1..kWordSlots; 0 is none.
  static constexpr uint32_t kWordSlots = 64;

  // The next write's number, low 32 bits (its context's).
  uint32_t Next() noexcept { return uint32_t(next_.fetch_add(1, std::memory_order_relaxed)); }
  void Posted() noexcept { posted_.fetch_add(1, std::memory_order_acq_rel); }
  // The write numbered `seq` (low 32 bits) completed, or failed.
  void Done(uint32_t seq) noexcept {
    const uint64_t done = Whole(seq) + 1;
    uint64_t known = last_done_.load(std::memory_order_acquire);
    while (done > known && !last_done_.compare_exchange_weak(known, done)) {
    }
    completed_.fetch_add(1, std::memory_order_acq_rel);
  }
  void Failed(uint32_t seq) noexcept {
    const uint64_t failed = Whole(seq);
    uint64_t known = first_failed_.load(std::memory_order_acquire);
    while (failed < known && !first_failed_.compare_exchange_weak(known, failed)) {
    }
    completed_.fetch_add(1, std::memory_order_acq_rel);
  }

  uint64_t posted() const noexcept { return posted_.load(std::memory_order_acquire); }
  uint64_t completed() const noexcept { return completed_.load(std::memory_order_acquire); }
  bool AllCompleted() const noexcept { return completed() == posted(); }
  bool AnyFailed() const noexcept {
    return first_failed_.load(std::memory_order_acquire) != ~uint64_t(0);
  }
  // No write completed after one that failed.
  bool InOrder() const noexcept {
    return last_done_.load(std::memory_order_acquire) <=
           first_failed_.load(std::memory_order_acquire);
  }

  // The words (kWordSlots of them, in the send registration), before any is taken.
  void SetWords(uint64_t* words) noexcept { words_ = words; }
  uint64_t* word(uint32_t slot) const noexcept { return &words_[slot - 1]; }
  // A free cursor word (1-based), or 0 when every one is in flight.
  uint32_t TakeWord() noexcept {
    uint64_t busy = words_busy_.load(std::memory_order_acquire);
    while (~busy != 0) {
      const int free = __builtin_ctzll(~busy);
      if (words_busy_.compare_exchange_weak(busy, busy | uint64_t(1) << free,
                                            std::memory_order_acq_rel))
        return uint32_t(free) + 1;
    }
    return 0;
  }
  // Its write completed (any slot number: those that are no word's are ignored). The word
  // is taken again only after its write read it, which libfabric orders after the post by
  // means ThreadSanitizer may not see: it is told (the poster's HappensBefore).
  void ReleaseWord(uint32_t slot) noexcept {
    if (slot < 1 || slot > kWordSlots) return;
    san::HappensAfter(word(slot));
    words_busy_.fetch_and(~(uint64_t(1) << (slot - 1)), std::memory_order_acq_rel);
  }

 private:
  // (Writes in flight are fewer than 2^31 apart: the 32 bits extend from the counter.)
  uint64_t Whole(uint32_t seq) const noexcept {
    const uint64_t next = next_.load(std::memory_order_acquire);
    return next - uint32_t(uint32_t(next) - seq);
  }

  std::atomic<uint64_t> next_{0};
  std::atomic<uint64_t> posted_{0};
  std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> first_failed_{~uint64_t(0)};  // ~0: none
  std::atomic<uint64_t> last_done_{0};                // 0: none
  std::atomic<uint64_t> words_busy_{0};
  uint64_t* words_ = nullptr;
};

}  // namespace slip::fabric
