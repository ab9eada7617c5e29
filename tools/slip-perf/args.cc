#include "tools/slip-perf/args.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace slipperf {

void ParseOptions(const std::vector<std::string_view>& args, const std::vector<Option>& options,
                  const std::function<void(std::string_view)>& positional) {
  for (size_t i = 0; i < args.size(); ++i) {
    std::string_view arg = args[i];
    if (arg.size() < 2 || arg[0] != '-') {
      positional(arg);
      continue;
    }
    std::string_view inline_value;
    bool has_inline = false;
    if (const size_t eq = arg.find('='); arg.starts_with("--") && eq != std::string_view::npos) {
      inline_value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_inline = true;
    }
    const Option* match = nullptr;
    for (const Option& o : options) {
      if (arg == o.name || (!o.alias.empty() && arg == o.alias)) match = &o;
    }
    if (match == nullptr) throw UsageError("unknown option '" + std::string(arg) + "'");
    if (!match->takes_value) {
      if (has_inline) throw UsageError(std::string(arg) + " takes no value");
      match->apply({});
    } else if (has_inline) {
      match->apply(inline_value);
    } else if (i + 1 < args.size()) {
      match->apply(args[++i]);
    } else {
      throw UsageError(std::string(arg) + " needs a value");
    }
  }
}

void Bad(std::string_view what, std::string_view value, std::string_view expected) {
  throw UsageError("bad " + std::string(what) + " '" + std::string(value) + "': expected " +
                   std::string(expected));
}

uint64_t ParseUnsigned(std::string_view what, std::string_view s, uint64_t min, uint64_t max,
                       bool size_suffix) {
  const std::string text(s);
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  const char* expected = size_suffix ? "a byte count like 64, 64K or 1M" : "a whole number";
  if (text.empty() || text[0] == '-' || end == text.c_str() || errno != 0) Bad(what, s, expected);
  uint64_t scale = 1;
  const std::string_view rest(end);
  if (size_suffix && rest.size() == 1) {
    switch (rest[0]) {
      case 'k':
      case 'K':
        scale = 1ull << 10;
        break;
      case 'm':
      case 'M':
        scale = 1ull << 20;
        break;
      case 'g':
      case 'G':
        scale = 1ull << 30;
        break;
      default:
        Bad(what, s, expected);
    }
  } else if (!rest.empty()) {
    Bad(what, s, expected);
  }
  if (v > max / scale || v * scale < min || v * scale > max) {
    Bad(what, s, "a value in " + std::to_string(min) + ".." + std::to_string(max));
  }
  return v * scale;
}

uint64_t ParseDurationNs(std::string_view what, std::string_view s) {
  const std::string text(s);
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !std::isfinite(v) || v <= 0 || v > 86400) {
    Bad(what, s, "seconds, more than 0 and at most 86400");
  }
  return static_cast<uint64_t>(v * 1e9);
}

std::vector<std::string_view> SplitList(std::string_view s) {
  std::vector<std::string_view> items;
  for (;;) {
    const size_t comma = s.find(',');
    items.push_back(s.substr(0, comma));
    if (comma == std::string_view::npos) return items;
    s.remove_prefix(comma + 1);
  }
}

std::vector<uint32_t> ParseSizes(std::string_view s, uint32_t max) {
  constexpr const char* kWhat = "--sizes";
  std::vector<uint32_t> sizes;
  auto add = [&](uint64_t size) {
    if (std::find(sizes.begin(), sizes.end(), size) == sizes.end()) {
      sizes.push_back(static_cast<uint32_t>(size));
    }
  };
  for (const std::string_view item : SplitList(s)) {
    std::vector<std::string_view> parts;
    for (size_t from = 0;;) {
      const size_t colon = item.find(':', from);
      parts.push_back(item.substr(from, colon - from));
      if (colon == std::string_view::npos) break;
      from = colon + 1;
    }
    if (parts.size() == 1) {
      add(ParseUnsigned(kWhat, item, 1, max, true));
      continue;
    }
    if (parts.size() > 3) Bad(kWhat, item, "FIRST:LAST or FIRST:LAST:FACTOR");
    const uint64_t first = ParseUnsigned(kWhat, parts[0], 1, max, true);
    const uint64_t last = ParseUnsigned(kWhat, parts[1], first, max, true);
    const uint64_t factor = parts.size() == 3 ? ParseUnsigned(kWhat, parts[2], 2, 1024, false) : 2;
    for (uint64_t size = first; size <= last; size *= factor) add(size);
  }
  return sizes;
}

}  // namespace slipperf
