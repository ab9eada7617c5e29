// What compare needs from its surroundings before it runs anything: its output directory,
// an environment without the preload, and the words that say what it is about to run.
#pragma once

#include <string>

#include "tools/slip-perf/cli.h"
#include "tools/slip-perf/compare.h"

namespace slipperf {

// mkdir -p.
void MakeDirectories(const std::string& path);

// The plain column must not inherit the preload from whoever started compare (e.g.
// `slip-run slip-perf compare`): removes libslipstream.so from LD_PRELOAD, so that only the
// shm column, through slip-run, gets it.
void DropPreloadFromEnvironment();

// "Linux 6.1.0 x86_64, AMD EPYC 7B13 (16 CPUs)".
std::string HostDescription();

// Fills the settings, plot note and test list of `c` from the options.
void DescribeSettings(const CompareOptions& o, Comparison* c);

}  // namespace slipperf
