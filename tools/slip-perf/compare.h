// slip-perf compare: the results of one sweep run over several transports, side by side,
// and the files they are written to.
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "tools/slip-perf/csv.h"

namespace slipperf {

struct Comparison {
  std::vector<std::string> transports;  // as named in the rows, in column order
  std::vector<std::string> tests;       // "lat", "bw", "rr", "crr", in order
  std::vector<std::string> columns;     // of every row: transport, test, size, ...
  // One row per (transport, test, size), in the children's CSV columns, with `transport`
  // the name above and `test` the kind ("lat"), whatever the child called it.
  std::vector<CsvRow> rows;
  std::string settings;               // one line: what was run
  std::string plot_note;              // a short version of it for the plot
  std::string settings_json;          // the same as a JSON object
  std::vector<std::string> how;       // per transport: how it ran and what it used
  std::vector<std::string> how_json;  // the same, each a JSON object
  std::vector<std::string> warnings;

  const CsvRow* Find(const std::string& transport, const std::string& test,
                     const std::string& size) const;
  // The sizes measured for `test` by any transport, ascending.
  std::vector<uint64_t> SizesOf(const std::string& test) const;
  // How many links (streams, connections) `test` ran with: the same for every row.
  std::string LinksOf(const std::string& test) const;
};

// A numeric cell, or nullopt when empty or absent.
std::optional<double> Number(const CsvRow* row, const std::string& column);

// One table per test: size | each transport | ratios, with the noise across repeats.
void PrintComparison(FILE* out, const Comparison& c);
void WriteComparisonCsv(const std::string& path, const Comparison& c);
void WriteComparisonJson(const std::string& path, const Comparison& c);
// Latency and bandwidth against message size, one line per transport.
void WriteComparisonSvg(const std::string& path, const Comparison& c);

}  // namespace slipperf
