// The comparison as a picture: two panels, latency and bandwidth against message size
// (log2 x, log10 y), a line per transport with whiskers from the slowest to the fastest
// run. Plain SVG 1.1 that browsers and converters (rsvg-convert, ImageMagick) read.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/slip-perf/compare.h"

namespace slipperf {
namespace {

constexpr double kWidth = 1000;
constexpr double kHeight = 480;
constexpr double kPlotTop = 92;
constexpr double kPlotHeight = 290;
constexpr double kPlotWidth = 390;
constexpr double kPanelLeft[2] = {80, 580};
constexpr const char* kFont = "font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\"";

struct Point {
  double size;
  double value;
  double low;
  double high;
};

struct Series {
  std::string name;
  std::string color;
  std::vector<Point> points;
};

// The legend's words for the transports compare runs.
std::string Legend(const std::string& transport) {
  if (transport == "tcp") return "tcp: kernel TCP";
  if (transport == "shm") return "shm: the socket API under slip-run";
  if (transport == "shm-native") return "shm-native: the rings, no sockets";
  return transport;
}

std::string ColorOf(const std::string& transport, size_t index) {
  if (transport == "tcp") return "#d62728";
  if (transport == "shm") return "#1f77b4";
  if (transport == "shm-native") return "#2ca02c";
  static const char* const kOthers[] = {"#9467bd", "#ff7f0e", "#8c564b", "#17becf"};
  return kOthers[index % 4];
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

std::string SizeLabel(double size) {
  const auto s = static_cast<uint64_t>(size);
  if (s >= (1u << 20)) return std::to_string(s >> 20) + "M";
  if (s >= (1u << 10)) return std::to_string(s >> 10) + "K";
  return std::to_string(s);
}

std::string Label(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", value);
  return buf;
}

std::vector<Series> SeriesOf(const Comparison& c, const std::string& test) {
  std::vector<Series> all;
  for (size_t i = 0; i < c.transports.size(); ++i) {
    const std::string& t = c.transports[i];
    Series s{t, ColorOf(t, i), {}};
    for (const uint64_t size : c.SizesOf(test)) {
      const CsvRow* row = c.Find(t, test, std::to_string(size));
      const auto median = Number(row, "median");
      if (!median || *median <= 0) continue;  // nothing to place on a log scale
      s.points.push_back({static_cast<double>(size), *median, Number(row, "min").value_or(*median),
                          Number(row, "max").value_or(*median)});
    }
    if (!s.points.empty()) all.push_back(std::move(s));
  }
  return all;
}

std::string StreamsOf(const Comparison& c) {
  const std::string links = c.LinksOf("bw");
  return links == "1" ? "one stream" : links + " streams";
}

class SvgWriter {
 public:
  void Text(double x, double y, const std::string& text, const std::string& attrs) {
    out_ += "<text x=\"" + Num(x) + "\" y=\"" + Num(y) + "\" " + kFont + " " + attrs + ">" +
            Escape(text) + "</text>\n";
  }
  void Line(double x1, double y1, double x2, double y2, const std::string& attrs) {
    out_ += "<line x1=\"" + Num(x1) + "\" y1=\"" + Num(y1) + "\" x2=\"" + Num(x2) + "\" y2=\"" +
            Num(y2) + "\" " + attrs + "/>\n";
  }
  void Raw(const std::string& s) { out_ += s; }
  const std::string& str() const { return out_; }

 private:
  static std::string Escape(const std::string& s) {
    std::string e;
    for (const char ch : s) {
      if (ch == '&') {
        e += "&amp;";
      } else if (ch == '<') {
        e += "&lt;";
      } else if (ch == '>') {
        e += "&gt;";
      } else {
        e += ch;
      }
    }
    return e;
  }
  std::string out_;
};

// One panel: axes, grid, ticks, a line per series.
class Panel {
 public:
  Panel(double left, const std::vector<Series>& series) : left_(left), series_(series) {
    double xmin = INFINITY, xmax = -INFINITY, ymin = INFINITY, ymax = -INFINITY;
    for (const Series& s : series_) {
      for (const Point& p : s.points) {
        xmin = std::min(xmin, std::log2(p.size));
        xmax = std::max(xmax, std::log2(p.size));
        ymin = std::min(ymin, std::log10(std::max(p.low, p.value * 1e-3)));
        ymax = std::max(ymax, std::log10(p.high));
      }
    }
    x0_ = std::floor(xmin);
    x1_ = std::max(std::ceil(xmax), x0_ + 1);
    y0_ = std::floor(ymin);
    y1_ = std::max(std::ceil(ymax), y0_ + 1);
  }

  void Draw(SvgWriter& svg, const std::string& title, const std::string& unit) const {
    svg.Text(left_ + kPlotWidth / 2, kPlotTop - 14, title,
             "font-size=\"15\" font-weight=\"bold\" text-anchor=\"middle\" fill=\"#222\"");
    if (series_.empty()) {
      svg.Text(left_ + kPlotWidth / 2, kPlotTop + kPlotHeight / 2, "not measured",
               "font-size=\"13\" text-anchor=\"middle\" fill=\"#888\"");
      return;
    }
    DrawGrid(svg, unit);
    for (const Series& s : series_) DrawSeries(svg, s);
    svg.Raw("<rect x=\"" + Num(left_) + "\" y=\"" + Num(kPlotTop) + "\" width=\"" +
            Num(kPlotWidth) + "\" height=\"" + Num(kPlotHeight) +
            "\" fill=\"none\" stroke=\"#444\" stroke-width=\"1\"/>\n");
  }

 private:
  double X(double size) const { return left_ + (std::log2(size) - x0_) / (x1_ - x0_) * kPlotWidth; }
  double Y(double value) const {
    return kPlotTop + kPlotHeight - (std::log10(value) - y0_) / (y1_ - y0_) * kPlotHeight;
  }

  void DrawGrid(SvgWriter& svg, const std::string& unit) const {
    const double bottom = kPlotTop + kPlotHeight;
    const int decades = static_cast<int>(y1_ - y0_);
    for (int e = static_cast<int>(y0_); e <= static_cast<int>(y1_); ++e) {
      const double y = Y(std::pow(10.0, e));
      svg.Line(left_, y, left_ + kPlotWidth, y, "stroke=\"#ccc\" stroke-width=\"1\"");
      svg.Text(left_ - 8, y + 4, Label(std::pow(10.0, e)),
               "font-size=\"12\" text-anchor=\"end\" fill=\"#333\"");
      // Minor lines at 2x and 5x while there is room for them, labelled when the axis
      // spans so few decades that it would otherwise show only two or three numbers.
      for (const double m : {2.0, 5.0}) {
        if (e == static_cast<int>(y1_) || decades > 5) break;
        const double value = m * std::pow(10.0, e);
        const double ym = Y(value);
        svg.Line(left_, ym, left_ + kPlotWidth, ym, "stroke=\"#eee\" stroke-width=\"1\"");
        if (decades <= 2) {
          svg.Text(left_ - 8, ym + 4, Label(value),
                   "font-size=\"11\" text-anchor=\"end\" fill=\"#777\"");
        }
      }
    }
    const int span = static_cast<int>(x1_ - x0_);
    const int step = std::max(1, (span + 9) / 10);
    for (int e = static_cast<int>(x0_); e <= static_cast<int>(x1_); ++e) {
      const double x = X(std::pow(2.0, e));
      const bool labelled = (e - static_cast<int>(x0_)) % step == 0;
      svg.Line(x, bottom, x, bottom + (labelled ? 6 : 3), "stroke=\"#444\" stroke-width=\"1\"");
      if (!labelled) continue;
      svg.Line(x, kPlotTop, x, bottom, "stroke=\"#eee\" stroke-width=\"1\"");
      svg.Text(x, bottom + 20, SizeLabel(std::pow(2.0, e)),
               "font-size=\"12\" text-anchor=\"middle\" fill=\"#333\"");
    }
    svg.Text(left_ + kPlotWidth / 2, bottom + 42, "message size (bytes)",
             "font-size=\"13\" text-anchor=\"middle\" fill=\"#222\"");
    const double mid = kPlotTop + kPlotHeight / 2;
    svg.Text(left_ - 52, mid, unit,
             "font-size=\"13\" text-anchor=\"middle\" fill=\"#222\" transform=\"rotate(-90 " +
                 Num(left_ - 52) + " " + Num(mid) + ")\"");
  }

  void DrawSeries(SvgWriter& svg, const Series& s) const {
    const std::string stroke = "stroke=\"" + s.color + "\"";
    std::string points;
    for (const Point& p : s.points) points += Num(X(p.size)) + "," + Num(Y(p.value)) + " ";
    svg.Raw("<polyline points=\"" + points + "\" fill=\"none\" " + stroke +
            " stroke-width=\"2.2\" stroke-linejoin=\"round\"/>\n");
    for (const Point& p : s.points) {
      const double x = X(p.size);
      if (p.high > p.low) {
        const std::string thin = stroke + " stroke-width=\"1.2\" stroke-opacity=\"0.7\"";
        svg.Line(x, Y(p.low), x, Y(p.high), thin);
        svg.Line(x - 3, Y(p.low), x + 3, Y(p.low), thin);
        svg.Line(x - 3, Y(p.high), x + 3, Y(p.high), thin);
      }
      svg.Raw("<circle cx=\"" + Num(x) + "\" cy=\"" + Num(Y(p.value)) + "\" r=\"3.2\" fill=\"" +
              s.color + "\" stroke=\"white\" stroke-width=\"0.8\"/>\n");
    }
  }

  double left_;
  const std::vector<Series>& series_;
  double x0_ = 0, x1_ = 1, y0_ = 0, y1_ = 1;
};

void DrawLegend(SvgWriter& svg, const std::vector<std::string>& names,
                const std::vector<std::string>& colors) {
  // Entries as wide as their words (an estimate: SVG text has no measured width), centred.
  constexpr double kMark = 36;
  constexpr double kGap = 32;
  constexpr double kCharWidth = 7.4;  // 13 px sans-serif, on average
  std::vector<double> widths;
  double total = 0;
  for (const std::string& name : names) {
    widths.push_back(kMark + kCharWidth * static_cast<double>(Legend(name).size()));
    total += widths.back() + (widths.size() > 1 ? kGap : 0);
  }
  double x = (kWidth - total) / 2;
  const double y = kHeight - 22;
  for (size_t i = 0; i < names.size(); x += widths[i] + kGap, ++i) {
    const std::string stroke = "stroke=\"" + colors[i] + "\" stroke-width=\"2.2\"";
    svg.Line(x, y, x + 28, y, stroke);
    svg.Raw("<circle cx=\"" + Num(x + 14) + "\" cy=\"" + Num(y) + "\" r=\"3.2\" fill=\"" +
            colors[i] + "\"/>\n");
    svg.Text(x + kMark, y + 4, Legend(names[i]), "font-size=\"13\" fill=\"#222\"");
  }
}

}  // namespace

void WriteComparisonSvg(const std::string& path, const Comparison& c) {
  const std::vector<Series> latency = SeriesOf(c, "lat");
  const std::vector<Series> bandwidth = SeriesOf(c, "bw");
  SvgWriter svg;
  svg.Raw(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" +
      Num(kWidth) + "\" height=\"" + Num(kHeight) + "\" viewBox=\"0 0 " + Num(kWidth) + " " +
      Num(kHeight) +
      "\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n");
  std::string title = "slip-perf compare:";
  for (size_t i = 0; i < c.transports.size(); ++i) {
    title += (i ? " vs " : " ") + c.transports[i];
  }
  svg.Text(kWidth / 2, 26, title,
           "font-size=\"18\" font-weight=\"bold\" text-anchor=\"middle\" fill=\"#111\"");
  svg.Text(kWidth / 2, 46, c.plot_note, "font-size=\"11\" text-anchor=\"middle\" fill=\"#666\"");
  Panel(kPanelLeft[0], latency).Draw(svg, "Latency: one-way, p50", "microseconds");
  Panel(kPanelLeft[1], bandwidth).Draw(svg, "Bandwidth: " + StreamsOf(c), "Gbit/s");
  std::vector<std::string> colors;
  for (size_t i = 0; i < c.transports.size(); ++i) colors.push_back(ColorOf(c.transports[i], i));
  DrawLegend(svg, c.transports, colors);
  svg.Raw("</svg>\n");
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << svg.str();
}

}  // namespace slipperf
