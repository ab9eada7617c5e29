// What slip-run's stats file says about the connections of a run: each process under
// slip-run appends one JSON line at exit, listing its connections with their transport
// and, for plain TCP, the reason (core/stats.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace slipperf {

struct StatsSummary {
  uint64_t processes = 0;  // exit records
  uint64_t dropped = 0;    // connections a process could not keep a record of
  // "shm", "tcp (peer_not_slipstream)", ... -> connection ends (each process counts its own)
  std::map<std::string, uint64_t> transports;

  // Every recorded connection used `transport` (and there was at least one).
  bool AllUsed(const std::string& transport) const;
  // The one transport every recorded connection used, or "".
  std::string OnlyTransport() const;
  // "24x shm", "2x shm, 1x tcp (peer_not_slipstream)", "no connections recorded".
  std::string Describe() const;
};

// A missing file reads as no records.
StatsSummary ReadStats(const std::string& path);

}  // namespace slipperf
