#include "core/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/sys.h"

namespace slip {
namespace {

// Constant-initialised: no static constructor runs in the host program.
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
std::atomic<int> g_fd{STDERR_FILENO};  // where lines go now
int g_file_fd = -1;                    // our own log file descriptor, kept across re-inits

constexpr size_t kLineMax = 1024;

const char* LevelName(LogLevel level) {
  static constexpr const char* kNames[] = {"error", "warn", "info", "debug", "trace"};
  auto i = static_cast<size_t>(level);
  return i < std::size(kNames) ? kNames[i] : "?";
}

// Formats "slipstream[pid]: <label: >message\n" into a stack buffer and writes it with one
// write(2), so lines from concurrent threads never interleave. errno is preserved: callers
// log on paths whose errno the application is about to read.
void Emit(int fd, const char* label, const char* fmt, va_list args) {
  int saved_errno = errno;
  char line[kLineMax];
  int n = snprintf(line, sizeof(line), "slipstream[%d]: %s%s", static_cast<int>(getpid()),
                   label ? label : "", label ? ": " : "");
  size_t len = n < 0 ? 0 : static_cast<size_t>(n);
  if (len < sizeof(line)) {
    n = vsnprintf(line + len, sizeof(line) - len, fmt, args);
    if (n > 0) len += static_cast<size_t>(n);
  }
  len = std::min(len, sizeof(line) - 1);           // cut, keeping room for '\n'
  while (len > 0 && line[len - 1] == '\n') --len;  // the caller's own newline
  line[len++] = '\n';
  for (size_t off = 0; off < len;) {
    ssize_t w = sys::write(fd, line + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    off += static_cast<size_t>(w);
  }
  errno = saved_errno;
}

// Opens the log file among the hidden descriptors, and never on 0-2: a host that closed
// stdio must not later write its own output into our log (or we into its stdout).
int OpenLogFile(const char* path) {
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  return fd < 0 ? fd : sys::MoveHigh(fd, std::max(STDERR_FILENO + 1, sys::HiddenFdFloor()));
}

// Points our one file descriptor at `path`. A re-init keeps the number other threads may
// be writing to and retargets it with dup3 (atomic): closing it instead could let a late
// writer hit a descriptor the application has just reused.
int AttachFile(const char* path) {
  int fd = OpenLogFile(path);
  if (fd >= 0 && g_file_fd >= 0 && sys::dup3(fd, g_file_fd, O_CLOEXEC) >= 0) {
    sys::close(fd);
    return g_file_fd;
  }
  if (fd >= 0) g_file_fd = fd;
  return fd;
}

}  // namespace

void LogInit(LogLevel level, const char* path) noexcept {
  int saved_errno = errno;
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
  int fd = STDERR_FILENO;
  if (path != nullptr && path[0] != '\0') {
    fd = AttachFile(path);
    if (fd < 0) {
      LogAlways("warn: cannot open SLIP_LOG_FILE \"%s\": %s; logging to stderr", path,
                strerror(errno));
      fd = STDERR_FILENO;
    }
  }
  g_fd.store(fd, std::memory_order_relaxed);
  errno = saved_errno;
}

bool LogEnabled(LogLevel level) noexcept {
  return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed);
}

void LogWrite(LogLevel level, const char* fmt, ...) noexcept {
  if (!LogEnabled(level)) return;
  va_list args;
  va_start(args, fmt);
  Emit(g_fd.load(std::memory_order_relaxed), LevelName(level), fmt, args);
  va_end(args);
}

void LogAlways(const char* fmt, ...) noexcept {
  va_list args;
  va_start(args, fmt);
  Emit(STDERR_FILENO, nullptr, fmt, args);
  va_end(args);
}

}  // namespace slip
