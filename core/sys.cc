#include "core/sys.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

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

bool FileSizeAllows(uint64_t end) noexcept {
  rlimit rl{};
  if (getrlimit(RLIMIT_FSIZE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return true;
  return end <= uint64_t(rl.rlim_cur);
}

int MoveAbove(int fd, int floor) noexcept {
  if (fd < 0 || floor <= fd) return fd;
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, floor);
  const int err = errno;
  close(fd);
  if (moved < 0) errno = err == EINVAL ? EMFILE : err;  // EINVAL: the floor is past the limit
  return moved;
}

int DupAbove(int fd, int floor) noexcept {
  const int copy = fcntl(fd, F_DUPFD_CLOEXEC, floor);
  if (copy < 0 && errno == EINVAL) errno = EMFILE;
  return copy;
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
