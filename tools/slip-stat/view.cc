#include "tools/slip-stat/view.h"

#include "core/stats.h"
#include "tools/slip-stat/format.h"
#include "tools/slip-stat/tally.h"

namespace slipstat {
namespace {

// Connections the processes' tables could not record.
uint64_t Dropped(const std::vector<Process>& processes) {
  uint64_t dropped = 0;
  for (const Process& p : processes) dropped += p.dropped;
  return dropped;
}

}  // namespace

bool Listed(const Connection& c, const ViewOptions& options) {
  return c.open || options.all;
}

std::vector<uint64_t> ReasonTotals(const std::vector<Process>& processes) {
  std::vector<uint64_t> totals(static_cast<size_t>(slip::Reason::kCount));
  for (const Process& p : processes) {
    for (size_t i = 0; i < p.reason_counts.size() && i < totals.size(); ++i) {
      totals[i] += p.reason_counts[i];
    }
  }
  return totals;
}

std::map<std::string, OpenClosed> CountByTransport(const std::vector<Process>& processes) {
  std::map<std::string, OpenClosed> counts;
  for (const Process& p : processes) {
    for (const Connection& c : p.connections) {
      ++(c.open ? counts[c.transport].open : counts[c.transport].closed);
    }
  }
  return counts;
}

std::string RenderConnections(const std::vector<Process>& processes, const ViewOptions& options) {
  TextTable table({{"PID", true},
                   {"PROGRAM"},
                   {"LOCAL"},
                   {"REMOTE"},
                   {"TRANSPORT"},
                   {"STATE"},
                   {"BYTES_OUT", true},
                   {"BYTES_IN", true},
                   {"MSGS_OUT", true},
                   {"MSGS_IN", true},
                   {"REASON"}});
  Tally tally;
  for (const Process& p : processes) {
    for (const Connection& c : p.connections) {
      if (!Listed(c, options)) continue;
      tally.Add(c);
      // (fabric names its provider: "fabric/tcp;ofi_rxm")
      const std::string transport =
          c.provider.empty() ? c.transport : c.transport + "/" + c.provider;
      table.AddRow({std::to_string(p.pid), ProgramName(p.exe), c.local, c.remote, transport,
                    c.open ? "open" : "closed", FormatBytes(c.bytes_sent, options.human),
                    FormatBytes(c.bytes_received, options.human), std::to_string(c.msgs_sent),
                    std::to_string(c.msgs_received), c.reason.empty() ? "-" : c.reason});
    }
  }
  std::string out = table.Render();
  out += "\n" + Plural(processes.size(), "process", "processes") + ", " +
         (options.all ? Describe(tally) : Describe(tally, "open connection", "open connections"));
  if (uint64_t dropped = Dropped(processes); dropped > 0) {
    out += "; " + std::to_string(dropped) + " not recorded (tables full)";
  }
  return out + "\n";
}

std::string RenderReasons(const std::vector<Process>& processes) {
  TextTable reasons({{"REASON"}, {"CONNECTIONS", true}});
  std::vector<uint64_t> totals = ReasonTotals(processes);
  for (size_t i = 0; i < totals.size(); ++i) {
    auto reason = static_cast<slip::Reason>(i);
    std::string name = slip::ReasonName(reason);
    if (reason == slip::Reason::kNone) name += " (accelerated)";
    reasons.AddRow({name, std::to_string(totals[i])});
  }
  TextTable transports({{"TRANSPORT"}, {"OPEN", true}, {"CLOSED", true}});
  for (const auto& [name, counts] : CountByTransport(processes)) {
    transports.AddRow({name, std::to_string(counts.open), std::to_string(counts.closed)});
  }
  return reasons.Render() + "\n" + transports.Render() + "\nreasons: connections since each of " +
         Plural(processes.size(), "process", "processes") +
         " started (one that fell back counts under both of its reasons);\n" +
         std::to_string(Dropped(processes)) + " not recorded (tables full)\n";
}

}  // namespace slipstat
