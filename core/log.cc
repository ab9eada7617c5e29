#include "core/log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/sys.h"
#include "core/trusted_path.h"

namespace slip {
namespace {

// Constant-initialised: no static constructor runs in the host program.
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
std::atomic<int> g_fd{STDERR_FILENO};          // where lines go now
int g_file_fd = -1;                            // our own log file descriptor, kept across re-inits
std::atomic<uint64_t (*)()> g_clock{nullptr};  // the rate limit's clock; tests only
std::atomic<LogSink> g_sink{nullptr};          // a face's own logger (the NCCL plugin's)

constexpr size_t kLineMax = 1024;

const char* LevelName(LogLevel level) {
  static constexpr const char* kNames[] = {"error", "warn", "info", "debug", "trace"};
  auto i = static_cast<size_t>(level);
  return i < std::size(kNames) ? kNames[i] : "?";
}

// Formats "slipstream[pid]: <label: >message< (N similar messages suppressed)>\n" into a
// stack buffer and writes it with one write(2), so lines from concurrent threads never
// interleave; the suppression count is kept when a long message is cut. errno is
// preserved: callers log on paths whose errno the application is about to read. A line
// the file size limit would cut is not written at all (sys::WriteFitting).
void Emit(int fd, LogLevel level, const char* label, uint64_t suppressed, const char* fmt,
          va_list args) {
  int saved_errno = errno;
  char tail[64];
  int t = suppressed == 0
              ? 0
              : snprintf(tail, sizeof(tail), " (%llu similar message%s suppressed)",
                         static_cast<unsigned long long>(suppressed), suppressed == 1 ? "" : "s");
  const size_t tail_len = t > 0 ? std::min(static_cast<size_t>(t), sizeof(tail) - 1) : 0;
  char line[kLineMax];
  const size_t room = sizeof(line) - 1 - tail_len;  // for prefix and message; then tail, '\n'
  int n = snprintf(line, room + 1, "slipstream[%d]: %s%s", static_cast<int>(getpid()),
                   label ? label : "", label ? ": " : "");
  size_t len = n < 0 ? 0 : std::min(static_cast<size_t>(n), room);
  if (len < room) {
    n = vsnprintf(line + len, room + 1 - len, fmt, args);
    if (n > 0) len = std::min(len + static_cast<size_t>(n), room);  // cut
  }
  while (len > 0 && line[len - 1] == '\n') --len;  // the caller's own newline
  memcpy(line + len, tail, tail_len);
  len += tail_len;
  if (LogSink sink = g_sink.load(std::memory_order_acquire); sink != nullptr && label != nullptr) {
    line[len] = '\0';
    sink(level, line);
    errno = saved_errno;
    return;
  }
  line[len++] = '\n';
  sys::WriteFitting(fd, line, len);
  errno = saved_errno;
}

uint64_t NowMs() {
  uint64_t (*clock)() = g_clock.load(std::memory_order_relaxed);
  return clock != nullptr ? clock() : sys::MonotonicMs();
}

// Whether a line from `site` at `now` passes its rate limit (log.h: LogSite); when it
// does, *suppressed is what the site dropped since its last line. A drop costs a clock
// read, a failed check and an increment: no formatting, no system call.
bool Admit(LogSite* site, uint64_t now, uint64_t* suppressed) {
  constexpr uint64_t kTolerance = (kLogBurst - 1) * kLogIntervalMs;
  uint64_t next = site->next_ms.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t start = std::max(next, now);  // a site idle for long starts from now
    if (start - now > kTolerance) {
      site->suppressed.fetch_add(1, std::memory_order_relaxed);
      return false;
    }
    if (site->next_ms.compare_exchange_weak(next, start + kLogIntervalMs,
                                            std::memory_order_relaxed)) {
      break;
    }
  }
  // Drops counted after this exchange, by other threads, go with the site's next line.
  *suppressed = site->suppressed.exchange(0, std::memory_order_relaxed);
  return true;
}

// Opens the log file among the hidden descriptors, and never on 0-2: a host that closed
// stdio must not later write its own output into our log (or we into its stdout). The file
// is ours or none (core/trusted_path.h): a link another user put there would have us append
// to whatever it names, a FIFO would hold us (before main) or hand every line to its reader.
int OpenLogFile(const char* path, PathVerdict* verdict) {
  int fd = OpenOwnFileForAppend(path, verdict);
  return fd < 0 ? fd : sys::MoveHigh(fd, std::max(STDERR_FILENO + 1, sys::HiddenFdFloor()));
}

// Points our one file descriptor at `path`. A re-init keeps the number other threads may
// be writing to and retargets it with dup3 (atomic): closing it instead could let a late
// writer hit a descriptor the application has just reused.
int AttachFile(const char* path, PathVerdict* verdict) {
  int fd = OpenLogFile(path, verdict);
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
    PathVerdict verdict;
    fd = AttachFile(path, &verdict);
    if (fd < 0) {
      LogAlways("warn: SLIP_LOG_FILE \"%s\" not used: %s; logging to stderr", path,
                verdict.why[0] ? verdict.why : strerror(errno));
      fd = STDERR_FILENO;
    }
  }
  g_fd.store(fd, std::memory_order_relaxed);
  errno = saved_errno;
}

bool LogEnabled(LogLevel level) noexcept {
  return static_cast<int>(level) <= g_level.load(std::memory_order_relaxed);
}

void LogWriteAt(LogSite* site, LogLevel level, const char* fmt, ...) noexcept {
  if (!LogEnabled(level)) return;
  uint64_t suppressed = 0;
  if (level <= LogLevel::kWarn && site != nullptr && !Admit(site, NowMs(), &suppressed)) return;
  va_list args;
  va_start(args, fmt);
  Emit(g_fd.load(std::memory_order_relaxed), level, LevelName(level), suppressed, fmt, args);
  va_end(args);
}

void LogWrite(LogLevel level, const char* fmt, ...) noexcept {
  if (!LogEnabled(level)) return;
  va_list args;
  va_start(args, fmt);
  Emit(g_fd.load(std::memory_order_relaxed), level, LevelName(level), 0, fmt, args);
  va_end(args);
}

void LogAlways(const char* fmt, ...) noexcept {
  va_list args;
  va_start(args, fmt);
  Emit(STDERR_FILENO, LogLevel::kError, nullptr, 0, fmt, args);
  va_end(args);
}

void LogSetSink(LogSink sink) noexcept {
  g_sink.store(sink, std::memory_order_release);
}

void LogSetClockForTest(uint64_t (*now_ms)()) noexcept {
  g_clock.store(now_ms, std::memory_order_relaxed);
}

}  // namespace slip
