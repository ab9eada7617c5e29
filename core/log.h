// Logging for the control path only; the data path uses counters (stats.h).
//
// Lines go to SLIP_LOG_FILE or stderr as "slipstream[pid]: LEVEL: message".
// Thread safety: SLIP_LOG may be called from any thread; each line is one write(2).
#pragma once

#include <cstdarg>

#include "core/config.h"

namespace slip {

void LogInit(LogLevel level, const char* path) noexcept;  // path may be null or empty: stderr
bool LogEnabled(LogLevel level) noexcept;
void LogWrite(LogLevel level, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

// Writes one line to stderr regardless of level (config errors at start-up).
void LogAlways(const char* fmt, ...) noexcept __attribute__((format(printf, 1, 2)));

}  // namespace slip

#define SLIP_LOG(level, ...)                                  \
  do {                                                        \
    if (::slip::LogEnabled(::slip::LogLevel::level))          \
      ::slip::LogWrite(::slip::LogLevel::level, __VA_ARGS__); \
  } while (0)
