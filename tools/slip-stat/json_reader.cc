#include "tools/slip-stat/json_reader.h"

#include <charconv>
#include <utility>

namespace slipstat {
namespace {

constexpr int kMaxDepth = 64;  // deeper nesting is no exit record, and would eat the stack

bool IsDigit(char c) {
  return c >= '0' && c <= '9';
}

void AppendUtf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xc0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xe0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    *out += static_cast<char>(0xf0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    *out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

class Parser {
 public:
  explicit Parser(std::string_view text) : s_(text) {}

  bool Document(JsonValue* out, std::string* error) {
    bool ok = Value(out, 0);
    if (ok) {
      SkipSpace();
      ok = pos_ == s_.size() || Fail("text after the value");
    }
    if (!ok && error != nullptr) *error = error_ + " at byte " + std::to_string(pos_);
    return ok;
  }

 private:
  bool Fail(const char* what) {
    if (error_.empty()) error_ = what;
    return false;
  }
  void SkipSpace() {
    while (pos_ < s_.size() &&
           std::string_view(" \t\r\n").find(s_[pos_]) != std::string_view::npos) {
      ++pos_;
    }
  }
  bool Eat(char c) {
    if (pos_ >= s_.size() || s_[pos_] != c) return false;
    ++pos_;
    return true;
  }
  bool Literal(std::string_view word) {
    if (s_.substr(pos_, word.size()) != word) return Fail("unknown literal");
    pos_ += word.size();
    return true;
  }

  bool Value(JsonValue* out, int depth) {
    SkipSpace();
    if (pos_ >= s_.size()) return Fail("unexpected end");
    if (depth > kMaxDepth) return Fail("nested too deeply");
    *out = JsonValue();
    switch (s_[pos_]) {
      case '{':
        out->type = JsonValue::Type::kObject;
        return Object(out, depth);
      case '[':
        out->type = JsonValue::Type::kArray;
        return Array(out, depth);
      case '"':
        out->type = JsonValue::Type::kString;
        return String(&out->text);
      case 't':
        out->type = JsonValue::Type::kBool;
        out->boolean = true;
        return Literal("true");
      case 'f':
        out->type = JsonValue::Type::kBool;
        return Literal("false");
      case 'n':
        return Literal("null");
      default:
        out->type = JsonValue::Type::kNumber;
        return Number(&out->text);
    }
  }

  bool Object(JsonValue* out, int depth) {
    ++pos_;  // '{'
    SkipSpace();
    if (Eat('}')) return true;
    do {
      SkipSpace();
      JsonMember member;
      if (pos_ >= s_.size() || s_[pos_] != '"') return Fail("expected a member name");
      if (!String(&member.key)) return false;
      SkipSpace();
      if (!Eat(':')) return Fail("expected ':'");
      if (!Value(&member.value, depth + 1)) return false;
      out->members.push_back(std::move(member));
      SkipSpace();
    } while (Eat(','));
    return Eat('}') || Fail("expected ',' or '}'");
  }

  bool Array(JsonValue* out, int depth) {
    ++pos_;  // '['
    SkipSpace();
    if (Eat(']')) return true;
    do {
      out->items.emplace_back();
      if (!Value(&out->items.back(), depth + 1)) return false;
      SkipSpace();
    } while (Eat(','));
    return Eat(']') || Fail("expected ',' or ']'");
  }

  bool Hex4(uint32_t* out) {
    if (s_.size() - pos_ < 4) return Fail("short \\u escape");
    auto [end, ec] = std::from_chars(s_.data() + pos_, s_.data() + pos_ + 4, *out, 16);
    if (ec != std::errc() || end != s_.data() + pos_ + 4) return Fail("bad \\u escape");
    pos_ += 4;
    return true;
  }

  // \uXXXX, with a following low surrogate when XXXX is a high one. A lone surrogate
  // (valid JSON, not valid UTF-8) becomes U+FFFD.
  bool Unicode(std::string* out) {
    uint32_t cp;
    if (!Hex4(&cp)) return false;
    if (cp >= 0xd800 && cp <= 0xdbff && s_.substr(pos_, 2) == "\\u") {
      size_t save = pos_;
      pos_ += 2;
      uint32_t low;
      if (!Hex4(&low)) return false;
      if (low >= 0xdc00 && low <= 0xdfff) {
        AppendUtf8(out, 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00));
        return true;
      }
      pos_ = save;  // not a pair: the second escape stands alone
    }
    AppendUtf8(out, cp >= 0xd800 && cp <= 0xdfff ? 0xfffd : cp);
    return true;
  }

  bool String(std::string* out) {
    ++pos_;  // '"'
    while (pos_ < s_.size()) {
      char c = s_[pos_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return Fail("control character in a string");
      if (c != '\\') {
        *out += c;
        continue;
      }
      if (pos_ >= s_.size()) break;
      char e = s_[pos_++];
      static constexpr std::string_view kFrom = "\"\\/bfnrt", kTo = "\"\\/\b\f\n\r\t";
      if (size_t i = kFrom.find(e); i != std::string_view::npos) {
        *out += kTo[i];
      } else if (e != 'u' || !Unicode(out)) {
        return Fail("bad escape");
      }
    }
    return Fail("unterminated string");
  }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  bool Number(std::string* out) {
    size_t start = pos_;
    auto digits = [&] {
      size_t from = pos_;
      while (pos_ < s_.size() && IsDigit(s_[pos_])) ++pos_;
      return pos_ > from;
    };
    Eat('-');
    if (Eat('0')) {
      // no leading zeros
    } else if (!digits()) {
      return Fail("expected a value");
    }
    if (Eat('.') && !digits()) return Fail("bad number");
    if (Eat('e') || Eat('E')) {
      if (!Eat('+')) Eat('-');
      if (!digits()) return Fail("bad number");
    }
    *out = s_.substr(start, pos_ - start);
    return true;
  }

  std::string_view s_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace

const JsonValue* JsonValue::Find(std::string_view key) const {
  for (const JsonMember& m : members) {
    if (m.key == key) return &m.value;
  }
  return nullptr;
}

bool JsonValue::AsUint(uint64_t* out) const {
  if (type != Type::kNumber || text.empty() || !IsDigit(text[0])) return false;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

bool ParseJson(std::string_view text, JsonValue* out, std::string* error) {
  return Parser(text).Document(out, error);
}

}  // namespace slipstat
