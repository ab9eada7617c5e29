// A mutex that the fork handlers hold across fork(), so that a child never inherits it
// held by a thread it does not have (the child's first call would wait forever).
//
// Thread safety: as std::mutex; ForkPrepare in the parent before fork, ForkParent or
// ForkChild after it, from the fork handlers only.
#pragma once

#include <mutex>

namespace slip {

class ForkSafeMutex {
 public:
  void lock() noexcept { mu_.lock(); }
  void unlock() noexcept { mu_.unlock(); }

  void ForkPrepare() noexcept { mu_.lock(); }
  void ForkParent() noexcept { mu_.unlock(); }
  void ForkChild() noexcept { mu_.unlock(); }

 private:
  std::mutex mu_;
};

}  // namespace slip
