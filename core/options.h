// Options from the environment: the values' grammar and the one loop that reads a table of
// SLIP_* variables into a settings struct.
//
// Each component lists its own variables once (core's in core/config.cc, a transport's in
// its own options file), with what a value must look like and a parser that fills that
// component's settings. A bad value is reported as one line naming the variable, the value
// and what was expected; the caller decides what happens then (the shim runs plain).
// Nothing here allocates except to build that line and the settings' own strings.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <new>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace slip {

// Looks a variable up; returns nullptr when unset. Lets tests parse a fake environment.
using EnvLookup = const char* (*)(const char* name, void* ctx);
// The process environment (getenv).
const char* ProcessEnv(const char* name, void* ctx) noexcept;

namespace options {

bool IEquals(std::string_view a, std::string_view b) noexcept;
std::string_view Trim(std::string_view s) noexcept;
// Strict decimal: digits only (no sign, space or base prefix), no overflow.
bool ParseU64(std::string_view s, uint64_t* out) noexcept;
bool ParseRange(std::string_view s, uint64_t lo, uint64_t hi, uint32_t* out) noexcept;
// "64K", "1MiB", "2g", "4096": binary multiples, suffix case-insensitive.
bool ParseSize(std::string_view s, uint64_t* out) noexcept;
// 1, true, yes, 0, false, no (any case).
bool ParseBool(std::string_view v, bool* out) noexcept;
// A name of the RDMA or network device kind: letters, digits, '_', '-', '.', 1..63 of them.
bool IsDeviceName(std::string_view v) noexcept;

// Calls item(trimmed, why) for each comma-separated item; an empty item is an error. A
// failing item that gave no reason is reported as a bad item.
template <typename F>
bool ForEachItem(std::string_view list, std::string* why, F item) {
  while (true) {
    size_t comma = list.find(',');
    std::string_view it = Trim(list.substr(0, comma));
    if (it.empty()) {
      *why = "empty item";
      return false;
    }
    if (!item(it, why)) {
      if (why->empty()) *why = "bad item \"" + std::string(it) + "\"";
      return false;
    }
    if (comma == std::string_view::npos) return true;
    list.remove_prefix(comma + 1);
  }
}

// One variable of a component's table: its name, what a value must look like (the end of
// the error line), and the parser that stores a good value into the settings `S`.
template <typename S>
struct Option {
  const char* name;
  const char* expected;
  bool (*parse)(std::string_view value, S* settings, std::string* why);
};

// The error line for a bad value: NAME="value": detail; expected. The value is quoted with
// control characters replaced and long values cut, so that the line stays one line.
std::string BadValue(const char* name, std::string_view value, const std::string& why,
                     const char* expected);

// Reads every variable of `table` that is set into `*settings`, which keeps its defaults
// for the others. False at the first bad value, with *error (when non-null) saying it.
// May throw std::bad_alloc (the caller catches it: config.cc, the transports' options).
template <typename S>
bool ParseTable(std::span<const Option<S>> table, EnvLookup lookup, void* ctx, S* settings,
                std::string* error) {
  for (const Option<S>& opt : table) {
    const char* value = lookup(opt.name, ctx);
    std::string why;
    if (value == nullptr || opt.parse(value, settings, &why)) continue;
    if (error != nullptr) *error = BadValue(opt.name, value, why, opt.expected);
    return false;
  }
  return true;
}

// A transport's variables, as both faces read them: the table and its names (for the list
// of unknown SLIP_* variables). Constant-initialised, so usable during any start-up.
template <typename S>
class Table {
 public:
  static constexpr size_t kMax = 16;
  template <size_t N>
  constexpr explicit Table(const Option<S> (&table)[N]) noexcept : table_(table), count_(N) {
    static_assert(N <= kMax);
    for (size_t i = 0; i < N; ++i) names_[i] = table[i].name;
  }

  // The whole read: ParseTable into fresh settings that replace *out only when every
  // value was good; no exception escapes (out of memory: false, *error empty).
  bool Parse(EnvLookup lookup, void* ctx, S* out, std::string* error) const noexcept {
    if (lookup == nullptr || out == nullptr) return false;
    try {
      S parsed;
      if (!ParseTable<S>(std::span(table_, count_), lookup, ctx, &parsed, error)) return false;
      *out = std::move(parsed);
      return true;
    } catch (const std::bad_alloc&) {
      if (error != nullptr) error->clear();
      return false;
    }
  }
  std::span<const char* const> names() const noexcept { return {names_, count_}; }

 private:
  const Option<S>* table_;
  size_t count_;
  const char* names_[kMax] = {};
};

}  // namespace options
}  // namespace slip
