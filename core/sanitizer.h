// What ThreadSanitizer cannot see for itself, said where it happens.
//
// The library issues its own system calls (core/sys.h), past the sanitizer's interceptors.
// ThreadSanitizer models descriptors as memory, created and closed by the calls it
// intercepts, and orders threads through them: a number we close behind its back and the
// kernel hands out again is, to it, one object written by two threads without order. And
// where one thread hands another an object through the kernel (an epoll registration's
// data, a token on a socket), the kernel orders them, which it cannot know. These calls tell
// it, the way libuv tells it of its own raw close(): they compile to nothing in other
// builds, and only ThreadSanitizer's builds (SLIP_TSAN) define __SANITIZE_THREAD__.
#pragma once

#if defined(__SANITIZE_THREAD__)
extern "C" {
void __sanitizer_syscall_pre_impl_close(long fd);  // NOLINT(bugprone-reserved-identifier)
void __tsan_acquire(void* addr);                   // NOLINT(bugprone-reserved-identifier)
void __tsan_release(void* addr);                   // NOLINT(bugprone-reserved-identifier)
void AnnotateIgnoreReadsBegin(const char* file, int line);
void AnnotateIgnoreReadsEnd(const char* file, int line);
void AnnotateIgnoreWritesBegin(const char* file, int line);
void AnnotateIgnoreWritesEnd(const char* file, int line);
}
#endif

namespace slip::san {

// `fd` is about to be closed by a raw system call (or replaced by a raw dup3 onto it).
inline void FdClosing(int fd) noexcept {
#if defined(__SANITIZE_THREAD__)
  __sanitizer_syscall_pre_impl_close(fd);
#else
  (void)fd;
#endif
}

// Everything this thread did before is ordered before what a thread does after its
// HappensAfter(addr) that follows (through the kernel) this HappensBefore(addr).
inline void HappensBefore(const void* addr) noexcept {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(const_cast<void*>(addr));
#else
  (void)addr;
#endif
}
inline void HappensAfter(const void* addr) noexcept {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(const_cast<void*>(addr));
#else
  (void)addr;
#endif
}

namespace detail {
#if defined(__SANITIZE_THREAD__)
using ::AnnotateIgnoreReadsBegin;
using ::AnnotateIgnoreReadsEnd;
using ::AnnotateIgnoreWritesBegin;
using ::AnnotateIgnoreWritesEnd;
#else
inline void AnnotateIgnoreReadsBegin(const char*, int) noexcept {}
inline void AnnotateIgnoreReadsEnd(const char*, int) noexcept {}
inline void AnnotateIgnoreWritesBegin(const char*, int) noexcept {}
inline void AnnotateIgnoreWritesEnd(const char*, int) noexcept {}
#endif
}  // namespace detail

// A scope in which ThreadSanitizer does not check this thread's reads or writes: the
// Annotate pair it calls at each end (nothing, in other builds). Not trivial, so that a
// scope's object is not an unused variable.
template <void (*kBegin)(const char*, int), void (*kEnd)(const char*, int)>
class IgnoreScope {
 public:
  IgnoreScope() noexcept { kBegin(__FILE__, __LINE__); }
  ~IgnoreScope() { kEnd(__FILE__, __LINE__); }
  IgnoreScope(const IgnoreScope&) = delete;
  IgnoreScope& operator=(const IgnoreScope&) = delete;
};

// For its lifetime, this thread reads memory a peer writes whenever it likes (a registered
// ring where the peer's late writes may still land, carried in by the provider from one of
// our threads): what such a read sees is validated, never trusted, so its race with those
// writes is the design. ThreadSanitizer does not check this thread's reads meanwhile.
using PeerMemoryReads =
    IgnoreScope<detail::AnnotateIgnoreReadsBegin, detail::AnnotateIgnoreReadsEnd>;

// For its lifetime, this thread's writes race with other threads' on purpose: it replaces
// memory (a mapping) under threads that may still write it, whose late writes then land
// in the replacement and are dropped. ThreadSanitizer does not check them, and forgets
// what it knew of the memory a mapping made meanwhile replaces.
using UnorderedWrites =
    IgnoreScope<detail::AnnotateIgnoreWritesBegin, detail::AnnotateIgnoreWritesEnd>;

}  // namespace slip::san
