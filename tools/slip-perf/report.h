// Results of one slip-perf run and their output formats.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "tools/slip-perf/summary.h"

namespace slipperf {

enum class Format { kTable, kCsv, kJson };

struct Result {
  std::string test;  // "tcp_lat", "tcp_bw", "memcpy"
  uint64_t size = 0;
  uint64_t iters = 0;  // measured round trips, writes or copies
  uint64_t bytes = 0;  // measured payload bytes, one direction
  double seconds = 0;  // measured time
  std::optional<LatencySummary> latency;
  std::optional<double> bytes_per_s;
};

// Names the run in every row: the bench passes "tcp" or "shm".
struct ReportMeta {
  std::string label;
  std::string transport;
};

// table: aligned columns for people; csv: a header row and one row per result, empty cells
// where a value does not apply; json: one object {"label","transport","results":[...]}.
// Bandwidth is in decimal units: Gbit/s = 1e9 bit/s, MB/s = 1e6 B/s, GB/s = 1e9 B/s.
void WriteReport(FILE* out, Format format, const ReportMeta& meta,
                 const std::vector<Result>& results);

// "64 B", "64 KiB", "1 MiB"; sizes that are not whole KiB/MiB/GiB stay in bytes.
std::string HumanSize(uint64_t bytes);

}  // namespace slipperf
