// Reading back the CSV that slip-perf writes (compare collects its children's results).
#pragma once

#include <map>
#include <string>
#include <vector>

namespace slipperf {

// One data row: column name -> cell.
using CsvRow = std::map<std::string, std::string>;

struct CsvTable {
  std::vector<std::string> columns;  // in the header's order
  std::vector<CsvRow> rows;
};

// Parses RFC 4180 text (quoted cells with "" for a quote, no line breaks inside cells).
// Throws on a row whose cell count differs from the header's.
CsvTable ParseCsv(const std::string& text);

std::string ReadFile(const std::string& path);  // throws when it cannot be read

}  // namespace slipperf
