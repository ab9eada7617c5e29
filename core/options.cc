#include "core/options.h"

#include <cstdlib>

namespace slip {

const char* ProcessEnv(const char* name, void*) noexcept {
  return getenv(name);
}

namespace options {

namespace {

char Lower(char c) noexcept {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}
bool IsDigit(char c) noexcept {
  return c >= '0' && c <= '9';
}

}  // namespace

bool IEquals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (Lower(a[i]) != Lower(b[i])) return false;
  }
  return true;
}

std::string_view Trim(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

bool ParseU64(std::string_view s, uint64_t* out) noexcept {
  if (s.empty()) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (!IsDigit(c)) return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool ParseRange(std::string_view s, uint64_t lo, uint64_t hi, uint32_t* out) noexcept {
  uint64_t v;
  if (!ParseU64(s, &v) || v < lo || v > hi) return false;
  *out = static_cast<uint32_t>(v);
  return true;
}

bool ParseSize(std::string_view s, uint64_t* out) noexcept {
  size_t n = 0;
  while (n < s.size() && IsDigit(s[n])) ++n;
  uint64_t v;
  if (!ParseU64(s.substr(0, n), &v)) return false;
  std::string_view suffix = s.substr(n);
  size_t shift = 0;
  if (!suffix.empty()) {
    size_t unit = std::string_view("kmg").find(Lower(suffix[0]));
    if (unit == std::string_view::npos) return false;
    shift = 10 * (unit + 1);
    suffix.remove_prefix(1);
    if (!suffix.empty() && !IEquals(suffix, "b") && !IEquals(suffix, "ib")) return false;
  }
  if (v > (UINT64_MAX >> shift)) return false;
  *out = v << shift;
  return true;
}

bool ParseBool(std::string_view v, bool* out) noexcept {
  static constexpr std::pair<const char*, bool> kWords[] = {
      {"1", true}, {"true", true}, {"yes", true}, {"0", false}, {"false", false}, {"no", false}};
  for (const auto& [word, value] : kWords) {
    if (IEquals(v, word)) {
      *out = value;
      return true;
    }
  }
  return false;
}

bool IsDeviceName(std::string_view v) noexcept {
  if (v.empty() || v.size() > 63) return false;
  for (char ch : v) {
    if (!(IsDigit(ch) || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' ||
          ch == '-' || ch == '.'))
      return false;
  }
  return true;
}

std::string BadValue(const char* name, std::string_view value, const std::string& why,
                     const char* expected) {
  constexpr size_t kMax = 64;
  std::string line = std::string(name) + "=\"";
  for (size_t i = 0; i < value.size() && i < kMax; ++i) {
    unsigned char c = static_cast<unsigned char>(value[i]);
    line += (c < 0x20 || c == 0x7f) ? '?' : value[i];
  }
  line += value.size() > kMax ? "...\"" : "\"";
  return line + ": " + (why.empty() ? "" : why + "; ") + expected;
}

}  // namespace options
}  // namespace slip
