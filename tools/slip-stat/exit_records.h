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
};

// The records in `path` from byte `offset` on (what was appended since then). A missing
// file holds none; any other error reading it is returned in *error.
bool ReadExitRecords(const std::string& path, uint64_t offset, ExitRecords* out,
                     std::string* error);

}  // namespace slipstat
