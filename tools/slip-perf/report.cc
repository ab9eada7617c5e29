#include "tools/slip-perf/report.h"

#include <algorithm>

namespace slipperf {
namespace {

// One value of one result, in every format's terms.
struct Field {
  const char* key;         // csv column and json key
  const char* title = "";  // table heading
  std::optional<std::string> value;
  bool is_string = false;  // quoted in json
  std::string human{};     // table text, when it differs from value
  bool in_table = true;    // shown in the table when some row says so and has a value
};

std::string Printf(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

std::string Fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::optional<std::string> FixedIf(const std::optional<double>& v, double scale, int decimals) {
  if (!v) return std::nullopt;
  return Fixed(*v * scale, decimals);
}

std::vector<Field> FieldsOf(const ReportMeta& meta, const Result& r) {
  const auto& lat = r.latency;
  auto us = [&](double LatencySummary::*member) -> std::optional<std::string> {
    if (!lat) return std::nullopt;
    return Fixed((*lat).*member, 3);
  };
  const bool repeated = r.spread.repeats > 1;
  // Full precision for machines, four digits for people.
  auto spread = [&](const char* key, double v) {
    return Field{.key = key,
                 .title = key,
                 .value = Printf("%.6g", v),
                 .human = Printf("%.4g", v),
                 .in_table = repeated};
  };
  return {
      {.key = "label", .title = "label", .value = meta.label, .is_string = true},
      {.key = "transport", .value = meta.transport, .is_string = true, .in_table = false},
      {.key = "test", .title = "test", .value = r.test, .is_string = true},
      {.key = "size", .title = "size", .value = std::to_string(r.size), .human = HumanSize(r.size)},
      {.key = "links", .title = "links", .value = std::to_string(r.links), .in_table = r.links > 1},
      {.key = "repeats",
       .title = "repeats",
       .value = std::to_string(r.spread.repeats),
       .in_table = repeated},
      {.key = "iters", .title = "iters", .value = std::to_string(r.iters)},
      {.key = "seconds", .title = "seconds", .value = Fixed(r.seconds, 3)},
      {.key = "bytes", .value = std::to_string(r.bytes), .in_table = false},
      {.key = "mean_us", .title = "mean us", .value = us(&LatencySummary::mean_us)},
      {.key = "p50_us", .title = "p50 us", .value = us(&LatencySummary::p50_us)},
      {.key = "p99_us", .title = "p99 us", .value = us(&LatencySummary::p99_us)},
      {.key = "p999_us", .title = "p99.9 us", .value = us(&LatencySummary::p999_us)},
      {.key = "trans_s", .title = "trans/s", .value = FixedIf(r.trans_per_s, 1, 0)},
      {.key = "gbit_s", .title = "Gbit/s", .value = FixedIf(r.bytes_per_s, 8e-9, 4)},
      {.key = "mb_s", .title = "MB/s", .value = FixedIf(r.bytes_per_s, 1e-6, 1)},
      {.key = "gb_s", .title = "GB/s", .value = FixedIf(r.bytes_per_s, 1e-9, 3)},
      {.key = "cpu_client", .title = "cpu client %", .value = FixedIf(r.cpu_client, 1, 1)},
      {.key = "cpu_server", .title = "cpu server %", .value = FixedIf(r.cpu_server, 1, 1)},
      {.key = "metric",
       .title = "figure",
       .value = FigureName(r.figure),
       .is_string = true,
       .in_table = repeated},
      spread("min", r.spread.min),
      spread("median", r.spread.median),
      spread("max", r.spread.max),
  };
}

void WriteTable(FILE* out, const std::vector<std::vector<Field>>& rows) {
  if (rows.empty()) return;
  auto text = [](const Field& f) {
    return !f.value ? std::string("-") : f.human.empty() ? *f.value : f.human;
  };
  const size_t columns = rows[0].size();
  std::vector<bool> shown(columns, false);
  std::vector<size_t> width(columns, 0);
  for (size_t i = 0; i < columns; ++i) width[i] = std::string(rows[0][i].title).size();
  for (const auto& row : rows) {
    for (size_t i = 0; i < columns; ++i) {
      if (row[i].in_table && row[i].value) shown[i] = true;
      width[i] = std::max(width[i], text(row[i]).size());
    }
  }
  // Text columns align left, numbers right.
  auto print_row = [&](const std::vector<Field>& row, bool heading) {
    const char* separator = "";
    for (size_t i = 0; i < columns; ++i) {
      if (!shown[i]) continue;
      const std::string s = heading ? row[i].title : text(row[i]);
      std::fprintf(out, row[i].is_string ? "%s%-*s" : "%s%*s", separator,
                   static_cast<int>(width[i]), s.c_str());
      separator = "  ";
    }
    std::fputc('\n', out);
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

const char* FigureName(Figure figure) {
  switch (figure) {
    case Figure::kP50Us:
      return "p50_us";
    case Figure::kGbitS:
      return "gbit_s";
    case Figure::kTransS:
      return "trans_s";
  }
  return "?";
}

double FigureValue(const Result& r) {
  switch (r.figure) {
    case Figure::kP50Us:
      return r.latency ? r.latency->p50_us : 0;
    case Figure::kGbitS:
      return r.bytes_per_s.value_or(0) * 8e-9;
    case Figure::kTransS:
      return r.trans_per_s.value_or(0);
  }
  return 0;
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
