// Connects in progress between calls, for a message face whose Connect goes one step per
// call (NCCL calls connect again with the same handle until the comm is returned): each is
// kept under its handle's secret, taken out while a call steps it, and put back when it
// must wait. Connects NCCL stopped calling (an aborted communicator) are dropped once well
// past their deadline, rather than hold their resources for the process's life.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <vector>

#include "core/log.h"
#include "core/msg_handle.h"
#include "core/no_destructor.h"
#include "core/sys.h"

namespace slip::msg {

// A connect to `h` failed for `what`: one line naming the transport and the peer.
inline Status ConnectFailed(const char* transport, const AddressHandle& h, Status st,
                            const char* what) noexcept {
  char text[96];
  SLIP_LOG(kWarn, "%s: NCCL connect to %s failed: %s", transport,
           AddressText(h.address, text, sizeof(text)), what);
  return st;
}

// T has `AddressHandle handle` and `uint64_t deadline_ms` (CLOCK_MONOTONIC).
template <typename T>
class PendingConnects {
 public:
  static constexpr uint64_t kAbandonedMs = 10000;

  // The process's table of T's connects (never destroyed: connects may run during exit).
  static PendingConnects& Process() noexcept {
    static NoDestructor<PendingConnects> connects;
    return *connects;
  }

  // One call of a face's Connect for handle `h`: a new connect goes through `begin(T*)`,
  // a kept one through `step(T*)`; each returns kAgain to be called again (the connect is
  // kept), anything else to end it (done or failed: it goes).
  template <typename Begin, typename Step>
  Status Advance(const AddressHandle& h, Begin begin, Step step) noexcept {
    std::unique_ptr<T> c = Take(h.secret);
    Status st;
    if (!c) {
      c.reset(new (std::nothrow) T());
      if (!c) return Status::kSystem;
      c->handle = h;
      st = begin(c.get());
    } else {
      st = step(c.get());
    }
    if (st != Status::kAgain) return st;
    return Put(h.secret, std::move(c)) ? Status::kAgain : Status::kSystem;
  }

  // The connect kept under `secret`, or null (a new one). Drops abandoned ones.
  std::unique_ptr<T> Take(const uint8_t secret[kSecretBytes]) noexcept {
    std::vector<std::unique_ptr<T>> abandoned;  // go when we return, unlocked
    std::unique_ptr<T> found;
    std::lock_guard lock(mu_);
    auto it = pending_.find(Key(secret));
    if (it != pending_.end()) {
      found = std::move(it->second);
      pending_.erase(it);
    }
    const uint64_t now = sys::MonotonicMs();
    for (auto at = pending_.begin(); at != pending_.end();) {
      if (now > at->second->deadline_ms + kAbandonedMs) {
        try {
          abandoned.push_back(std::move(at->second));
        } catch (...) {
        }
        at = pending_.erase(at);
      } else {
        ++at;
      }
    }
    return found;
  }

  // Keeps `c` until the next call. False when it cannot (out of memory: `c` goes).
  bool Put(const uint8_t secret[kSecretBytes], std::unique_ptr<T> c) noexcept {
    std::lock_guard lock(mu_);
    try {
      pending_.emplace(Key(secret), std::move(c));
    } catch (...) {
      return false;
    }
    return true;
  }

 private:
  using SecretKey = std::array<uint8_t, kSecretBytes>;
  static SecretKey Key(const uint8_t secret[kSecretBytes]) noexcept {
    SecretKey key;
    std::memcpy(key.data(), secret, key.size());
    return key;
  }

  std::mutex mu_;
  std::map<SecretKey, std::unique_ptr<T>> pending_;
};

}  // namespace slip::msg
