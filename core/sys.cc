#include "core/sys.h"

#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstdint>

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

namespace {

int MoveHighMarked(int fd, int floor, bool mark) noexcept {
  if (fd < 0) return fd;
  int moved = fd;
  if (floor > fd) {
    moved = fcntl(fd, F_DUPFD_CLOEXEC, floor);
    if (moved < 0) {
      // The floor may be out of reach (RLIMIT_NOFILE); keep the low number rather than fail.
      int rc = fcntl(fd, F_SETFD, FD_CLOEXEC);
      (void)rc;
      moved = fd;
    } else {
      close(fd);
    }
  }
  if (mark) MarkOwnFd(moved);
  return moved;
}

}  // namespace

int MoveHigh(int fd, int floor) noexcept {
  return MoveHighMarked(fd, floor, true);
}

int MoveLibraryFdHigh(int fd, int floor) noexcept {
  return MoveHighMarked(fd, floor, false);
}

int MoveAbove(int fd, int floor) noexcept {
  if (fd < 0) return fd;
  if (floor <= fd) {
    MarkOwnFd(fd);
    return fd;
  }
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, floor);
  const int err = errno;
  close(fd);
  if (moved < 0) {
    errno = err == EINVAL ? EMFILE : err;  // EINVAL: the floor is past the limit
    return moved;
  }
  MarkOwnFd(moved);
  return moved;
}

void CloseHandedOver(int fd) noexcept {
  if (fd < 0) return;
  linger lg{};
  socklen_t len = sizeof(lg);
  if (sys::getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &len) == 0 && lg.l_onoff && lg.l_linger > 0) {
    const linger off{0, 0};
    sys::setsockopt(fd, SOL_SOCKET, SO_LINGER, &off, sizeof(off));
  }
  sys::close(fd);
}

int DupAbove(int fd, int floor) noexcept {
  const int copy = fcntl(fd, F_DUPFD_CLOEXEC, floor);
  if (copy < 0 && errno == EINVAL) errno = EMFILE;
  if (copy >= 0) MarkOwnFd(copy);
  return copy;
}

int DupHigh(int fd, int floor) noexcept {
  int copy = fcntl(fd, F_DUPFD_CLOEXEC, floor);
  if (copy < 0) copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy >= 0) MarkOwnFd(copy);
  return copy;
}

namespace {

constexpr uint64_t kNoLimit = RLIM64_INFINITY;

// The soft RLIMIT_FSIZE in bytes (kNoLimit when unlimited). Read on every check: the host
// may change it at any time. prlimit64 takes 64-bit limits on every architecture.
uint64_t FileSizeLimit() {
  rlimit64 rl;
  if (::syscall(SYS_prlimit64, 0, RLIMIT_FSIZE, nullptr, &rl) != 0) return kNoLimit;
  return rl.rlim_cur;
}

// generic_write_check_limits: a write of len bytes at pos goes through whole only when
// pos + len <= limit; with pos >= limit (the limit read as signed loff_t) it raises SIGXFSZ.
// Zero-length writes are never checked.
bool WriteFits(uint64_t limit, uint64_t pos, size_t len) {
  if (len == 0 || limit == kNoLimit) return true;
  if (limit > static_cast<uint64_t>(INT64_MAX)) return false;  // negative as loff_t
  return pos <= limit && len <= limit - pos;
}

// The kernel's sigset: 64 signals, whatever the size of glibc's sigset_t.
constexpr size_t kKernelSigsetSize = 8;

// Blocks SIGXFSZ in the calling thread for its lifetime; Raised() marks that a call in
// between failed with EFBIG, and then the SIGXFSZ that the kernel sent with it (to this
// thread only: send_sig to current) is taken back before the mask is restored. A SIGXFSZ
// that was already pending is left alone: it is the host's, not ours. Raw system calls:
// no cancellation points, and async-signal-safe.
class HoldSigxfsz {
 public:
  HoldSigxfsz() noexcept {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGXFSZ);
    blocked_ = ::syscall(SYS_rt_sigprocmask, SIG_BLOCK, &set, &old_, kKernelSigsetSize) == 0;
    was_pending_ = IsPending();
  }
  ~HoldSigxfsz() {
    if (!blocked_) return;  // cannot fail for a valid set; then nothing to take back either
    const int saved_errno = errno;
    if (raised_ && !was_pending_ && IsPending()) {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGXFSZ);
      const timespec zero{};
      ::syscall(SYS_rt_sigtimedwait, &set, nullptr, &zero, kKernelSigsetSize);
    }
    ::syscall(SYS_rt_sigprocmask, SIG_SETMASK, &old_, nullptr, kKernelSigsetSize);
    errno = saved_errno;
  }
  HoldSigxfsz(const HoldSigxfsz&) = delete;
  HoldSigxfsz& operator=(const HoldSigxfsz&) = delete;

  void Raised() noexcept { raised_ = true; }

 private:
  static bool IsPending() {
    sigset_t pending;
    sigemptyset(&pending);
    return ::syscall(SYS_rt_sigpending, &pending, kKernelSigsetSize) == 0 &&
           sigismember(&pending, SIGXFSZ) == 1;
  }

  sigset_t old_;
  bool blocked_ = false;
  bool was_pending_ = false;
  bool raised_ = false;
};

bool WriteAll(int fd, const char* buf, size_t len, HoldSigxfsz* hold) {
  for (size_t off = 0; off < len;) {
    const ssize_t w = write(fd, buf + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EFBIG && hold != nullptr) hold->Raised();
    if (w < 0) return false;
    if (w == 0) {
      errno = EIO;  // nothing written and no error: do not spin
      return false;
    }
    off += static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

bool FileSizeAllows(uint64_t end) noexcept {
  const uint64_t limit = FileSizeLimit();
  return limit == kNoLimit || end <= limit;  // inode_newsize_ok: offset > limit
}

int TruncateFitting(int fd, uint64_t size) noexcept {
  if (size > static_cast<uint64_t>(INT64_MAX)) {
    errno = EINVAL;
    return -1;
  }
  const uint64_t limit = FileSizeLimit();
  if (limit == kNoLimit) {
    return static_cast<int>(::syscall(SYS_ftruncate, fd, static_cast<off_t>(size)));
  }
  if (size > limit) {
    errno = EFBIG;
    return -1;
  }
  // Another thread may lower the limit between the check and the call.
  HoldSigxfsz hold;
  const int rc = static_cast<int>(::syscall(SYS_ftruncate, fd, static_cast<off_t>(size)));
  if (rc != 0 && errno == EFBIG) hold.Raised();
  return rc;
}

bool WriteFitting(int fd, const void* buf, size_t len) noexcept {
  const char* bytes = static_cast<const char*>(buf);
  const uint64_t limit = FileSizeLimit();
  if (limit == kNoLimit) return WriteAll(fd, bytes, len, nullptr);  // the usual case
  struct stat st;
  if (::fstat(fd, &st) != 0) return false;
  if (!S_ISREG(st.st_mode)) return WriteAll(fd, bytes, len, nullptr);
  // Where the kernel will write: the end for O_APPEND, else the file offset.
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0) return false;
  off_t pos = st.st_size;
  if ((flags & O_APPEND) == 0) {
    pos = static_cast<off_t>(::syscall(SYS_lseek, fd, 0, SEEK_CUR));
    if (pos < 0) return false;
  }
  if (!WriteFits(limit, static_cast<uint64_t>(pos), len)) {
    errno = EFBIG;
    return false;
  }
  HoldSigxfsz hold;
  return WriteAll(fd, bytes, len, &hold);
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
