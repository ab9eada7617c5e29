#include "tools/slip-perf/csv.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace slipperf {
namespace {

std::vector<std::string> SplitCsvLine(const std::string& line) {
  std::vector<std::string> cells(1);
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cells.back() += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cells.back() += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      cells.emplace_back();
    } else {
      cells.back() += c;
    }
  }
  return cells;
}

}  // namespace

CsvTable ParseCsv(const std::string& text) {
  CsvTable table;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::vector<std::string> cells = SplitCsvLine(line);
    if (table.columns.empty()) {
      table.columns = std::move(cells);
      continue;
    }
    if (cells.size() != table.columns.size()) {
      throw std::runtime_error("CSV row with " + std::to_string(cells.size()) +
                               " cells, header has " + std::to_string(table.columns.size()) + ": " +
                               line);
    }
    CsvRow row;
    for (size_t i = 0; i < cells.size(); ++i) row[table.columns[i]] = std::move(cells[i]);
    table.rows.push_back(std::move(row));
  }
  return table;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace slipperf
