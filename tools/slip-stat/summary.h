// What slip-run --summary prints once its command has exited: for the processes that ran
// under Slipstream, their connections by transport and fallback reason, and the bytes.
#pragma once

#include <string>
#include <string_view>

#include "tools/slip-stat/exit_records.h"

namespace slipstat {

// A totals line, then one line per process; each line starts with `prefix`.
std::string RenderSummary(const ExitRecords& records, std::string_view prefix);

}  // namespace slipstat
