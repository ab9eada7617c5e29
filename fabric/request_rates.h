// How fast the fabric listeners answer REQs (fabric/stream_listen.cc): answering one costs
// a connection's set-up (rings, registrations, queues: 70-100 us here), and anybody may
// send them as fast as they like (a Python sender, ~50,000 a second).
//
// A REQ is answered only with a token from its source address's bucket (kSourceRate a
// second, kSourceBurst at once) and from its listener's (kListenerRate, kListenerBurst);
// a source whose bucket is at least half full (one that is not flooding) may do without
// the listener's, so that a flood from other addresses, which empties the listener's
// bucket, does not take the answers of the quiet ones; and every answer takes one from the
// process's (kProcessRate, kProcessBurst), the bound on the CPU that answers cost whatever
// the number of sources. A request whose TCP connection accept() takes gives its tokens
// back: a client whose connections are real is never limited by them, only one whose
// requests stay unproven. Beyond the rates, REQs are dropped (a REFUSE goes back while
// kRefuseRate allows, so that a client's burst goes plain at once rather than after its
// REQ's timeout; beyond that, nothing). Sources are remembered in a table of kSources
// entries (replaced least recently seen first): a local user who sends from more loopback
// addresses than that starts each with a full bucket, and is bounded by the listener's
// and the process's buckets only.
//
// Thread safety: any thread (one mutex).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "core/wire.h"
#include "core/keyed_hash.h"

namespace slip::fabric {

class TokenBucket {
 public:
  constexpr TokenBucket(double rate, double burst) noexcept
      : rate_(rate), burst_(burst), tokens_(burst) {}
  // One token, if one is there at `now_us`.
  bool Take(uint64_t now_us) noexcept {
    Refill(now_us);
    if (tokens_ < 1) return false;
    tokens_ -= 1;
    return true;
  }
  void Give() noexcept { tokens_ = tokens_ + 1 > burst_ ? burst_ : tokens_ + 1; }
  // At least half full at `now_us`.
  bool Quiet(uint64_t now_us) noexcept {
    Refill(now_us);
    return tokens_ * 2 >= burst_;
  }
  void Reset() noexcept {
    tokens_ = burst_;
    last_us_ = 0;
  }

 private:
  void Refill(uint64_t now_us) noexcept {
    if (last_us_ != 0 && now_us > last_us_) {
      tokens_ += rate_ * double(now_us - last_us_) / 1e6;
      if (tokens_ > burst_) tokens_ = burst_;
    }
    last_us_ = now_us;
  }
  double rate_, burst_, tokens_;
  uint64_t last_us_ = 0;
};

class RequestRates {
 public:
  static constexpr double kSourceRate = 64, kSourceBurst = 64;
  static constexpr double kListenerRate = 256, kListenerBurst = 128;
  static constexpr double kProcessRate = 1024, kProcessBurst = 256;
  static constexpr double kRefuseRate = 256, kRefuseBurst = 64;
  static constexpr size_t kSources = 4096;  // 4 ways of 1024 sets
  static constexpr uint64_t kDroppedMemoryMs = 30000;

  // A listener's bucket, to pass to Admit and Refund.
  static TokenBucket ListenerBucket() noexcept {
    return TokenBucket(kListenerRate, kListenerBurst);
  }

  bool Init() noexcept;
  // Whether a REQ from `source` to the listener whose bucket is `listener` is answered.
  bool Admit(TokenBucket* listener, const wire::Endpoint& source, uint64_t now_us) noexcept;
  // A request from `source` was proven (accept() took it): its tokens come back.
  void Refund(TokenBucket* listener, const wire::Endpoint& source) noexcept;
  // Whether a REFUSE may be sent for a REQ that was not answered.
  bool MayRefuse(uint64_t now_us) noexcept;
  // Whether `source` had REQs dropped for its rate lately: its plain connections are then
  // counted as kRendezvousBusy, not as from a peer without Slipstream.
  bool DroppedLately(const wire::Endpoint& source, uint64_t now_ms) noexcept;

 private:
  static constexpr size_t kWays = 4;
  struct Source {
    wire::Endpoint address{};  // (port 0; family 0: unused)
    TokenBucket bucket{kSourceRate, kSourceBurst};
    uint64_t seen_us = 0;
    uint64_t dropped_ms = 0;  // 0: never
  };
  // Under mu_: `address`'s entry, made (replacing the least recently seen of its set)
  // where `add`.
  Source* FindLocked(const wire::Endpoint& address, bool add, uint64_t now_us) noexcept;

  std::mutex mu_;
  KeyedHash hash_;
  std::unique_ptr<Source[]> sources_;
  TokenBucket process_{kProcessRate, kProcessBurst};
  TokenBucket refuse_{kRefuseRate, kRefuseBurst};
};

}  // namespace slip::fabric
