#include "tools/slip-stat/format.h"

#include <algorithm>
#include <cstdio>

namespace slipstat {
namespace {

// Characters on screen: UTF-8 continuation bytes take no column.
size_t Width(std::string_view s) {
  return static_cast<size_t>(
      std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xc0) != 0x80; }));
}

void Pad(std::string* out, size_t n) {
  out->append(n, ' ');
}

}  // namespace

std::string FormatBytes(uint64_t bytes, bool human) {
  if (!human) return std::to_string(bytes);
  if (bytes < 1024) return std::to_string(bytes) + " B";
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  while (value >= 1024 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  snprintf(text, sizeof(text), "%.1f %s", value, kUnits[unit]);
  return text;
}

std::string Plural(uint64_t n, std::string_view one, std::string_view many) {
  return std::to_string(n) + " " + std::string(n == 1 ? one : many);
}

std::string Printable(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) c = '?';
  }
  return out;
}

std::string ProgramName(std::string_view exe) {
  size_t slash = exe.rfind('/');
  return std::string(slash == std::string_view::npos ? exe : exe.substr(slash + 1));
}

void TextTable::AddRow(std::vector<std::string> cells) {
  cells.resize(columns_.size());
  for (std::string& cell : cells) cell = Printable(cell);
  rows_.push_back(std::move(cells));
}

std::string TextTable::Render() const {
  std::vector<size_t> widths;
  for (const Column& column : columns_) widths.push_back(Width(column.title));
  for (const auto& row : rows_) {
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], Width(row[i]));
  }
  std::string out;
  auto render_line = [&](auto cell_of) {
    std::string line;
    for (size_t i = 0; i < columns_.size(); ++i) {
      std::string_view cell = cell_of(i);
      size_t gap = widths[i] - Width(cell);
      if (i > 0) line += "  ";
      if (columns_[i].right_aligned) Pad(&line, gap);
      line += cell;
      if (!columns_[i].right_aligned) Pad(&line, gap);
    }
    line.erase(line.find_last_not_of(' ') + 1);
    out += line + "\n";
  };
  render_line([&](size_t i) -> std::string_view { return columns_[i].title; });
  for (const auto& row : rows_) render_line([&](size_t i) -> std::string_view { return row[i]; });
  return out;
}

}  // namespace slipstat
