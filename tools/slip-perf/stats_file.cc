#include "tools/slip-perf/stats_file.h"

#include <fstream>
#include <vector>

namespace slipperf {
namespace {

// The string value of every "key":"value" in `line`, in order. The records are written by
// core/stats.cc without spaces; escapes cannot occur in transport or reason names.
std::vector<std::string> StringValues(const std::string& line, const std::string& key) {
  std::vector<std::string> values;
  const std::string marker = "\"" + key + "\":\"";
  for (size_t at = line.find(marker); at != std::string::npos; at = line.find(marker, at)) {
    at += marker.size();
    const size_t end = line.find('"', at);
    if (end == std::string::npos) break;
    values.push_back(line.substr(at, end - at));
    at = end;
  }
  return values;
}

uint64_t NumberValue(const std::string& line, const std::string& key) {
  const std::string marker = "\"" + key + "\":";
  const size_t at = line.find(marker);
  return at == std::string::npos ? 0 : std::stoull(line.substr(at + marker.size()));
}

}  // namespace

bool StatsSummary::AllUsed(const std::string& transport) const {
  return transports.size() == 1 && transports.begin()->first == transport;
}

std::string StatsSummary::OnlyTransport() const {
  return transports.size() == 1 ? transports.begin()->first : "";
}

std::string StatsSummary::Describe() const {
  if (transports.empty()) return "no connections recorded";
  std::string text;
  for (const auto& [name, count] : transports) {
    text += (text.empty() ? "" : ", ") + std::to_string(count) + "x " + name;
  }
  if (dropped != 0) text += "; " + std::to_string(dropped) + " more not recorded";
  return text;
}

StatsSummary ReadStats(const std::string& path) {
  StatsSummary summary;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ++summary.processes;
    summary.dropped += NumberValue(line, "dropped");
    const auto transports = StringValues(line, "transport");
    const auto reasons = StringValues(line, "reason");
    for (size_t i = 0; i < transports.size(); ++i) {
      const std::string reason = i < reasons.size() ? reasons[i] : "";
      ++summary.transports[reason.empty() ? transports[i] : transports[i] + " (" + reason + ")"];
    }
  }
  return summary;
}

}  // namespace slipperf
