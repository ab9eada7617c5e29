// slip-stat's command line.
#pragma once

#include <stdexcept>
#include <string>

#include "tools/slip-stat/scan.h"
#include "tools/slip-stat/view.h"

namespace slipstat {

constexpr double kDefaultWatchS = 1.0;

// A bad command line: main prints the message and the usage on stderr and exits 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  bool help = false;
  bool json = false;
  bool reasons = false;
  double watch_s = 0;  // refresh period; 0: print once
  ViewOptions view;
  ScanOptions scan;
};

// argv[0] is the program name. Throws UsageError.
Options ParseCommandLine(int argc, char** argv);

std::string Usage();

}  // namespace slipstat
