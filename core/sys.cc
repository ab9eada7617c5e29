#include "core/sys.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>

namespace slip::sys {

namespace {
std::atomic<int> g_hidden_floor{0};
}

int HiddenFdFloor() noexcept {
  return g_hidden_floor.load(std::memory_order_relaxed);
}
void SetHiddenFdFloor(int floor) noexcept {
  g_hidden_floor.store(floor, std::memory_order_relaxed);
}

int MoveHigh(int fd, int floor) noexcept {
  if (floor <= fd) return fd;
  int moved = fcntl(fd, F_DUPFD_CLOEXEC, floor);
  if (moved < 0) {
    // The floor may be out of reach (RLIMIT_NOFILE); keep the low number rather than fail.
    int rc = fcntl(fd, F_SETFD, FD_CLOEXEC);
    (void)rc;
    return fd;
  }
  close(fd);
  return moved;
}

int DupHigh(int fd, int floor) noexcept {
  const int copy = fcntl(fd, F_DUPFD_CLOEXEC, floor);
  return copy >= 0 ? copy : fcntl(fd, F_DUPFD_CLOEXEC, 0);
}

int StartServiceThread(void* (*main)(void*), void* arg, const char* name) noexcept {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);  // inherited by the new thread
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  int rc = pthread_create(&thread, &attr, main, arg);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (rc == 0) pthread_setname_np(thread, name);
  return rc;
}

}  // namespace slip::sys
