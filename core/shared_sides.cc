// SharedSides (core/shared_sides.h): a page of process-shared, robust locks and cursors.
#include "core/shared_sides.h"

#include <sys/mman.h>

#include <cerrno>
#include <new>

#include "core/log.h"

namespace slip {

namespace {

bool InitMutex(pthread_mutex_t* mu) noexcept {
  pthread_mutexattr_t attr;
  if (pthread_mutexattr_init(&attr) != 0) return false;
  const bool ok = pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED) == 0 &&
                  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST) == 0 &&
                  pthread_mutex_init(mu, &attr) == 0;
  pthread_mutexattr_destroy(&attr);
  return ok;
}

}  // namespace

SharedSides* SharedSides::Create(uint64_t produced, uint64_t consumed) noexcept {
  static_assert(sizeof(SharedSides) <= 4096);
  void* page = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return nullptr;
  auto* sides = new (page) SharedSides();
  if (!InitMutex(&sides->tx_) || !InitMutex(&sides->rx_)) {
    munmap(page, 4096);
    return nullptr;
  }
  sides->produced.store(produced, std::memory_order_relaxed);
  sides->consumed.store(consumed, std::memory_order_relaxed);
  return sides;
}

void SharedSides::Destroy(SharedSides* sides) noexcept {
  // (No destructor runs: the other processes' mutexes and cursors live on in the page.)
  if (sides) munmap(sides, 4096);
}

bool SharedSides::Lock(Side side) noexcept {
  pthread_mutex_t* mu = MutexOf(side);
  const int rc = pthread_mutex_lock(mu);
  if (rc == 0) return true;
  if (rc == EOWNERDEAD) {
    // A holder died mid-call: the cursor is the last one it published, consistent.
    SLIP_LOG(kInfo,
             "a process holding a connection died in a %s; going on from its last "
             "published byte",
             side == Side::kTx ? "send" : "receive");
    return pthread_mutex_consistent(mu) == 0 || (pthread_mutex_unlock(mu), false);
  }
  return false;
}

void SharedSides::Unlock(Side side) noexcept {
  pthread_mutex_unlock(MutexOf(side));
}

}  // namespace slip
