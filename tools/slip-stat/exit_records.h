// The exit records that processes under Slipstream append to SLIP_STATS_FILE, one JSON line
// each (StatsWriteExitRecord in core/stats.h), read back into the model.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tools/slip-stat/model.h"

namespace slipstat {

// One record; false (and *error set) if the line is not one.
bool ParseExitRecord(std::string_view line, Process* out, std::string* error);

struct ExitRecords {
  std::vector<Process> processes;  // in file order
  size_t bad_lines = 0;            // lines that are no record (cut short, or foreign)
  uint64_t unread_bytes = 0;       // past kMaxExitRecordBytes: not read
};

// The most bytes of records read from one file: a file of a thousand processes' records
// is a few MiB, and a file that never ends (a link to /dev/zero, a growing log) must not
// take the reader's memory.
constexpr uint64_t kMaxExitRecordBytes = 64ull << 20;

// The records in `path` from byte `offset` on (what was appended since then), at most
// kMaxExitRecordBytes of them. The file must be this process's own regular file, never a
// link, a FIFO or a device (core/trusted_path.h: processes of ours appended to it, and
// another user may have put something else there). A missing file holds none; a file
// that is not ours, or any error reading it, is returned in *error.
bool ReadExitRecords(const std::string& path, uint64_t offset, ExitRecords* out,
                     std::string* error);

}  // namespace slipstat
