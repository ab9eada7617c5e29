// Logging for the control path only; the data path uses counters (stats.h).
//
// Lines go to SLIP_LOG_FILE or stderr as "slipstream[pid]: LEVEL: message".
// Thread safety: SLIP_LOG may be called from any thread; each line is one write(2).
//
// Rate limit: a broken or hostile peer must not make the shim write thousands of lines into
// the host's stderr or log (one warning per malformed message). Each SLIP_LOG call site at
// error and warn level lets through a burst of kLogBurst lines, then one per kLogIntervalMs;
// the lines it drops are counted, and the next line it lets through ends with
// "(N similar messages suppressed)". Info, debug and trace are not limited: they are asked
// for, and a trace that skipped events would mislead. A line that the file size limit
// (RLIMIT_FSIZE, core/sys.h) would cut is dropped whole.
#pragma once

#include <atomic>
#include <cstdarg>
#include <cstdint>

#include "core/config.h"

namespace slip {

constexpr uint64_t kLogBurst = 10;
constexpr uint64_t kLogIntervalMs = 1000;

// One call site's rate limit, a static in each SLIP_LOG expansion: constant-initialised
// (no static constructor, no guard), lock-free, no allocation. The generic cell rate
// algorithm: `next_ms` is when the site's budget is full again; a line at `now` passes when
// next_ms - now <= (kLogBurst - 1) * kLogIntervalMs and moves next_ms one interval on (from
// now, if it was behind). One compare-and-swap: exact with any number of threads.
struct LogSite {
  std::atomic<uint64_t> next_ms{0};
  std::atomic<uint64_t> suppressed{0};  // dropped since the last line that passed
};

void LogInit(LogLevel level, const char* path) noexcept;  // path may be null or empty: stderr
bool LogEnabled(LogLevel level) noexcept;
// SLIP_LOG's body: the line, unless `site`'s rate limit drops it (error, warn).
void LogWriteAt(LogSite* site, LogLevel level, const char* fmt, ...) noexcept
    __attribute__((format(printf, 3, 4)));
// Not rate-limited: for tests and lines that cannot repeat. Call sites use SLIP_LOG.
void LogWrite(LogLevel level, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

// Writes one line to stderr regardless of level (config errors at start-up).
void LogAlways(const char* fmt, ...) noexcept __attribute__((format(printf, 1, 2)));

// A face whose host program has a logger of its own (NCCL passes one to its plugins) takes
// the lines instead of SLIP_LOG_FILE/stderr: `line` is the whole formatted line, without
// its newline. nullptr restores the file. LogAlways still writes to stderr.
using LogSink = void (*)(LogLevel level, const char* line);
void LogSetSink(LogSink sink) noexcept;

// Tests: the rate limit's clock in milliseconds; nullptr restores CLOCK_MONOTONIC.
void LogSetClockForTest(uint64_t (*now_ms)()) noexcept;

}  // namespace slip

// SLIP_LOG(kWarn, "fmt", ...) with the level's name; SLIP_LOG_AT(level, "fmt", ...) with a
// LogLevel value chosen at run time. Each expansion is its own rate-limited site.
#define SLIP_LOG_AT(level_value, ...)                                    \
  do {                                                                   \
    const ::slip::LogLevel slip_log_level_ = (level_value);              \
    if (::slip::LogEnabled(slip_log_level_)) {                           \
      static constinit ::slip::LogSite slip_log_site_;                   \
      ::slip::LogWriteAt(&slip_log_site_, slip_log_level_, __VA_ARGS__); \
    }                                                                    \
  } while (0)
#define SLIP_LOG(level, ...) SLIP_LOG_AT(::slip::LogLevel::level, __VA_ARGS__)
