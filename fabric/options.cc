#include "fabric/options.h"

namespace slip::fabric {

namespace {

// A provider name: what fi_info prints, letters, digits, '_', '-' and the ';' that joins a
// utility provider to its core provider; nothing a log line or a path could trip on.
bool IsProviderName(std::string_view v) noexcept {
  if (v.empty() || v.size() > 63) return false;
  for (char c : v) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '-' || c == ';';
    if (!ok) return false;
  }
  return v.front() != ';' && v.back() != ';';
}

constexpr options::Option<Options> kOptions[] = {
    {"SLIP_FABRIC_PROVIDER", "expected a libfabric provider name (e.g. tcp;ofi_rxm, shm, efa)",
     [](std::string_view v, Options* o, std::string*) {
       if (!IsProviderName(v)) return false;
       o->provider = v;
       return true;
     }},
    {"SLIP_FABRIC_ENDPOINT", "expected auto, msg or rdm",
     [](std::string_view v, Options* o, std::string*) {
       if (v != "auto" && v != "msg" && v != "rdm") return false;
       o->endpoint = v == "msg"   ? EndpointChoice::kConnected
                     : v == "rdm" ? EndpointChoice::kDatagram
                                  : EndpointChoice::kAuto;
       return true;
     }},
    {"SLIP_FABRIC_NOTES", "expected word or inline",
     [](std::string_view v, Options* o, std::string*) {
       if (v != "word" && v != "inline") return false;
       o->word_notes = v == "word";
       return true;
     }},
    {"SLIP_FABRIC_DATA", "expected auto, write or send",
     [](std::string_view v, Options* o, std::string*) {
       if (v != "auto" && v != "write" && v != "send") return false;
       o->data = v == "write"  ? DataChoice::kWrite
                 : v == "send" ? DataChoice::kSend
                               : DataChoice::kAuto;
       return true;
     }},
    // (verbs reads it too: one cache lifetime for every transport that crosses hosts)
    {"SLIP_NEGATIVE_TTL_MS", "expected a decimal integer between 0 and 3600000",
     [](std::string_view v, Options* o, std::string*) {
       return options::ParseRange(v, 0, 3600000, &o->negative_ttl_ms);
     }},
};

}  // namespace

constinit const options::Table<Options> kOptionTable(kOptions);

}  // namespace slip::fabric
