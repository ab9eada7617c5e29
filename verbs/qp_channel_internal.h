// What the files of QpChannel share (verbs/qp_channel*.cc): send-queue constants, the spin
// lock of the data path, and the registry of live channels. Internal to the verbs library.
#pragma once

#include <sched.h>

#include <atomic>
#include <cstdint>
#include <mutex>

namespace slip::verbs {

class QpChannel;

namespace qp_channel_internal {

inline constexpr uint32_t kSendDepth = 256;
inline constexpr uint32_t kInlineWanted = 220;
inline constexpr uint32_t kSignalEvery = 32;  // one signalled WR per this many: reclaims SQ slots
inline constexpr uint64_t kRecvTag = 1ull << 63;

// Spin lock for short, uncontended critical sections on the data path.
class SpinGuard {
 public:
  explicit SpinGuard(std::atomic_flag* flag) noexcept : flag_(flag) {
    while (flag_->test_and_set(std::memory_order_acquire)) sched_yield();
  }
  ~SpinGuard() { flag_->clear(std::memory_order_release); }

 private:
  std::atomic_flag* flag_;
};

// The registry (verbs/qp_channel.cc): a mutex-protected intrusive list of live channels.
extern std::mutex g_registry_mu;
extern QpChannel* g_registry_head;

}  // namespace qp_channel_internal
}  // namespace slip::verbs
