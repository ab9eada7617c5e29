// Text for people: byte counts, aligned tables, and strings from files made safe for a
// terminal. Shared by slip-stat and slip-run --summary.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace slipstat {

// "1536" or, when human, "1.5 KiB" (powers of 1024; "512 B" below one KiB).
std::string FormatBytes(uint64_t bytes, bool human);

// "1 process", "2 processes".
std::string Plural(uint64_t n, std::string_view one, std::string_view many);

// Control characters become '?': text from stats files must not drive the terminal.
std::string Printable(std::string_view s);

// The last component of an executable's path.
std::string ProgramName(std::string_view exe);

// Columns separated by two spaces, padded to their widest cell; numbers right-aligned.
class TextTable {
 public:
  struct Column {
    std::string title;
    bool right_aligned = false;
  };
  explicit TextTable(std::vector<Column> columns) : columns_(std::move(columns)) {}

  void AddRow(std::vector<std::string> cells);  // as many cells as columns; made Printable
  std::string Render() const;                   // title line first; no trailing blanks

 private:
  std::vector<Column> columns_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace slipstat
