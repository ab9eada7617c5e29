// RenderJson (view.h): one JSON object a line, so that -w --json is a stream of JSON lines.
#include <string_view>
#include <utility>

#include "core/stats.h"
#include "tools/slip-stat/format.h"
#include "tools/slip-stat/view.h"

namespace slipstat {
namespace {

// One JSON object: the constructor opens it, Field and Nested add members, Close ends it.
class ObjectWriter {
 public:
  explicit ObjectWriter(std::string* out) : out_(out) { *out_ += '{'; }
  void Close() { *out_ += '}'; }

  void Field(std::string_view key, std::string_view value) {
    Key(key);
    slip::AppendJsonString(out_, value.data(), value.size());
  }
  void Field(std::string_view key, uint64_t value) {
    Key(key);
    *out_ += std::to_string(value);
  }
  // For a nested value the caller writes itself.
  std::string* Nested(std::string_view key) {
    Key(key);
    return out_;
  }

 private:
  void Key(std::string_view key) {
    if (!first_) *out_ += ',';
    first_ = false;
    slip::AppendJsonString(out_, key.data(), key.size());
    *out_ += ':';
  }
  std::string* out_;
  bool first_ = true;
};

void AppendConnection(std::string* out, const Process& p, const Connection& c) {
  ObjectWriter o(out);
  o.Field("pid", static_cast<uint64_t>(p.pid));
  o.Field("program", ProgramName(p.exe));
  o.Field("local", c.local);
  o.Field("remote", c.remote);
  o.Field("transport", c.transport);
  if (!c.provider.empty()) o.Field("provider", c.provider);
  o.Field("reason", c.reason);
  o.Field("state", c.open ? "open" : "closed");
  o.Field("role", c.role == 0 ? "client" : c.role == 1 ? "server" : "");
  o.Field("bytes_sent", c.bytes_sent);
  o.Field("bytes_received", c.bytes_received);
  o.Field("msgs_sent", c.msgs_sent);
  o.Field("msgs_received", c.msgs_received);
  o.Field("opened_ns", c.opened_ns);
  o.Field("closed_ns", c.closed_ns);
  o.Close();
}

// {"none":N,"peer_not_slipstream":N,...}: every reason, in enum order.
void AppendReasonCounts(std::string* out, const std::vector<uint64_t>& counts) {
  ObjectWriter o(out);
  for (size_t i = 0; i < counts.size(); ++i) {
    o.Field(slip::ReasonName(static_cast<slip::Reason>(i)), counts[i]);
  }
  o.Close();
}

void AppendProcess(std::string* out, const Process& p) {
  ObjectWriter o(out);
  o.Field("pid", static_cast<uint64_t>(p.pid));
  o.Field("exe", p.exe);
  o.Field("program", ProgramName(p.exe));
  o.Field("dropped", p.dropped);
  AppendReasonCounts(o.Nested("reason_counts"), p.reason_counts);
  o.Close();
}

// {"shm":{"open":N,"closed":N},...}
void AppendTransports(std::string* out, const std::vector<Process>& processes) {
  ObjectWriter o(out);
  for (const auto& [transport, counts] : CountByTransport(processes)) {
    ObjectWriter t(o.Nested(transport));
    t.Field("open", counts.open);
    t.Field("closed", counts.closed);
    t.Close();
  }
  o.Close();
}

// [item, ...] with append(out, item) for each item that `keep` accepts.
template <typename Items, typename Keep, typename Append>
void AppendArray(std::string* out, const Items& items, Keep keep, Append append) {
  char separator = '[';
  for (const auto& item : items) {
    if (!keep(item)) continue;
    *out += separator;
    separator = ',';
    append(out, item);
  }
  *out += separator == '[' ? "[]" : "]";
}

}  // namespace

std::string RenderJson(const std::vector<Process>& processes, const ViewOptions& options) {
  std::string out;
  ObjectWriter top(&out);
  // Connections flattened, each with its process's pid and program.
  std::vector<std::pair<const Process*, const Connection*>> listed;
  for (const Process& p : processes) {
    for (const Connection& c : p.connections) listed.emplace_back(&p, &c);
  }
  AppendArray(
      top.Nested("connections"), listed,
      [&](const auto& pc) { return Listed(*pc.second, options); },
      [](std::string* out, const auto& pc) { AppendConnection(out, *pc.first, *pc.second); });
  AppendArray(
      top.Nested("processes"), processes, [](const Process&) { return true; }, AppendProcess);
  AppendReasonCounts(top.Nested("reasons"), ReasonTotals(processes));
  AppendTransports(top.Nested("transports"), processes);
  top.Close();
  return out + "\n";
}

}  // namespace slipstat
