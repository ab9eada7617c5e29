#include "tools/slip-stat/tally.h"

#include "tools/slip-stat/format.h"

namespace slipstat {

void Tally::Add(const Connection& c) {
  ++connections;
  ++transports[c.transport];
  if (!c.reason.empty()) ++reasons[c.reason];
  bytes_sent += c.bytes_sent;
  bytes_received += c.bytes_received;
}

void Tally::Add(const Process& p) {
  for (const Connection& c : p.connections) Add(c);
}

std::string Describe(const Tally& tally, std::string_view one, std::string_view many) {
  std::string text = Plural(tally.connections, one, many);
  const char* separator = ": ";
  for (const auto& [transport, count] : tally.transports) {
    text += separator + std::to_string(count) + " " + Printable(transport);
    separator = ", ";
  }
  if (!tally.reasons.empty()) {
    separator = " (";
    for (const auto& [reason, count] : tally.reasons) {
      text += separator + std::to_string(count) + " " + Printable(reason);
      separator = ", ";
    }
    text += ")";
  }
  if (tally.connections > 0) {
    text += "; " + FormatBytes(tally.bytes_sent, true) + " sent, " +
            FormatBytes(tally.bytes_received, true) + " received";
  }
  return text;
}

}  // namespace slipstat
