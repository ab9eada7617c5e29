// The comparison for people: one table per test, a column per transport and the ratios
// that matter (each transport against kernel TCP, and the socket API over a transport
// against the transport itself).
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/slip-perf/compare.h"
#include "tools/slip-perf/report.h"

namespace slipperf {
namespace {

constexpr const char* kNativeSuffix = "-native";

bool IsNative(const std::string& transport) {
  return transport.ends_with(kNativeSuffix);
}

constexpr double kMaxPercentNoise = 50;

// Three significant digits, without an exponent.
std::string Short(double v) {
  char buf[32];
  const char* format = v >= 100 ? "%.0f" : v >= 10 ? "%.1f" : v >= 1 ? "%.2f" : "%.3g";
  std::snprintf(buf, sizeof(buf), format, v);
  return buf;
}

std::string Title(const Comparison& c, const std::string& test) {
  const std::string links = c.LinksOf(test);
  if (test == "lat") return "lat: one-way latency, p50 (us), lower is better";
  if (test == "bw") return "bw: bandwidth (Gbit/s) over " + links + " stream(s), higher is better";
  if (test == "rr") return "rr: transactions/s over " + links + " connection(s), higher is better";
  return "crr: connections/s (connect, request, response, close) from " + links +
         " thread(s), higher is better";
}

// A column of a test's table: a transport's figure, or the ratio of two transports.
struct Column {
  std::string title;
  std::string transport;
  std::string over;  // for a ratio: the denominator's transport
};

std::vector<Column> ColumnsOf(const Comparison& c) {
  std::vector<Column> columns;
  const auto has = [&](const std::string& t) {
    return std::find(c.transports.begin(), c.transports.end(), t) != c.transports.end();
  };
  const std::string baseline = has("tcp") ? "tcp" : "";
  for (const std::string& t : c.transports) {
    columns.push_back({t, t, ""});
    if (IsNative(t)) {
      const std::string socket = t.substr(0, t.size() - std::string(kNativeSuffix).size());
      if (has(socket)) columns.push_back({"native/" + socket, t, socket});
    } else if (!baseline.empty() && t != baseline) {
      columns.push_back({t + "/" + baseline, t, baseline});
    }
  }
  return columns;
}

std::string Cell(const Comparison& c, const Column& col, const std::string& test,
                 const std::string& size) {
  const CsvRow* row = c.Find(col.transport, test, size);
  const auto median = Number(row, "median");
  if (!median) return "-";
  if (!col.over.empty()) {
    const auto base = Number(c.Find(col.over, test, size), "median");
    if (!base || *base == 0) return "-";
    return Short(*median / *base) + "x";
  }
  std::string text = Short(*median);
  const auto min = Number(row, "min");
  const auto max = Number(row, "max");
  if (Number(row, "repeats").value_or(1) <= 1 || !min || !max || *median <= 0) return text;
  // Half the range as a percentage, while that reads as noise around the median; beyond
  // it, the runs disagree so much that the range itself says more.
  const double half_range = 50 * (*max - *min) / *median;
  if (half_range > kMaxPercentNoise) return text + " (" + Short(*min) + ".." + Short(*max) + ")";
  char noise[16];
  std::snprintf(noise, sizeof(noise), " ±%.0f%%", half_range);
  return text + noise;
}

void PrintTest(FILE* out, const Comparison& c, const std::string& test) {
  const std::vector<Column> columns = ColumnsOf(c);
  std::vector<std::vector<std::string>> cells;
  std::vector<std::string> heading = {"size"};
  for (const Column& col : columns) heading.push_back(col.title);
  cells.push_back(heading);
  for (const uint64_t size : c.SizesOf(test)) {
    std::vector<std::string> line = {HumanSize(size)};
    for (const Column& col : columns) line.push_back(Cell(c, col, test, std::to_string(size)));
    cells.push_back(line);
  }
  std::vector<size_t> width(heading.size(), 0);
  for (const auto& line : cells) {
    for (size_t i = 0; i < line.size(); ++i) {
      // "±" is two bytes and one column.
      const size_t shown = line[i].size() - (line[i].find("±") != std::string::npos ? 1 : 0);
      width[i] = std::max(width[i], shown);
    }
  }
  std::fprintf(out, "%s\n", Title(c, test).c_str());
  for (const auto& line : cells) {
    for (size_t i = 0; i < line.size(); ++i) {
      const size_t shown = line[i].size() - (line[i].find("±") != std::string::npos ? 1 : 0);
      std::fprintf(out, "  %*s%s", static_cast<int>(width[i] - shown), "", line[i].c_str());
    }
    std::fputc('\n', out);
  }
  std::fputc('\n', out);
}

// "350K", "1.2M": a count, to two or three significant digits.
std::string Count(double n) {
  if (n >= 1e6) return Short(n / 1e6) + "M";
  if (n >= 1e4) return Short(n / 1e3) + "K";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.0f", n);
  return buf;
}

// "tcp 1.2K to 350K": the iterations of the median runs, per transport.
std::string IterationRanges(const Comparison& c) {
  std::string text;
  for (const std::string& t : c.transports) {
    double low = 0, high = 0;
    bool any = false;
    for (const CsvRow& row : c.rows) {
      if (row.at("transport") != t) continue;
      const double iters = Number(&row, "iters").value_or(0);
      low = any ? std::min(low, iters) : iters;
      high = any ? std::max(high, iters) : iters;
      any = true;
    }
    if (any) text += (text.empty() ? "" : ", ") + t + " " + Count(low) + " to " + Count(high);
  }
  return text;
}

}  // namespace

void PrintComparison(FILE* out, const Comparison& c) {
  for (const std::string& test : c.tests) {
    if (!c.SizesOf(test).empty()) PrintTest(out, c, test);
  }
  std::fprintf(out,
               "Each figure is the median run of a point; ± is half the range from the slowest "
               "to the fastest\nrun in %% of the median (the range itself where that exceeds "
               "50%%). Iterations per run:\n%s.\n",
               IterationRanges(c).c_str());
  for (const std::string& how : c.how) std::fprintf(out, "%s\n", how.c_str());
  for (const std::string& w : c.warnings) std::fprintf(out, "WARNING: %s\n", w.c_str());
}

}  // namespace slipperf
