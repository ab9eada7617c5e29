// Enough JSON to read back the exit records that Slipstream appends to SLIP_STATS_FILE
// (core/stats.h): any valid JSON text, numbers kept as written.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace slipstat {

struct JsonMember;

struct JsonValue {
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };
  Type type = Type::kNull;
  bool boolean = false;
  std::string text;                 // kString: decoded (UTF-8); kNumber: as written
  std::vector<JsonValue> items;     // kArray
  std::vector<JsonMember> members;  // kObject, in order

  // The member `key` of an object (the first, if repeated); nullptr if none.
  const JsonValue* Find(std::string_view key) const;
  // An integer number in 0..UINT64_MAX; false for anything else.
  bool AsUint(uint64_t* out) const;
};

struct JsonMember {
  std::string key;
  JsonValue value;
};

// Parses one JSON text (whitespace around it allowed). On failure returns false and says
// what and where in *error.
bool ParseJson(std::string_view text, JsonValue* out, std::string* error);

}  // namespace slipstat
