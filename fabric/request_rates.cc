#include "fabric/request_rates.h"

#include <sys/random.h>

#include <cstring>
#include <new>

namespace slip::fabric {

namespace {

wire::Endpoint AddressOf(const wire::Endpoint& e) noexcept {
  wire::Endpoint a;
  a.family = e.family;
  std::memcpy(a.addr, e.addr, sizeof(a.addr));
  return a;
}

}  // namespace

bool RequestRates::Init() noexcept {
  uint64_t key[2];
  if (getrandom(key, sizeof(key), 0) != ssize_t(sizeof(key))) return false;
  hash_.SetKey(key[0], key[1]);
  sources_.reset(new (std::nothrow) Source[kSources]);
  return sources_ != nullptr;
}

RequestRates::Source* RequestRates::FindLocked(const wire::Endpoint& address, bool add,
                                               uint64_t now_us) noexcept {
  uint8_t bytes[17];
  bytes[0] = address.family;
  std::memcpy(bytes + 1, address.addr, 16);
  Source* set = &sources_[(hash_(bytes, sizeof(bytes)) % (kSources / kWays)) * kWays];
  Source* oldest = set;
  for (size_t w = 0; w < kWays; ++w) {
    if (set[w].address.family != 0 && set[w].address == address) return &set[w];
    if (set[w].seen_us < oldest->seen_us) oldest = &set[w];
  }
  if (!add) return nullptr;
  *oldest = Source{};
  oldest->address = address;
  oldest->seen_us = now_us;
  return oldest;
}

bool RequestRates::Admit(TokenBucket* listener, const wire::Endpoint& source,
                         uint64_t now_us) noexcept {
  const wire::Endpoint address = AddressOf(source);
  std::lock_guard<std::mutex> lock(mu_);
  Source* s = FindLocked(address, /*add=*/true, now_us);
  s->seen_us = now_us;
  bool answered = false;
  if (s->bucket.Take(now_us)) {
    const bool quiet = s->bucket.Quiet(now_us);
    answered = (listener->Take(now_us) || quiet) && process_.Take(now_us);
  }
  if (!answered) s->dropped_ms = now_us / 1000;
  return answered;
}

void RequestRates::Refund(TokenBucket* listener, const wire::Endpoint& source) noexcept {
  const wire::Endpoint address = AddressOf(source);
  std::lock_guard<std::mutex> lock(mu_);
  if (Source* s = FindLocked(address, /*add=*/false, 0)) s->bucket.Give();
  listener->Give();
  process_.Give();
}

bool RequestRates::MayRefuse(uint64_t now_us) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  return refuse_.Take(now_us);
}

bool RequestRates::DroppedLately(const wire::Endpoint& source, uint64_t now_ms) noexcept {
  const wire::Endpoint address = AddressOf(source);
  std::lock_guard<std::mutex> lock(mu_);
  const Source* s = FindLocked(address, /*add=*/false, 0);
  return s && s->dropped_ms != 0 && now_ms < s->dropped_ms + kDroppedMemoryMs;
}

}  // namespace slip::fabric
