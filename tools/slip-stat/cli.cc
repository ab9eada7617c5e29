#include "tools/slip-stat/cli.h"

#include <charconv>
#include <climits>
#include <cmath>
#include <string_view>
#include <vector>

#include "core/stats.h"

namespace slipstat {
namespace {

constexpr double kMaxWatchS = 3600;

constexpr const char* kUsage =
    R"(usage: slip-stat [-a] [-H] [-j | -r] [-p PID]... [-w [SECONDS]] [--clean]

Lists the TCP connections of every process running under Slipstream on this host, read
from the counters each one publishes in /dev/shm/slipstream-stats.<pid> (reading them
costs the connections nothing). A plain-TCP connection says why it was not accelerated.

  -a, --all            closed connections too (while their slots are not reused)
  -H, --human          byte counts in KiB, MiB, ...
  -j, --json           one JSON object a line:
                       {"connections": [{"pid", "program", "local", "remote", "transport",
                         "reason", "state", "role", "bytes_sent", "bytes_received",
                         "msgs_sent", "msgs_received", "opened_ns", "closed_ns"}, ...],
                        "processes": [{"pid", "exe", "program", "dropped",
                         "reason_counts": {REASON: N, ...}}, ...],
                        "reasons": {REASON: N, ...}, "transports": {T: {"open", "closed"}}}
                       "reason" is "" for an accelerated connection
  -r, --reasons        totals: connections per reason since each process started, summed
                       over the processes ("none": accelerated), and by transport
  -p, --pid PID        only this process; repeat, or give PID,PID,...
  -w, --watch [SECS]   redraw every SECS seconds (default 1) until interrupted; with
                       --json, print one line per refresh instead
      --clean          also remove stats files whose pid now runs another program, and
                       name every file removed (those of exited processes always go)
  -h, --help           this text

Exit status: 0; 2 for a bad command line.
)";

bool ParseWatch(std::string_view text, double* out) {
  double v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v) || v <= 0 ||
      v > kMaxWatchS) {
    return false;
  }
  *out = v;
  return true;
}

void ParsePids(std::string_view text, std::vector<pid_t>* out) {
  while (true) {
    size_t comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    int pid = 0;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), pid);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || pid <= 0) {
      throw UsageError("bad pid '" + std::string(item) + "'");
    }
    out->push_back(pid);
    if (comma == std::string_view::npos) return;
    text.remove_prefix(comma + 1);
  }
}

// One argument: "--name=value" and "-xVALUE" carry their value; "--name", "-x" do not.
struct Arg {
  std::string_view text;
  std::string_view name;
  std::string_view value;
  bool has_value = false;
};

Arg Split(std::string_view text) {
  if (text.starts_with("--")) {
    size_t eq = text.find('=');
    if (eq != std::string_view::npos) return {text, text.substr(0, eq), text.substr(eq + 1), true};
  } else if (text.starts_with("-") && text.size() > 2) {
    return {text, text.substr(0, 2), text.substr(2), true};
  }
  return {text, text, {}, false};
}

// Walks the arguments; each option is one call of Flag, Valued or OptionalValue.
class Args {
 public:
  Args(int argc, char** argv) : args_(argv + 1, argv + argc) {}

  bool Next() {
    if (++i_ >= args_.size()) return false;
    a_ = Split(args_[i_]);
    return true;
  }

  bool Flag(std::string_view short_name, std::string_view long_name) {
    if (!Is(short_name, long_name)) return false;
    if (a_.has_value) {
      throw UsageError(a_.name.starts_with("--") ? std::string(a_.name) + " takes no value"
                                                 : "unknown option '" + std::string(a_.text) + "'");
    }
    return true;
  }

  // "-p 12", "-p12", "--pid 12", "--pid=12".
  bool Valued(std::string_view short_name, std::string_view long_name, std::string_view* value) {
    if (!Is(short_name, long_name)) return false;
    if (!a_.has_value && i_ + 1 >= args_.size()) {
      throw UsageError(std::string(a_.name) + " needs a value");
    }
    *value = a_.has_value ? a_.value : args_[++i_];
    return true;
  }

  // As Valued, but the value may be left out: a next argument that is an option is not
  // taken for it (slip-stat has no positional arguments to confuse it with).
  bool OptionalValue(std::string_view short_name, std::string_view long_name,
                     std::string_view* value) {
    if (!Is(short_name, long_name)) return false;
    if (a_.has_value && a_.value.empty()) {
      throw UsageError(std::string(a_.name) + "= needs a value");
    } else if (a_.has_value) {
      *value = a_.value;
    } else if (i_ + 1 < args_.size() && !args_[i_ + 1].starts_with("-")) {
      *value = args_[++i_];
    }
    return true;
  }

  [[noreturn]] void Unknown() const {
    throw UsageError((a_.text.starts_with("-") ? "unknown option '" : "unexpected argument '") +
                     std::string(a_.text) + "'");
  }

 private:
  bool Is(std::string_view short_name, std::string_view long_name) const {
    return a_.name == long_name || (!short_name.empty() && a_.name == short_name);
  }

  std::vector<std::string_view> args_;
  size_t i_ = static_cast<size_t>(-1);
  Arg a_;
};

}  // namespace

Options ParseCommandLine(int argc, char** argv) {
  Options o;
  Args args(argc, argv);
  std::string_view value;
  while (args.Next()) {
    if (args.Flag("-h", "--help")) {
      o.help = true;
    } else if (args.Flag("-a", "--all")) {
      o.view.all = true;
    } else if (args.Flag("-H", "--human")) {
      o.view.human = true;
    } else if (args.Flag("-j", "--json")) {
      o.json = true;
    } else if (args.Flag("-r", "--reasons")) {
      o.reasons = true;
    } else if (args.Flag("", "--clean")) {
      o.scan.clean = true;
    } else if (args.Valued("-p", "--pid", &value)) {
      ParsePids(value, &o.scan.pids);
    } else if (value = {}; args.OptionalValue("-w", "--watch", &value)) {
      o.watch_s = kDefaultWatchS;
      if (!value.empty() && !ParseWatch(value, &o.watch_s)) {
        throw UsageError("bad refresh period '" + std::string(value) +
                         "': seconds, above 0 and at most " +
                         std::to_string(static_cast<int>(kMaxWatchS)));
      }
    } else {
      args.Unknown();
    }
  }
  if (o.json && o.reasons) {
    throw UsageError("--json and --reasons do not go together (the JSON holds the reasons)");
  }
  return o;
}

std::string Usage() {
  std::string text = kUsage, line = "\nReasons:";
  for (int i = 0; i < static_cast<int>(slip::Reason::kCount); ++i) {
    std::string name = slip::ReasonName(static_cast<slip::Reason>(i));
    if (line.size() + name.size() > 88) {
      text += line + "\n";
      line = "        ";
    }
    line += " " + name;
  }
  return text + line + "\n";
}

}  // namespace slipstat
