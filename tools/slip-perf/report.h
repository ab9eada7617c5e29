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

// The figure a result is judged by, and compared across repeats and transports.
enum class Figure { kP50Us, kGbitS, kTransS };

// How the main figure varied across the repeats of one measurement.
struct Spread {
  double min = 0;
  double median = 0;
  double max = 0;
  uint32_t repeats = 1;
};

struct Result {
  std::string test;  // as named on the command line: "tcp_lat", "shm_bw", "memcpy"
  uint64_t size = 0;
  uint32_t links = 1;  // data links (streams, connections or connecting threads)
  uint64_t iters = 0;  // measured round trips, writes, transactions or copies, all links
  uint64_t bytes = 0;  // measured payload bytes, one direction
  double seconds = 0;  // measured time
  // lat: one-way (round trip / 2); rr, crr: the whole transaction.
  std::optional<LatencySummary> latency;
  std::optional<double> trans_per_s;  // round trips, transactions or connections a second
  std::optional<double> bytes_per_s;
  std::optional<double> cpu_client;  // % of one core, over the measured interval
  std::optional<double> cpu_server;
  Figure figure = Figure::kGbitS;
  Spread spread;  // of FigureValue() across repeats; a single run has min = median = max
};

const char* FigureName(Figure figure);  // the csv column: "p50_us", "gbit_s", "trans_s"
double FigureValue(const Result& r);

// Names every row of a run: the bench and compare pass "tcp" or "shm".
struct ReportMeta {
  std::string label;
  std::string transport;
};

// table: aligned columns for people (a column empty in every row is left out); csv: a
// header row and one row per result, empty cells where a value does not apply; json: one
// object {"label","transport","results":[...]}.
// Bandwidth is in decimal units: Gbit/s = 1e9 bit/s, MB/s = 1e6 B/s, GB/s = 1e9 B/s.
void WriteReport(FILE* out, Format format, const ReportMeta& meta,
                 const std::vector<Result>& results);

// "64 B", "64 KiB", "1 MiB"; sizes that are not whole KiB/MiB/GiB stay in bytes.
std::string HumanSize(uint64_t bytes);

// Text for JSON and CSV cells.
std::string JsonEscape(const std::string& s);
std::string CsvEscape(const std::string& s);

}  // namespace slipperf
