#include "tools/slip-perf/report.h"

#include <algorithm>
#include <cinttypes>

namespace slipperf {
namespace {

// One value of one result, in every format's terms.
struct Field {
  const char* key;         // csv column and json key
  const char* title = "";  // table heading
  std::optional<std::string> value;
  bool is_string = false;  // quoted in json
  std::string human{};     // table text, when it differs from value
  bool in_table = true;    // the table leaves out what only machines need
};

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::vector<Field> FieldsOf(const ReportMeta& meta, const Result& r) {
  const auto& lat = r.latency;
  const auto& bw = r.bytes_per_s;
  auto us = [&](double LatencySummary::*member) -> std::optional<std::string> {
    if (!lat) return std::nullopt;
    return Fixed((*lat).*member, 3);
  };
  auto rate = [&](double scale, int decimals) -> std::optional<std::string> {
    if (!bw) return std::nullopt;
    return Fixed(*bw * scale, decimals);
  };
  return {
      {.key = "label", .title = "label", .value = meta.label, .is_string = true},
      {.key = "transport", .value = meta.transport, .is_string = true, .in_table = false},
      {.key = "test", .title = "test", .value = r.test, .is_string = true},
      {.key = "size", .title = "size", .value = std::to_string(r.size), .human = HumanSize(r.size)},
      {.key = "iters", .title = "iters", .value = std::to_string(r.iters)},
      {.key = "seconds", .title = "seconds", .value = Fixed(r.seconds, 3)},
      {.key = "bytes", .value = std::to_string(r.bytes), .in_table = false},
      {.key = "mean_us", .title = "mean us", .value = us(&LatencySummary::mean_us)},
      {.key = "p50_us", .title = "p50 us", .value = us(&LatencySummary::p50_us)},
      {.key = "p99_us", .title = "p99 us", .value = us(&LatencySummary::p99_us)},
      {.key = "p999_us", .title = "p99.9 us", .value = us(&LatencySummary::p999_us)},
      {.key = "gbit_s", .title = "Gbit/s", .value = rate(8e-9, 3)},
      {.key = "mb_s", .title = "MB/s", .value = rate(1e-6, 1)},
      {.key = "gb_s", .title = "GB/s", .value = rate(1e-9, 3)},
  };
}

std::string CsvEscape(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

std::string JsonEscape(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

void WriteTable(FILE* out, std::vector<std::vector<Field>> rows) {
  if (rows.empty()) return;
  for (auto& row : rows) std::erase_if(row, [](const Field& f) { return !f.in_table; });
  auto text = [](const Field& f) {
    return !f.value ? std::string("-") : f.human.empty() ? *f.value : f.human;
  };
  std::vector<size_t> width;
  for (const Field& f : rows[0]) width.push_back(std::string(f.title).size());
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], text(row[i]).size());
  }
  // Text columns align left, numbers right.
  auto print_row = [&](const std::vector<Field>& row, bool heading) {
    for (size_t i = 0; i < row.size(); ++i) {
      const std::string s = heading ? row[i].title : text(row[i]);
      const int w = static_cast<int>(width[i]);
      std::fprintf(out, row[i].is_string ? "%-*s" : "%*s", w, s.c_str());
      std::fputs(i + 1 < row.size() ? "  " : "\n", out);
    }
  };
  print_row(rows[0], true);
  for (const auto& row : rows) print_row(row, false);
}

void WriteCsv(FILE* out, const std::vector<std::vector<Field>>& rows) {
  if (rows.empty()) return;
  for (size_t i = 0; i < rows[0].size(); ++i) {
    std::fprintf(out, "%s%s", i ? "," : "", rows[0][i].key);
  }
  std::fputc('\n', out);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      std::fprintf(out, "%s%s", i ? "," : "", CsvEscape(row[i].value.value_or("")).c_str());
    }
    std::fputc('\n', out);
  }
}

void WriteJson(FILE* out, const ReportMeta& meta, const std::vector<std::vector<Field>>& rows) {
  std::fprintf(out, "{\"label\":%s,\"transport\":%s,\"results\":[", JsonEscape(meta.label).c_str(),
               JsonEscape(meta.transport).c_str());
  for (size_t r = 0; r < rows.size(); ++r) {
    std::fputs(r ? ",{" : "{", out);
    bool first = true;
    for (const Field& f : rows[r]) {
      const std::string key = f.key;
      if (key == "label" || key == "transport") continue;  // once, at the top
      const std::string value = !f.value ? "null" : f.is_string ? JsonEscape(*f.value) : *f.value;
      std::fprintf(out, "%s\"%s\":%s", first ? "" : ",", f.key, value.c_str());
      first = false;
    }
    std::fputc('}', out);
  }
  std::fputs("]}\n", out);
}

}  // namespace

std::string HumanSize(uint64_t bytes) {
  static const char* const kUnits[] = {"GiB", "MiB", "KiB"};
  for (int i = 0; i < 3; ++i) {
    const uint64_t unit = uint64_t{1} << (10 * (3 - i));
    if (bytes >= unit && bytes % unit == 0) return std::to_string(bytes / unit) + " " + kUnits[i];
  }
  return std::to_string(bytes) + " B";
}

void WriteReport(FILE* out, Format format, const ReportMeta& meta,
                 const std::vector<Result>& results) {
  std::vector<std::vector<Field>> rows;
  for (const Result& r : results) rows.push_back(FieldsOf(meta, r));
  switch (format) {
    case Format::kTable:
      WriteTable(out, rows);
      break;
    case Format::kCsv:
      WriteCsv(out, rows);
      break;
    case Format::kJson:
      WriteJson(out, meta, rows);
      break;
  }
  std::fflush(out);
}

}  // namespace slipperf
