#include "tools/slip-stat/summary.h"

#include "tools/slip-stat/format.h"
#include "tools/slip-stat/tally.h"

namespace slipstat {

std::string RenderSummary(const ExitRecords& records, std::string_view prefix) {
  std::string lead(prefix);
  Tally total;
  std::string lines;
  for (const Process& p : records.processes) {
    Tally tally;
    tally.Add(p);
    total.Add(p);
    lines += lead + "  pid " + std::to_string(p.pid) + " " + Printable(ProgramName(p.exe)) + ": " +
             Describe(tally);
    if (p.dropped > 0) lines += "; " + std::to_string(p.dropped) + " not recorded (table full)";
    lines += "\n";
  }
  std::string out = lead;
  if (records.processes.empty()) {
    out += "no process opened a TCP connection under Slipstream\n";
  } else {
    out += Plural(records.processes.size(), "process", "processes") + ", " + Describe(total) +
           "\n" + lines;
  }
  if (records.unread_bytes > 0) {
    out += lead + "only the first " + std::to_string(kMaxExitRecordBytes >> 20) +
           " MiB of the stats file read; " + std::to_string(records.unread_bytes) +
           " bytes more not summarized\n";
  }
  if (records.bad_lines > 0) {
    out +=
        lead + Plural(records.bad_lines, "line", "lines") + " of the stats file not understood\n";
  }
  return out;
}

}  // namespace slipstat
