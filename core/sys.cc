#include "core/sys.h"

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

}  // namespace slip::sys
