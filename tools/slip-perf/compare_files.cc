// The comparison as data: lookups, compare.csv and compare.json.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <stdexcept>

#include "tools/slip-perf/compare.h"
#include "tools/slip-perf/report.h"

namespace slipperf {
namespace {

// Cells that are names, not numbers: quoted in JSON.
bool IsTextColumn(const std::string& column) {
  return column == "transport" || column == "test" || column == "metric";
}

// A numeric cell as JSON: the number as written, or null if it is not a finite number.
std::string JsonNumber(const std::string& cell) {
  char* end = nullptr;
  const double v = std::strtod(cell.c_str(), &end);
  return cell.empty() || *end != '\0' || !std::isfinite(v) ? "null" : cell;
}

std::ofstream OpenForWriting(const std::string& path) {
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  return out;
}

}  // namespace

const CsvRow* Comparison::Find(const std::string& transport, const std::string& test,
                               const std::string& size) const {
  for (const CsvRow& row : rows) {
    if (row.at("transport") == transport && row.at("test") == test && row.at("size") == size) {
      return &row;
    }
  }
  return nullptr;
}

std::vector<uint64_t> Comparison::SizesOf(const std::string& test) const {
  std::vector<uint64_t> sizes;
  for (const CsvRow& row : rows) {
    if (row.at("test") != test) continue;
    const uint64_t size = std::stoull(row.at("size"));
    if (std::find(sizes.begin(), sizes.end(), size) == sizes.end()) sizes.push_back(size);
  }
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

std::string Comparison::LinksOf(const std::string& test) const {
  for (const CsvRow& row : rows) {
    if (row.at("test") == test) return row.at("links");
  }
  return "1";
}

std::optional<double> Number(const CsvRow* row, const std::string& column) {
  if (row == nullptr) return std::nullopt;
  const auto it = row->find(column);
  if (it == row->end() || it->second.empty()) return std::nullopt;
  return std::strtod(it->second.c_str(), nullptr);
}

void WriteComparisonCsv(const std::string& path, const Comparison& c) {
  std::ofstream out = OpenForWriting(path);
  for (size_t i = 0; i < c.columns.size(); ++i) out << (i ? "," : "") << c.columns[i];
  out << '\n';
  for (const CsvRow& row : c.rows) {
    for (size_t i = 0; i < c.columns.size(); ++i) {
      const auto it = row.find(c.columns[i]);
      out << (i ? "," : "") << CsvEscape(it == row.end() ? "" : it->second);
    }
    out << '\n';
  }
}

void WriteComparisonJson(const std::string& path, const Comparison& c) {
  std::ofstream out = OpenForWriting(path);
  out << "{\"tool\":\"slip-perf compare\",\"settings\":" << c.settings_json << ",\"transports\":[";
  for (size_t i = 0; i < c.how_json.size(); ++i) out << (i ? "," : "") << c.how_json[i];
  out << "],\"results\":[";
  for (size_t r = 0; r < c.rows.size(); ++r) {
    out << (r ? ",{" : "{");
    for (size_t i = 0; i < c.columns.size(); ++i) {
      const std::string& column = c.columns[i];
      const auto it = c.rows[r].find(column);
      const std::string cell = it == c.rows[r].end() ? "" : it->second;
      out << (i ? "," : "") << JsonEscape(column) << ':'
          << (IsTextColumn(column) ? JsonEscape(cell) : JsonNumber(cell));
    }
    out << '}';
  }
  out << "],\"warnings\":[";
  for (size_t i = 0; i < c.warnings.size(); ++i) out << (i ? "," : "") << JsonEscape(c.warnings[i]);
  out << "]}\n";
}

}  // namespace slipperf
