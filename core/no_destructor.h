// NoDestructor<T>: an object built in static storage on first use and never destroyed.
//
// The shim's process-wide state (the fd table's pool, the control thread's set, the netlink
// socket, ...) must outlive exit (threads may still use it while the process ends), and must
// be built without the heap: a `static T* p = new T()` inside a noexcept function turns an
// allocation failure into std::terminate, which kills the host program. Here the storage is
// static, so building the object cannot fail for want of memory (T's own members may still
// allocate later, where the caller can handle it).
//
//   static NoDestructor<State> state;   // inside the accessor
//   return *state;
#pragma once

#include <new>
#include <utility>

namespace slip {

template <typename T>
class NoDestructor {
 public:
  template <typename... Args>
  explicit NoDestructor(Args&&... args) noexcept {
    new (storage_) T(std::forward<Args>(args)...);
  }
  NoDestructor(const NoDestructor&) = delete;
  NoDestructor& operator=(const NoDestructor&) = delete;
  ~NoDestructor() = default;  // deliberately leaves T alone

  T* get() noexcept { return std::launder(reinterpret_cast<T*>(storage_)); }
  T& operator*() noexcept { return *get(); }
  T* operator->() noexcept { return get(); }

 private:
  alignas(T) unsigned char storage_[sizeof(T)];
};

}  // namespace slip
