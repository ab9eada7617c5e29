// slip-stat's outputs from one scan: the connections table, the reasons table, JSON.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tools/slip-stat/model.h"

namespace slipstat {

struct ViewOptions {
  bool all = false;    // closed connections too
  bool human = false;  // byte counts in KiB, MiB, ...
};

// Whether a connection is listed: open ones, and closed ones with `all`.
bool Listed(const Connection& c, const ViewOptions& options);

// The processes' reason counters summed, by slip::Reason.
std::vector<uint64_t> ReasonTotals(const std::vector<Process>& processes);

// Connections in the tables (open and closed, whatever the options) by transport name.
struct OpenClosed {
  uint64_t open = 0;
  uint64_t closed = 0;
};
std::map<std::string, OpenClosed> CountByTransport(const std::vector<Process>& processes);

// One row per listed connection, then a line of totals.
std::string RenderConnections(const std::vector<Process>& processes, const ViewOptions& options);

// Connections opened per reason since each process started (the header counters; they
// outlive reused slots), then the connections in the tables by transport and state.
std::string RenderReasons(const std::vector<Process>& processes);

// One line: {"connections":[...],"processes":[...],"reasons":{...},"transports":{...}}.
// A connection carries the fields of the exit record (pid, local, remote, transport, reason,
// bytes_sent, bytes_received) and more; see the usage text.
std::string RenderJson(const std::vector<Process>& processes, const ViewOptions& options);

}  // namespace slipstat
