// Command-line parsing pieces: options with values, numbers with size suffixes, durations,
// message-size sweeps, lists. Every error is a UsageError (exit status 2).
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace slipperf {

// Bad command line: main prints the message and the usage on stderr and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// One option of a subcommand: a name, whether it takes a value, what to do with it.
struct Option {
  std::string_view name;   // "--size"
  std::string_view alias;  // "-p" or ""
  bool takes_value;
  std::function<void(std::string_view)> apply;
};

// Walks the arguments: "--name VALUE", "--name=VALUE", "-p VALUE" and positionals.
void ParseOptions(const std::vector<std::string_view>& args, const std::vector<Option>& options,
                  const std::function<void(std::string_view)>& positional);

[[noreturn]] void Bad(std::string_view what, std::string_view value, std::string_view expected);

// A whole number in [min, max]; with `size_suffix`, K, M and G multiply by powers of 1024.
uint64_t ParseUnsigned(std::string_view what, std::string_view s, uint64_t min, uint64_t max,
                       bool size_suffix);

// Seconds (a decimal number, more than 0, at most a day) in nanoseconds.
uint64_t ParseDurationNs(std::string_view what, std::string_view s);

// Message sizes: a comma-separated list of sizes (64,1K) and ranges FIRST:LAST[:FACTOR]
// (1:4M is every power of two from 1 B to 4 MiB; 16:1M:4 every fourth power). Each size is
// at most `max`. Keeps the order given, drops repeats.
std::vector<uint32_t> ParseSizes(std::string_view s, uint32_t max);

std::vector<std::string_view> SplitList(std::string_view s);

}  // namespace slipperf
